package dispatcher_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// The clustered shape: three nats-server processes, R3 queue and buckets. A node dies
// while orders are parked and delivered; nothing is lost.
func TestClusterR3SurvivesANodeCrash(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a 3-process NATS cluster")
	}
	c := natstest.StartCluster(t, 3)
	ds := newDownstream(t, nil)
	ds.delay.Store(int64(20 * time.Millisecond))
	cfg := baseConfig("orders", ds.URL)
	cfg.Replicas = 3
	cfg.Outflow = limiter.PerSecond(20)

	nc := c.Connect(t)
	store, err := queue.Open(ctxT(t), nc, queue.WithReplicas(3), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	tickets := park(t, store, "orders", 0, 15)

	d := startClusterReplica(t, c, cfg)
	_ = d
	waitFor(t, "some deliveries", 30*time.Second, func() bool { return len(ds.keys()) >= 3 })

	c.Kill(0)
	// Parking goes on once the remaining two have a leader for the stream.
	for i := 15; i < 30; i++ {
		var rc queue.Receipt
		waitFor(t, "parking with one node down", 30*time.Second, func() bool {
			rc, err = store.Park(ctxT(t), orderReq("orders", i))
			if err != nil && !errors.Is(err, queue.ErrUnavailable) {
				t.Fatalf("park: %v", err)
			}
			return err == nil
		})
		tickets = append(tickets, rc.Ticket)
	}
	waitFor(t, "every order with one node down", 60*time.Second, func() bool { return len(ds.keys()) == len(tickets) })
	c.Restart(0)
	c.WaitReady()
	var last string // what the wait below saw last, for its failure
	defer func() {
		if t.Failed() {
			t.Log("last status:", last)
		}
	}()
	for _, tk := range tickets {
		if ds.count(tk) == 0 {
			t.Errorf("order %s lost", tk)
		}
		waitFor(t, "status done", 30*time.Second, func() bool {
			st, err := store.Status(ctxT(t), tk)
			last = fmt.Sprintf("%s: %+v, %v", tk, st, err)
			return err == nil && st.Status == queue.StatusDone
		})
	}
}
