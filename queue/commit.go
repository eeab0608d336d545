package queue

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
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

// batch publishes group as one atomic batch (see jsproto.PublishBatch) and returns
// each message's acknowledgement.
func (g *groupCommit) batch(group []*commitReq) ([]*jetstream.PubAck, error) {
	msgs := make([]*nats.Msg, len(group))
	for i, r := range group {
		msgs[i] = r.msg
	}
	ctx, cancel := context.WithTimeout(context.Background(), g.timeout)
	defer cancel()
	return jsproto.PublishBatch(ctx, g.nc, newTicket(), msgs) // any unique id; a ticket is 128 random bits
}
