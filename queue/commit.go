package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Headers of a JetStream atomic batch publish (nats-server 2.12 and later).
const (
	headerBatchID     = "Nats-Batch-Id"
	headerBatchSeq    = "Nats-Batch-Sequence"
	headerBatchCommit = "Nats-Batch-Commit"
)

// maxGroup is the most messages one group commit writes. The server's own cap on an
// atomic batch is 1000 by default.
const maxGroup = 256

// groupCommit writes the messages bound for one stream. While fewer than direct
// writes are in flight, a message is published at once, as a plain synchronous
// publish; the messages that arrive beyond that are gathered and go as one atomic
// batch per round (the next round starts when the batch before is acknowledged). A
// batch is one proposal on a replicated stream and one disk sync on a file store that
// syncs every write, so concurrent writers share one write instead of queueing for one
// each.
//
// Each caller still gets its own acknowledgement only once its message is stored
// (synced): the batch's commit acknowledgement comes after the batch is. An atomic
// batch is stored whole or not at all, so when JetStream refuses it (one message is a
// duplicate within the duplicate window, over a limit, too large, or the batch timed
// out) nothing of it was stored, and each message is published again on its own to get
// its own answer — the very answer a plain publish would have had.
//
// A groupCommit runs at most one goroutine, only while messages are waiting.
type groupCommit struct {
	nc      *nats.Conn // nil: no batches, every message is published on its own
	js      jetstream.JetStream
	stream  string
	timeout time.Duration // bounds each write (the publish timeout)
	direct  int           // writes in flight past which messages wait for a batch

	mu       sync.Mutex
	inflight int // plain publishes under way
	pending  []*commitReq
	running  bool
}

type commitReq struct {
	ctx  context.Context
	msg  *nats.Msg
	done chan commitResult // buffered: the writer never blocks on a departed caller
}

type commitResult struct {
	ack *jetstream.PubAck
	err error
}

// newGroupCommit returns the writer of stream. direct is the number of writes in
// flight past which messages are batched (see directWrites); below 1, every message is
// published on its own.
func newGroupCommit(nc *nats.Conn, js jetstream.JetStream, stream string, timeout time.Duration, direct int) *groupCommit {
	g := &groupCommit{js: js, stream: stream, timeout: timeout, direct: direct}
	if direct > 0 {
		g.nc = nc
	}
	return g
}

// publish stores msg (its headers set, including any TTL or expectation) in the
// stream and returns its acknowledgement, with the errors of jetstream.PublishMsg.
// msg belongs to the writer from the call on.
func (g *groupCommit) publish(ctx context.Context, msg *nats.Msg) (*jetstream.PubAck, error) {
	msg.Header.Set(jetstream.ExpectedStreamHeader, g.stream)
	if g.nc == nil {
		return g.js.PublishMsg(ctx, msg)
	}
	g.mu.Lock()
	if g.inflight < g.direct && !g.running {
		g.inflight++
		g.mu.Unlock()
		ack, err := g.js.PublishMsg(ctx, msg)
		g.mu.Lock()
		g.inflight--
		g.mu.Unlock()
		return ack, err
	}
	r := &commitReq{ctx: ctx, msg: msg, done: make(chan commitResult, 1)}
	g.pending = append(g.pending, r)
	if !g.running {
		g.running = true
		go g.run()
	}
	g.mu.Unlock()
	select {
	case res := <-r.done:
		return res.ack, res.err
	case <-ctx.Done():
		// A write already under way may still store it: like a lost acknowledgement,
		// which callers handle (a retry with the same Nats-Msg-Id is a duplicate).
		return nil, ctx.Err()
	}
}

// run writes the waiting messages, a group at a time, until none is left.
func (g *groupCommit) run() {
	for {
		g.mu.Lock()
		n := min(len(g.pending), maxGroup)
		if n == 0 {
			g.running = false
			g.mu.Unlock()
			return
		}
		group := make([]*commitReq, 0, n)
		for _, r := range g.pending[:n] {
			if r.ctx.Err() == nil { // its caller has given up: not stored, not written
				group = append(group, r)
			}
		}
		g.pending = append(g.pending[:0:0], g.pending[n:]...)
		g.mu.Unlock()
		g.write(group)
	}
}

// write stores group: one message as a plain publish, more as one atomic batch, and
// when the batch is refused, each on its own.
func (g *groupCommit) write(group []*commitReq) {
	if len(group) > 1 {
		acks, err := g.batch(group)
		if err == nil {
			for i, r := range group {
				r.done <- commitResult{ack: acks[i]}
			}
			return
		}
	}
	for _, r := range group {
		ctx, cancel := context.WithTimeout(r.ctx, g.timeout)
		ack, err := g.js.PublishMsg(ctx, r.msg)
		cancel()
		r.done <- commitResult{ack: ack, err: err}
	}
}

// batchAck is the commit acknowledgement of an atomic batch.
type batchAck struct {
	Error    *jetstream.APIError `json:"error,omitempty"`
	Stream   string              `json:"stream"`
	Sequence uint64              `json:"seq"`
	Domain   string              `json:"domain,omitempty"`
	BatchID  string              `json:"batch,omitempty"`
	Count    int                 `json:"count,omitempty"`
}

// errNotBatched: the server stored the commit message as a plain one (it does not
// know atomic batches): what came before it is not known to be stored.
var errNotBatched = errors.New("the server did not acknowledge an atomic batch")

// batch publishes group as one atomic batch and returns each message's
// acknowledgement. The messages of a committed batch are stored together, under the
// stream's lock, in order, so their sequences are the count up to the commit's.
func (g *groupCommit) batch(group []*commitReq) ([]*jetstream.PubAck, error) {
	id := newTicket() // any unique id; a ticket is 128 random bits
	last := len(group) - 1
	for i, r := range group {
		r.msg.Header.Set(headerBatchID, id)
		r.msg.Header.Set(headerBatchSeq, strconv.Itoa(i+1))
		if i < last {
			if err := g.nc.PublishMsg(r.msg); err != nil {
				g.unbatch(group)
				return nil, err
			}
		}
	}
	group[last].msg.Header.Set(headerBatchCommit, "1")
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	resp, err := g.nc.RequestMsgWithContext(ctx, group[last].msg)
	g.unbatch(group)
	if err != nil {
		return nil, err
	}
	var ack batchAck
	if err := json.Unmarshal(resp.Data, &ack); err != nil {
		return nil, fmt.Errorf("atomic batch acknowledgement: %w", err)
	}
	if ack.Error != nil {
		return nil, ack.Error
	}
	if ack.BatchID != id || ack.Count != len(group) || ack.Sequence < uint64(last) {
		return nil, errNotBatched
	}
	acks := make([]*jetstream.PubAck, len(group))
	for i := range group {
		acks[i] = &jetstream.PubAck{Stream: ack.Stream, Sequence: ack.Sequence - uint64(last-i), Domain: ack.Domain}
	}
	return acks, nil
}

// unbatch removes the batch headers, so that the messages can be published on their own.
func (g *groupCommit) unbatch(group []*commitReq) {
	for _, r := range group {
		r.msg.Header.Del(headerBatchID)
		r.msg.Header.Del(headerBatchSeq)
		r.msg.Header.Del(headerBatchCommit)
	}
}
