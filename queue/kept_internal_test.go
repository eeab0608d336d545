package queue

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestFlushHoldsUpOnlyItsStripe: a flush whose write waits on a store that does not
// answer (here: its stripe's lock held as flushOne holds it) holds up the record writes
// of its own ticket's stripe, not every delivery's.
func TestFlushHoldsUpOnlyItsStripe(t *testing.T) {
	s, _, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1"})
	flushing := newTicket()
	other := newTicket()
	for i := 0; s.kept.writeLock(other) == s.kept.writeLock(flushing); i++ {
		if i == 1000 {
			t.Fatal("every ticket shares the flushed ticket's lock")
		}
		other = newTicket()
	}
	lock := s.kept.writeLock(flushing)
	lock.Lock()
	sameStripe := make(chan error, 1)
	go func() {
		sameStripe <- s.SaveRecord(ctx, &Record{Ticket: flushing, Queue: "orders", Status: StatusDone})
	}()
	done := make(chan error, 1)
	go func() { done <- s.SaveRecord(ctx, &Record{Ticket: other, Queue: "orders", Status: StatusDone}) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a record of another ticket waited for the flush")
	}
	select {
	case err := <-sameStripe:
		t.Fatalf("a record of the flushed ticket was written during the flush (%v): the flush could put its older copy over it", err)
	default:
	}
	lock.Unlock()
	if err := <-sameStripe; err != nil {
		t.Fatal(err)
	}
}
