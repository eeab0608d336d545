package dispatcher_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// An order cancelled while a dispatcher already holds it (fetched, waiting for its
// pacing slot, its record read) is not delivered: the dispatcher's compare-and-set
// mark loses against the cancellation. Whether the dispatcher had fetched it yet or
// not, it must never reach the downstream.
func TestCancelledOrderIsNeverDelivered(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	cfg.Outflow = limiter.Rate{Count: 1, Period: 2 * time.Second}
	store, _ := openStore(t, srv.Conn, cfg)
	tickets := park(t, store, "orders", 0, 3)
	// The last two are retries: they have records (queued after a failed attempt).
	q, _ := store.Queue("orders")
	if err := queuetest.Settle(ctxT(t), q, queuetest.Failed(ctxT(t), time.Millisecond, "delivery failed: 503"), tickets[1:]...); err != nil {
		t.Fatal(err)
	}
	startReplica(t, srv, cfg, "a")
	waitFor(t, "the first delivery", 30*time.Second, func() bool { return ds.count(tickets[0]) == 1 })
	// The second order now waits for its slot, most likely in the dispatcher's hands.
	if err := store.Cancel(ctxT(t), tickets[1]); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	waitFor(t, "the third delivery", 30*time.Second, func() bool { return ds.count(tickets[2]) == 1 })
	if n := ds.count(tickets[1]); n != 0 {
		t.Fatalf("the cancelled order was delivered %d times", n)
	}
	st, err := store.Status(ctxT(t), tickets[1])
	if err != nil || st.Status != queue.StatusCancelled {
		t.Fatalf("status: %+v %v", st, err)
	}
}

// A queue retired (by any process) after it left the rules stops its dispatchers
// instead of leaving them retrying a stream that is gone.
func TestRetiredQueueStopsItsDispatcher(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("old", ds.URL)
	r := startReplica(t, srv, cfg, "a")
	tickets := park(t, r.store, "old", 0, 2)
	waitFor(t, "both deliveries", 30*time.Second, func() bool { return ds.count(tickets[0]) == 1 && ds.count(tickets[1]) == 1 })
	// The rules lose the queue (on the dispatcher's process too).
	if _, err := r.store.AdoptOrphans(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
	other, err := queue.Open(ctxT(t), srv.Conn, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.AdoptOrphans(ctxT(t), nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the queue to be empty", 30*time.Second, func() bool {
		_, err := other.Retire(ctxT(t), "old", false)
		return err == nil
	})
	select {
	case <-r.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the dispatcher of the retired queue keeps running")
	}
}
