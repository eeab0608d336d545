package queuetest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// Settle settles the orders it is given as a lease does, and leaves the others
// queued and without a record.
func TestSettle(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Declare(ctx, queueconfig.Config{Name: "orders", Downstream: "http://127.0.0.1:1", Outflow: limiter.PerSecond(10)})
	if err != nil {
		t.Fatal(err)
	}
	var tks []string
	for range 3 {
		rc, err := s.Park(ctx, &queue.Request{Queue: "orders", Method: "POST", Path: "/v1/orders"})
		if err != nil {
			t.Fatal(err)
		}
		tks = append(tks, rc.Ticket)
	}
	if err := queuetest.Settle(ctx, q, queuetest.Done(ctx, &queue.Result{StatusCode: 201}), tks[2]); err != nil {
		t.Fatal(err)
	}
	if err := queuetest.Settle(ctx, q, queuetest.Failed(ctx, time.Hour, "delivery failed: 503"), tks[0]); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Record(ctx, tks[2])
	if err != nil || rec.Status != queue.StatusDone || rec.Result == nil || rec.Result.StatusCode != 201 || rec.Attempts != 1 {
		t.Errorf("done order: %+v %v", rec, err)
	}
	rec, err = s.Record(ctx, tks[0])
	if err != nil || rec.Status != queue.StatusQueued || rec.Attempts != 1 || rec.LastError != "delivery failed: 503" {
		t.Errorf("failed attempt: %+v %v", rec, err)
	}
	if rec, err := s.Record(ctx, tks[1]); err == nil {
		t.Errorf("the order skipped got a record: %+v", rec)
	}
	if n, err := q.Depth(ctx); err != nil || n != 2 {
		t.Errorf("depth %d %v, want the two orders not done", n, err)
	}
	short, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := queuetest.Settle(short, q, queuetest.Done(short, nil), "unknownticketqqqqqqqqqqqqq"); err == nil {
		t.Error("a ticket that is not in the queue was settled")
	}
}
