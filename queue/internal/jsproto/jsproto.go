// Package jsproto is every JetStream operation package queue makes below the API of
// nats.go's jetstream package: subjects and stream names it builds by hand, requests
// to the JetStream API, acknowledgements sent as requests, headers of the server's
// that nats.go does not read, and the classification of the server's errors. A
// nats-server or nats.go upgrade reviews this file; each function here has a test
// against the pinned nats-server (natstest).
package jsproto

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KVStream returns the name of the stream that holds the key-value bucket.
func KVStream(bucket string) string { return "KV_" + bucket }

// KVSubject returns the subject of key in the key-value bucket; key may be a
// wildcard (">") for a filter.
func KVSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// KVPut writes value under key of the bucket, with a per-message TTL (the bucket
// must allow them: LimitMarkerTTL), as one publish on the key's subject expected in
// the bucket's stream. nats.go's KeyValue takes a TTL on Create only; opts add
// expectations, such as jetstream.WithExpectLastSequencePerSubject for a
// compare-and-set. The acknowledgement's Sequence is the key's new revision.
func KVPut(ctx context.Context, js jetstream.JetStream, bucket, key string, value []byte, ttl time.Duration,
	opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	msg := nats.NewMsg(KVSubject(bucket, key))
	msg.Data = value
	opts = append([]jetstream.PublishOpt{jetstream.WithMsgTTL(ttl), jetstream.WithExpectStream(KVStream(bucket))}, opts...)
	return js.PublishMsg(ctx, msg, opts...)
}

// MsgQuery is one message read from a stream: the last message on subject Last when
// set, else the first one at or after Seq on subject Next (every subject when Next is
// empty).
type MsgQuery struct {
	Seq  uint64
	Next string
	Last string
}

// NoAnswer reports whether err of a request says that no answer came in time.
func NoAnswer(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// LeaderWait is how long LeaderMsg waits for one answer. A server drops, without an
// error, the requests to a stream's leader that come while the stream's group has no
// leader it knows of (an election after a node restarted): nats-server's
// jsMsgGetRequest returns without a reply then, and a client that waits for its
// whole deadline waits for nothing (a clean-clone CI run's Status waited 60s so
// after a node of a three-node cluster came back). Reads are idempotent, so a
// request without an answer is sent again.
const LeaderWait = 2 * time.Second

// AskAgain returns read's answer, asking again while no answer comes within
// LeaderWait and ctx lasts: for a read whose request a server may drop without a word
// (a stream's or consumer's state, which only its leader answers, while it has none:
// see LeaderWait), or that went out on a connection the server had just closed, and
// which is safe to repeat. read must honour its context.
func AskAgain[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, LeaderWait)
		v, err := read(actx)
		cancel()
		if err == nil || ctx.Err() != nil || !NoAnswer(err) {
			return v, err
		}
	}
}

// LeaderMsg reads q from the stream through its leader's message API
// ($JS.API.STREAM.MSG.GET.{stream}), which the jetstream package uses only for
// streams without AllowDirect: a direct get may go to any replica, this request to
// the leader only. A request without an answer within LeaderWait is sent again until
// ctx ends. Errors: jetstream.ErrMsgNotFound (no such message), the server's
// *jetstream.APIError, the request's own.
func LeaderMsg(ctx context.Context, nc *nats.Conn, stream string, q MsgQuery) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		Seq  uint64 `json:"seq,omitempty"`
		Last string `json:"last_by_subj,omitempty"`
		Next string `json:"next_by_subj,omitempty"`
	}{q.Seq, q.Last, q.Next})
	if err != nil {
		return nil, err
	}
	msg, err := AskAgain(ctx, func(ctx context.Context) (*nats.Msg, error) {
		return nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	})
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs,omitempty"`
			Data     []byte    `json:"data,omitempty"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return nil, fmt.Errorf("message of %s from its leader: %w", stream, err)
	}
	switch {
	case resp.Error != nil && resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound:
		return nil, jetstream.ErrMsgNotFound
	case resp.Error != nil:
		return nil, resp.Error
	case resp.Message == nil:
		return nil, jetstream.ErrInvalidJetStreamResponse
	}
	m := resp.Message
	var hdr nats.Header
	if len(m.Header) > 0 {
		if hdr, err = nats.DecodeHeadersMsg(m.Header); err != nil {
			return nil, fmt.Errorf("message of %s from its leader: %w", stream, err)
		}
	}
	return &jetstream.RawStreamMsg{Subject: m.Subject, Sequence: m.Sequence, Header: hdr, Data: m.Data, Time: m.Time}, nil
}

// PurgeBelow purges the messages on filter with a sequence below seq from the stream
// ($JS.API.STREAM.PURGE.{stream}) and returns how many went, which the server's
// answer says and nats.go's Stream.Purge drops. Errors: the server's
// *jetstream.APIError, the request's own.
func PurgeBelow(ctx context.Context, nc *nats.Conn, stream, filter string, seq uint64) (uint64, error) {
	req, err := json.Marshal(struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq"`
	}{filter, seq})
	if err != nil {
		return 0, err
	}
	msg, err := nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+stream, req)
	if err != nil {
		return 0, err
	}
	var resp struct {
		Purged uint64              `json:"purged"`
		Error  *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge of %s: %w", stream, err)
	}
	if resp.Error != nil {
		return 0, resp.Error
	}
	return resp.Purged, nil
}

// InProgress restarts the ack wait of the consumer's delivery of m ("+WPI") and waits
// until the consumer has processed it, as long as ctx lasts. nats.go's InProgress does
// not wait for the consumer.
func InProgress(ctx context.Context, nc *nats.Conn, m jetstream.Msg) error {
	return ackSync(ctx, nc, m, []byte("+WPI"))
}

// NakWithDelay hands m back to its consumer for redelivery after delay ("-NAK
// {"delay": ns}", stored as the message's new deadline, unlike a plain nak which the
// server keeps in memory only) and waits until the consumer has processed it, as long
// as ctx lasts: the client's synchronous acknowledgement exists for Ack only.
// JetStream answers an acknowledgement that asks for an answer once its consumer has
// processed it; a replicated consumer once its leader has applied and proposed it.
func NakWithDelay(ctx context.Context, nc *nats.Conn, m jetstream.Msg, delay time.Duration) error {
	return ackSync(ctx, nc, m, fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()))
}

func ackSync(ctx context.Context, nc *nats.Conn, m jetstream.Msg, ack []byte) error {
	_, err := nc.RequestWithContext(ctx, m.Reply(), ack)
	return err
}

// PinID returns the pin id a consumer of a pinned priority group gave the fetch that
// brought m ("" when it has none), which nats.go keeps to itself.
func PinID(m jetstream.Msg) string { return m.Headers().Get("Nats-Pin-Id") }

// Headers of a JetStream atomic batch publish (nats-server 2.12 and later).
const (
	HeaderBatchID     = "Nats-Batch-Id"
	HeaderBatchSeq    = "Nats-Batch-Sequence"
	HeaderBatchCommit = "Nats-Batch-Commit"
)

// ErrNotBatched: the server stored the commit message of an atomic batch as a plain
// one (it does not know atomic batches): what came before it is not known to be
// stored.
var ErrNotBatched = errors.New("the server did not acknowledge an atomic batch")

// PublishBatch publishes msgs (at least one) as one atomic batch named id (unique
// per batch) to a stream that allows them (AllowAtomicPublish), waits for the commit
// as long as ctx lasts, and returns each message's acknowledgement. The server stores
// the batch whole or not at all, under the stream's lock and in order, so the
// sequences are the count up to the commit's. The batch headers are removed from msgs
// before it returns, so that they can be published again on their own. Errors: the
// server's *jetstream.APIError (nothing of the batch was stored), ErrNotBatched, the
// publishes' own.
func PublishBatch(ctx context.Context, nc *nats.Conn, id string, msgs []*nats.Msg) ([]*jetstream.PubAck, error) {
	defer func() {
		for _, m := range msgs {
			m.Header.Del(HeaderBatchID)
			m.Header.Del(HeaderBatchSeq)
			m.Header.Del(HeaderBatchCommit)
		}
	}()
	last := len(msgs) - 1
	for i, m := range msgs {
		if m.Header == nil {
			m.Header = nats.Header{}
		}
		m.Header.Set(HeaderBatchID, id)
		m.Header.Set(HeaderBatchSeq, strconv.Itoa(i+1))
		if i < last {
			if err := nc.PublishMsg(m); err != nil {
				return nil, err
			}
		}
	}
	msgs[last].Header.Set(HeaderBatchCommit, "1")
	resp, err := nc.RequestMsgWithContext(ctx, msgs[last])
	if err != nil {
		return nil, err
	}
	var ack struct {
		Error    *jetstream.APIError `json:"error,omitempty"`
		Stream   string              `json:"stream"`
		Sequence uint64              `json:"seq"`
		Domain   string              `json:"domain,omitempty"`
		BatchID  string              `json:"batch,omitempty"`
		Count    int                 `json:"count,omitempty"`
	}
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return nil, fmt.Errorf("atomic batch acknowledgement: %w", err)
	}
	if ack.Error != nil {
		return nil, ack.Error
	}
	if ack.BatchID != id || ack.Count != len(msgs) || ack.Sequence < uint64(last) {
		return nil, ErrNotBatched
	}
	acks := make([]*jetstream.PubAck, len(msgs))
	for i := range msgs {
		acks[i] = &jetstream.PubAck{Stream: ack.Stream, Sequence: ack.Sequence - uint64(last-i), Domain: ack.Domain}
	}
	return acks, nil
}
