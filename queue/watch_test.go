package queue_test

import (
	"sync"
	"testing"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestWatchRecords: a record written after WatchRecords returns is told by its ticket,
// whoever writes it (here another Store on its own connection, as another replica's
// dispatcher); the watch is one consumer, headers only, and stop deletes it.
func TestWatchRecords(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	other := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	rc, err := s.Park(ctx, order("orders", "b"))
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[string]int{}
	stop, err := s.WatchRecords(ctx, func(ticket string) {
		mu.Lock()
		seen[ticket]++
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	str, err := s.JetStream().Stream(ctx, "KV_"+queue.TicketsBucket)
	if err != nil {
		t.Fatal(err)
	}
	info, err := str.Info(ctx)
	if err != nil || info.State.Consumers != 1 {
		t.Fatalf("consumers on the tickets bucket while watching: %v %v, want 1", info, err)
	}
	if err := other.SaveRecord(ctx, &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return seen[rc.Ticket] == 1
	})
	stop()
	if info, err := str.Info(ctx); err != nil || info.State.Consumers != 0 {
		t.Errorf("consumers after stop: %v %v, want 0", info, err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 {
		t.Errorf("told %v, want only the ticket written", seen)
	}
}
