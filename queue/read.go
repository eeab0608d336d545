package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// directWait bounds a direct get. Every replica of a stream with AllowDirect answers
// direct gets, the requests spread over them; a replica on a stuck server (SIGSTOP, a
// partition that keeps its routes up) answers none until the cluster's routes notice,
// which takes them minutes. A healthy replica answers in milliseconds, so after
// directWait the read asks the stream's leader instead (see readMsg).
const directWait = time.Second

// msgQuery is one read of a stream: the last message on last, or else the first one
// at or after seq on next (every subject when next is empty).
type msgQuery struct {
	seq  uint64
	next string
	last string
}

// readMsg reads q from stream: a direct get, answered by any replica, and when that
// one does not answer within directWait, the stream leader's message API (no
// replica but the leader answers it). Errors are the jetstream package's:
// jetstream.ErrMsgNotFound for no such message.
func (s *Store) readMsg(ctx context.Context, stream jetstream.Stream, q msgQuery) (*jetstream.RawStreamMsg, error) {
	dctx, cancel := context.WithTimeout(ctx, directWait)
	var (
		raw *jetstream.RawStreamMsg
		err error
	)
	switch {
	case q.last != "":
		raw, err = stream.GetLastMsgForSubject(dctx, q.last)
	case q.next != "":
		raw, err = stream.GetMsg(dctx, q.seq, jetstream.WithGetMsgSubject(q.next))
	default:
		raw, err = stream.GetMsg(dctx, q.seq)
	}
	cancel()
	if !noAnswer(err) || ctx.Err() != nil {
		return raw, err
	}
	name := stream.CachedInfo().Config.Name
	s.log.Debug("a replica did not answer a direct get; asking the stream leader", "stream", name)
	return s.leaderMsg(ctx, name, q)
}

// noAnswer reports whether err of a request says that no answer came in time.
func noAnswer(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
}

// leaderMsg reads q from the stream named stream through its leader's message API
// ($JS.API.STREAM.MSG.GET), which the jetstream package uses only for streams without
// AllowDirect.
func (s *Store) leaderMsg(ctx context.Context, stream string, q msgQuery) (*jetstream.RawStreamMsg, error) {
	req, err := json.Marshal(struct {
		Seq  uint64 `json:"seq,omitempty"`
		Last string `json:"last_by_subj,omitempty"`
		Next string `json:"next_by_subj,omitempty"`
	}{q.seq, q.last, q.next})
	if err != nil {
		return nil, err
	}
	msg, err := s.nc.RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
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

// readKey is kv.Get(ctx, key) that, like readMsg, asks the bucket's stream leader when
// the replica a direct get went to does not answer. Errors are the jetstream
// package's: jetstream.ErrKeyNotFound for a key without a value (never written,
// deleted, purged or expired).
func (s *Store) readKey(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	dctx, cancel := context.WithTimeout(ctx, directWait)
	e, err := kv.Get(dctx, key)
	cancel()
	if !noAnswer(err) || ctx.Err() != nil {
		return e, err
	}
	bucket := kv.Bucket()
	s.log.Debug("a replica did not answer a direct get; asking the bucket's stream leader", "bucket", bucket)
	raw, err := s.leaderMsg(ctx, "KV_"+bucket, msgQuery{last: "$KV." + bucket + "." + key})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, jetstream.ErrKeyNotFound
	}
	if err != nil {
		return nil, err
	}
	// As the jetstream package reads an entry: an operation header, or a server's
	// delete marker, means no value.
	if raw.Header.Get("KV-Operation") != "" || raw.Header.Get(jetstream.MarkerReasonHeader) != "" {
		return nil, jetstream.ErrKeyNotFound
	}
	return leaderEntry{bucket: bucket, key: key, raw: raw}, nil
}

// leaderEntry is a key's value read from its bucket's stream leader.
type leaderEntry struct {
	bucket, key string
	raw         *jetstream.RawStreamMsg
}

func (e leaderEntry) Bucket() string                  { return e.bucket }
func (e leaderEntry) Key() string                     { return e.key }
func (e leaderEntry) Value() []byte                   { return e.raw.Data }
func (e leaderEntry) Revision() uint64                { return e.raw.Sequence }
func (e leaderEntry) Created() time.Time              { return e.raw.Time }
func (e leaderEntry) Delta() uint64                   { return 0 } // not known from one message
func (e leaderEntry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
