package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// group makes the requests of one group commit: messages on sluice.q.orders.{ticket}
// with the given message ids.
func group(ctx context.Context, ids ...string) []*commitReq {
	out := make([]*commitReq, len(ids))
	for i, id := range ids {
		msg := nats.NewMsg(ReadySubject("orders", "", newTicket()))
		msg.Data = []byte("order " + id)
		msg.Header.Set(HeaderMsgID, id)
		msg.Header.Set(jetstream.ExpectedStreamHeader, StreamName("orders"))
		out[i] = &commitReq{ctx: ctx, msg: msg, done: make(chan commitResult, 1)}
	}
	return out
}

// forceBatches makes the store write q's orders and key slots by
// atomic batches whenever a write is in flight, as on a replicated stream (the test
// server's single-replica file streams wait for more: see directWrites).
func forceBatches(s *Store, q *Queue) {
	q.orders.Store(newGroupCommit(s.nc, s.js, StreamName(q.name), s.opts.publishTimeout, 1))
	q.slots.Store(newGroupCommit(s.nc, s.js, KeyStreamName(q.name), s.opts.publishTimeout, 1))
}

// The acknowledgement each message of an atomic batch gets names the sequence that
// holds that very message: freeSlot deletes by it, receipts count positions from it.
func TestGroupCommitSequences(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	forceBatches(s, q)
	// Something stored first, so that the batch's sequences do not start at 1.
	q.orders.Load().write(group(ctx, "first"))
	g := group(ctx, "a", "b", "c", "d", "e")
	q.orders.Load().write(g)
	seen := map[uint64]bool{}
	for _, r := range g {
		res := <-r.done
		if res.err != nil {
			t.Fatal(res.err)
		}
		if seen[res.ack.Sequence] || res.ack.Duplicate {
			t.Fatalf("ack %+v repeated", res.ack)
		}
		seen[res.ack.Sequence] = true
		raw, err := q.stream.GetMsg(ctx, res.ack.Sequence)
		if err != nil {
			t.Fatal(err)
		}
		if raw.Subject != r.msg.Subject || string(raw.Data) != string(r.msg.Data) {
			t.Fatalf("sequence %d holds %s %q, want %s %q", res.ack.Sequence, raw.Subject, raw.Data, r.msg.Subject, r.msg.Data)
		}
		if raw.Header.Get(jsproto.HeaderBatchID) == "" || raw.Header.Get(jsproto.HeaderBatchCommit) != "" && r != g[len(g)-1] {
			t.Fatalf("sequence %d: batch headers %v", res.ack.Sequence, raw.Header)
		}
	}
}

// A batch JetStream refuses (here: one message repeats a stored message id) is stored
// not at all; every message then gets its own answer, as a plain publish would.
func TestGroupCommitRefusedBatch(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	forceBatches(s, q)
	first := group(ctx, "dup")
	q.orders.Load().write(first)
	stored := <-first[0].done
	if stored.err != nil {
		t.Fatal(stored.err)
	}
	g := group(ctx, "x", "dup", "y")
	q.orders.Load().write(g)
	for i, r := range g {
		res := <-r.done
		if res.err != nil {
			t.Fatalf("message %d: %v", i, res.err)
		}
		if got, want := res.ack.Duplicate, i == 1; got != want {
			t.Fatalf("message %d: duplicate %v, want %v", i, got, want)
		}
		if i == 1 && res.ack.Sequence != stored.ack.Sequence {
			t.Fatalf("the duplicate acks sequence %d, want %d", res.ack.Sequence, stored.ack.Sequence)
		}
	}
	if n, err := q.Depth(ctx); err != nil || n != 3 {
		t.Fatalf("depth %d (%v), want 3", n, err)
	}
}

// A caller that gave up before its group was written has nothing stored.
func TestGroupCommitSkipsDepartedCallers(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	forceBatches(s, q)
	gone, cancel := context.WithCancel(ctx)
	cancel()
	g := group(ctx, "stays")
	g = append(g, group(gone, "gone")...)
	w := q.orders.Load()
	w.mu.Lock()
	w.pending = g
	w.running = true
	w.mu.Unlock()
	w.run()
	if res := <-g[0].done; res.err != nil {
		t.Fatal(res.err)
	}
	if n, err := q.Depth(ctx); err != nil || n != 1 {
		t.Fatalf("depth %d (%v), want 1", n, err)
	}
}

// Many keyed Parks at once, their writes grouped: each accepted order is stored once,
// under its own ticket, with its key recorded and a slot taken; repeats get the same
// ticket, a changed body a conflict; the client's key cap holds exactly.
func TestParkConcurrentKeyed(t *testing.T) {
	t.Run("published", func(t *testing.T) { testParkConcurrentKeyed(t, false) })
	t.Run("batched", func(t *testing.T) { testParkConcurrentKeyed(t, true) })
}

func testParkConcurrentKeyed(t *testing.T, batched bool) {
	const n, limit = 48, 40
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1",
		MaxIdempotencyKeys: limit})
	if batched {
		forceBatches(s, q)
	}
	receipts := make([]Receipt, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			receipts[i], errs[i] = s.Park(ctx, keyedOrder("c1", strconv.Itoa(i), fmt.Sprintf(`{"n":%d}`, i)))
		})
	}
	// Racing requests with one key, from another client: one order.
	same := make([]Receipt, 8)
	sameErrs := make([]error, len(same))
	for i := range same {
		wg.Go(func() { same[i], sameErrs[i] = s.Park(ctx, keyedOrder("c2", "same", `{"same":1}`)) })
	}
	wg.Wait()
	accepted, refused := 0, 0
	tickets := map[string]bool{}
	for i, err := range errs {
		var kl *KeyLimitError
		switch {
		case err == nil:
			accepted++
			if tickets[receipts[i].Ticket] || receipts[i].Duplicate {
				t.Fatalf("order %d: receipt %+v", i, receipts[i])
			}
			tickets[receipts[i].Ticket] = true
			if _, _, err := s.parked(ctx, q, receipts[i].Ticket); err != nil {
				t.Fatalf("order %d: its message: %v", i, err)
			}
			rc, err := s.Park(ctx, keyedOrder("c1", strconv.Itoa(i), fmt.Sprintf(`{"n":%d}`, i)))
			if err != nil || rc.Ticket != receipts[i].Ticket || !rc.Duplicate {
				t.Fatalf("order %d repeated: %+v, %v; want ticket %s", i, rc, err, receipts[i].Ticket)
			}
			if _, err := s.Park(ctx, keyedOrder("c1", strconv.Itoa(i), `{"changed":1}`)); !errors.Is(err, ErrIdempotencyConflict) {
				t.Fatalf("order %d with another body: %v", i, err)
			}
		case errors.As(err, &kl) && errors.Is(err, ErrTooManyKeys):
			refused++
		default:
			t.Fatalf("order %d: %v", i, err)
		}
	}
	if accepted != limit || refused != n-limit {
		t.Fatalf("%d accepted, %d refused; want %d and %d", accepted, refused, limit, n-limit)
	}
	for i, err := range sameErrs {
		if err != nil || same[i].Ticket != same[0].Ticket {
			t.Fatalf("racing request %d: %+v, %v; want ticket %s", i, same[i], err, same[0].Ticket)
		}
	}
	if d, err := q.Depth(ctx); err != nil || d != limit+1 {
		t.Fatalf("depth %d (%v), want %d", d, err, limit+1)
	}
	if k := keyCount(t, ctx, s); k != 0 {
		t.Fatalf("%d keys recorded for queued orders, want none (an order is its key's record until it is final)", k)
	}
	if sl := slotCount(t, ctx, q); sl != limit+1 {
		t.Fatalf("%d slots, want %d", sl, limit+1)
	}
}

// The server goes down while batched keyed Parks are under way: every Park that
// returned a receipt has its order after the restart, and its key maps to it; every
// other one returned an error.
func TestParkBatchedServerDown(t *testing.T) {
	s, q, ctx, srv := openInternalServer(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1",
		MaxIdempotencyKeys: 100_000})
	forceBatches(s, q)
	type accepted struct {
		req *Request
		rc  Receipt
	}
	var (
		mu     sync.Mutex
		ok     []accepted
		failed int
		wg     sync.WaitGroup
	)
	down := make(chan struct{})
	for w := range 24 {
		wg.Go(func() {
			for i := 0; ; i++ {
				req := keyedOrder("c1", fmt.Sprintf("%d-%d", w, i), fmt.Sprintf(`{"w":%d,"i":%d}`, w, i))
				rc, err := s.Park(ctx, req)
				mu.Lock()
				if err == nil {
					ok = append(ok, accepted{req, rc})
				} else {
					failed++
				}
				mu.Unlock()
				if err != nil {
					select {
					case <-down:
						return
					default:
					}
				}
			}
		})
	}
	for {
		mu.Lock()
		n := len(ok)
		mu.Unlock()
		if n >= 200 {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("too few orders accepted before the deadline")
		}
		time.Sleep(10 * time.Millisecond)
	}
	srv.Shutdown()
	close(down)
	wg.Wait()
	srv.Restart()
	if failed == 0 {
		t.Fatal("no Park failed while the server was down")
	}
	for _, a := range ok {
		raw, _, err := s.parked(ctx, q, a.rc.Ticket)
		if err != nil {
			t.Fatalf("accepted order %s: %v", a.rc.Ticket, err)
		}
		if raw.Header.Get(HeaderTicket) != a.rc.Ticket {
			t.Fatalf("order %s: message of %s", a.rc.Ticket, raw.Header.Get(HeaderTicket))
		}
		if rc, err := s.Park(ctx, a.req); err != nil || rc.Ticket != a.rc.Ticket || !rc.Duplicate {
			t.Fatalf("order %s repeated: %+v, %v", a.rc.Ticket, rc, err)
		}
	}
	t.Logf("%d accepted and found after the restart, %d refused", len(ok), failed)
}
