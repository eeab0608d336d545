package dispatcher_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestFairByDispatch: two dispatcher replicas drain a queue with fair_by that tenant A
// flooded; tenant B's orders, parked mid-flood, are delivered long before the flood
// is, and one replica (the queue's leader) delivers everything, so the outflow stays
// the queue's.
func TestFairByDispatch(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("fair", ds.URL)
	cfg.Outflow, cfg.FairBy = limiter.PerSecond(100), "header:X-Tenant"
	store, _ := openStore(t, srv.Conn, cfg)
	const flood = 300
	park := func(tenant, key string) {
		t.Helper()
		_, err := store.Park(ctxT(t), &queue.Request{Queue: cfg.Name, Method: "POST", Path: "/orders", Tenant: tenant,
			Header: http.Header{"Idempotency-Key": {key}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	for i := range flood {
		park("tenant-a", fmt.Sprintf("a%d", i))
	}
	candidates := []string{"tenant-a", "tenant-b"}
	for i := range 20 {
		candidates = append(candidates, fmt.Sprintf("tenant-b%d", i))
	}
	lanes := lanesOf(t, cfg, candidates...)
	b := ""
	for i, l := range lanes[1:] {
		if l != lanes[0] {
			b = candidates[i+1]
			break
		}
	}
	if b == "" {
		t.Fatalf("every tenant shares tenant-a's lane: %v", lanes)
	}
	opts := []dispatcher.Option{dispatcher.WithPinnedTTL(5 * time.Second)}
	startReplica(t, srv, cfg, "r1", opts...)
	startReplica(t, srv, cfg, "r2", opts...)
	waitFor(t, "the flood to start draining", 60*time.Second, func() bool { return len(ds.keys()) >= 20 })
	before := len(ds.keys())
	for i := range 3 {
		park(b, fmt.Sprintf("b%d", i))
	}
	waitFor(t, "every order", 120*time.Second, func() bool { return len(ds.keys()) == flood+3 })
	var pos []int
	for i, k := range ds.keys()[before:] {
		if strings.HasPrefix(k, "b") {
			pos = append(pos, i+1)
		}
	}
	t.Logf("outflow 100/s, lane refresh %s: B's orders delivered at positions %v after B parked (A's flood: %d orders, %d left when B parked)",
		queue.DefaultLaneRefresh, pos, flood, flood-before)
	if len(pos) != 3 || pos[2] > (flood-before)/2 {
		t.Errorf("B's orders at %v: not within their share (the first half of what was left)", pos)
	}
	switches, last := 0, ""
	for _, h := range ds.all() {
		r := h.header.Get("X-Test-Replica")
		if last != "" && r != last {
			switches++
		}
		last = r
	}
	if switches > 1 {
		t.Errorf("deliveries moved between replicas %d times; one leader should deliver them", switches)
	}
}

// lanesOf returns the lanes Park gives orders of tenants in a queue of cfg, read from
// the subjects of orders parked on a server of their own, so that the queue under test
// holds only the orders it parks.
func lanesOf(t *testing.T, cfg queueconfig.Config, tenants ...string) []string {
	t.Helper()
	srv := natstest.Start(t)
	store, _ := openStore(t, srv.Conn, cfg)
	stream := srv.Stream(t, queue.StreamName(cfg.Name))
	var out []string
	for _, tenant := range tenants {
		if _, err := store.Park(ctxT(t), &queue.Request{Queue: cfg.Name, Method: "POST", Path: "/orders", Tenant: tenant}); err != nil {
			t.Fatal(err)
		}
		raw, err := stream.GetMsg(ctxT(t), uint64(len(out)+1))
		if err != nil {
			t.Fatal(err)
		}
		// sluice.q.{queue}.{lane}.{ticket}
		parts := strings.Split(raw.Subject, ".")
		if len(parts) != 5 {
			t.Fatalf("order of %s on %s: not a laned subject", tenant, raw.Subject)
		}
		out = append(out, parts[3])
	}
	return out
}
