package queue

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestIdleLaneLookListsOnce: a look at the lanes of an idle laned queue lists its
// consumers once (a listing carries the queue consumer's filter of every lane).
func TestIdleLaneLookListsOnce(t *testing.T) {
	cfg := queueconfig.Config{Name: "idle", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1",
		FairBy: "header:X-Tenant", FairLanes: 2}
	_, q, ctx, srv := openInternalServer(t, cfg)
	c := q.Consumer()
	if err := c.Ensure(ctx, ConsumerConfig{AckWait: 30 * time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
		t.Fatal(err)
	}
	var l *Lease
	var leading bool
	var err error
	listings := natstest.PublishedDuring(t, srv.Conn, "$JS.API.CONSUMER.LIST.>", func() { l, leading, err = c.tryLaned(ctx) })
	if l != nil || !leading || err != nil {
		t.Fatalf("look at an idle queue: %v, leading %v, %v", l, leading, err)
	}
	if len(listings) != 1 {
		t.Errorf("one look at the idle lanes listed the consumers %d times, want 1", len(listings))
	}
}
