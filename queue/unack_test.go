package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestParkNotAcknowledgedNamesItsTicket: a Park whose publish gets no answer in time
// (the node it is connected to frozen, as a stuck host: SIGSTOP) may still have stored
// the order, so it is not refused as if nothing had been accepted: the error is
// ErrNotAcknowledged and names the ticket, and once the node resumes, the order it
// took from its socket is stored under that ticket. A keyed order on the frozen node
// is refused too (its lookup gets no answer either), and sent again with its key once
// the node is back it is stored once.
func TestParkNotAcknowledgedNamesItsTicket(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	ctx := ctxT(t)
	reg := prometheus.NewRegistry()
	s, err := queue.Open(ctx, nc, queue.WithSigningKey(natstest.SigningKey()), queue.WithPublishTimeout(time.Second), queue.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, testConfig("orders")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Park(ctx, order("orders", "before")); err != nil {
		t.Fatal(err)
	}
	keyed := order("orders", "keyed")
	keyed.IdempotencyKey = "k-1"

	node := c.Node(nc.ConnectedServerName()) // R1: the stream may be on another node, which it forwards to
	c.Pause(node)
	_, err = s.Park(ctx, order("orders", "unkeyed"))
	_, keyedErr := s.Park(ctx, keyed)
	c.Resume(node)
	var ue *queue.UnacknowledgedError
	if !errors.As(err, &ue) || !errors.Is(err, queue.ErrNotAcknowledged) || !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("park on a frozen node: %v, want an UnacknowledgedError", err)
	}
	if !queue.ValidTicket(ue.Ticket) || ue.Queue != "orders" || ue.Keyed {
		t.Errorf("UnacknowledgedError %+v", ue)
	}
	if !errors.Is(keyedErr, queue.ErrUnavailable) {
		t.Fatalf("keyed park on a frozen node: %v, want ErrUnavailable", keyedErr)
	}
	want := 1.0
	if errors.Is(keyedErr, queue.ErrNotAcknowledged) {
		want = 2
	}
	if n := gather(t, reg, "sluice_queue_park_unacknowledged_total"); n != want {
		t.Errorf("sluice_queue_park_unacknowledged_total %v, want %v", n, want)
	}

	waitFor(t, func() bool {
		rec, err := s.Status(context.Background(), ue.Ticket)
		return err == nil && rec.Status == queue.StatusQueued
	})
	var rc queue.Receipt
	waitFor(t, func() bool { rc, err = s.Park(ctx, keyed); return err == nil })
	if again, err := s.Park(ctx, keyed); err != nil || again.Ticket != rc.Ticket || !again.Duplicate {
		t.Fatalf("keyed order sent again: %+v %v, want ticket %s, a duplicate", again, err, rc.Ticket)
	}
	q, _ := s.Queue("orders")
	if d, err := q.Depth(ctx); err != nil || d != 3 {
		t.Fatalf("depth %d (%v), want 3: the order before, the unacknowledged one, the keyed one once", d, err)
	}
}

// TestParkSeriesStartAtZero: a declared queue's park counters are there at 0 before
// its first park, so that an alert on their increase (SluiceParksUnacknowledged) sees
// the first incident: Prometheus' increase counts nothing for a series that first
// appears at 1 or more.
func TestParkSeriesStartAtZero(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	reg := prometheus.NewRegistry()
	s, err := queue.Open(ctx, srv.Connect(t), queue.WithSigningKey(natstest.SigningKey()), queue.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, testConfig("orders")); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"sluice_queue_parked_total", "sluice_queue_park_unacknowledged_total"} {
		found := false
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == name && len(m.GetLabel()) == 1 && m.GetLabel()[0].GetValue() == "orders" {
					found = m.GetCounter().GetValue() == 0
				}
			}
		}
		if !found {
			t.Errorf("%s{queue=\"orders\"} is not there at 0 after the queue's declaration", name)
		}
	}
}
