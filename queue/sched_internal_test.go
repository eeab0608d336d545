package queue

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/limiter"
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
	watch := srv.Connect(t)
	const marker = "sched.test.marker"
	// Both subscriptions feed one channel, in the order the server sends.
	seen := make(chan *nats.Msg, 64)
	for _, subj := range []string{"$JS.API.CONSUMER.LIST.>", marker} {
		if _, err := watch.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	l, leading, err := c.tryLaned(ctx)
	if l != nil || !leading || err != nil {
		t.Fatalf("look at an idle queue: %v, leading %v, %v", l, leading, err)
	}
	// The server hands watch its copies of the queue connection's publishes in the
	// order that connection sent them: a marker published on it after the look
	// arrives after every listing the look made, however busy the machine.
	if err := srv.Conn.Publish(marker, nil); err != nil {
		t.Fatal(err)
	}
	n := 0
	for done := false; !done; {
		select {
		case m := <-seen:
			if done = m.Subject == marker; !done {
				n++
			}
		case <-ctx.Done():
			t.Fatalf("no marker after %d listings: %v", n, ctx.Err())
		}
	}
	if n != 1 {
		t.Errorf("one look at the idle lanes listed the consumers %d times, want 1", n)
	}
}
