package main

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/queue/natstest"
)

// Through the binary: orders deferred by the front door carry their X-Merchant as the
// queue's flow key; `sluice queue flow pause` holds one merchant's orders while the
// other's are delivered, `resume` lets them go, and `rate` pins a merchant's rate.
func TestQueueFlowThroughTheBinary(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	const token = "op-token"
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, `outflow: {rate: 20/s}
flow_by: {from: "header:X-Merchant", rate: 5/s, max_in_flight: 2}`))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL, "--admin-token", token}, dispatchFlags...)...)
	admin := []string{"--admin", p.admin, "--admin-token", token}
	warmUp(t, p.url, "/v1/orders")

	code, stdout, stderr := runSluice(t, append([]string{"queue", "flow", "pause", "orders", "merchant-1", "--for", "1h", "--json"}, admin...)...)
	var v queueapi.FlowView
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.PausedUntil == nil || len(v.FlowKey) != 32 {
		t.Fatalf("flow pause: %d %s %s", code, stdout, stderr)
	}
	// The dispatcher has read the pause once its gauge says so.
	waitFor(t, "the dispatcher to see the pause", 30*time.Second, func() bool {
		m := send(t, "GET", p.admin+"/metrics", nil, "Authorization", "Bearer "+token).body
		return strings.Contains(m, `sluice_queue_flow_keys_paused{queue="orders"} 1`)
	})
	held := []accepted{
		mustDefer(t, p.url, "/v1/orders", "m1-a", "X-Merchant", "merchant-1"),
		mustDefer(t, p.url, "/v1/orders", "m1-b", "X-Merchant", "merchant-1"),
	}
	for _, o := range []string{"m2-a", "m2-b", "m2-c"} {
		a := mustDefer(t, p.url, "/v1/orders", o, "X-Merchant", "merchant-2")
		waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	}
	for _, a := range held {
		if st, _ := getStatus(t, p.url, a.Ticket); st.Status != "queued" {
			t.Errorf("an order of the paused merchant is %s", st.Status)
		}
	}
	// The held orders are the paused key's depth, once the dispatcher has reported
	// them (every 2 s); the delivered key's orders are gone from its depth.
	var shown queueapi.FlowView
	waitFor(t, "the dispatcher's report of the paused key", 30*time.Second, func() bool {
		code, stdout, _ := runSluice(t, append([]string{"queue", "flow", "show", "orders", "merchant-1", "--json"}, admin...)...)
		return code == 0 && json.Unmarshal([]byte(stdout), &shown) == nil && shown.Depth != nil && *shown.Depth == len(held)
	})
	if !shown.Paused || shown.ConfiguredRate != "5/s" || shown.MaxInFlight != 2 || shown.FlowKey != v.FlowKey {
		t.Errorf("flow show: %+v", shown)
	}
	code, stdout, stderr = runSluice(t, append([]string{"queue", "flow", "list", "orders"}, admin...)...)
	if code != 0 || !strings.Contains(stdout, v.FlowKey) || strings.Contains(stdout, "merchant-1") || !strings.Contains(stdout, "DEPTH") {
		t.Errorf("flow list: %d %s %s", code, stdout, stderr)
	}
	t.Logf("flow list:\n%s", stdout)
	var page queueapi.FlowsPage
	code, stdout, stderr = runSluice(t, append([]string{"queue", "flow", "list", "orders", "--json"}, admin...)...)
	if code != 0 || json.Unmarshal([]byte(stdout), &page) != nil || page.QueueDepth < uint64(len(held)) || page.Reports < 1 {
		t.Errorf("flow list --json: %d %s %s", code, stdout, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "flow", "rate", "orders", "merchant-1", "fast"}, admin...)...); code != 2 {
		t.Errorf("flow rate fast: %d %s", code, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "flow", "pause", "orders", "merchant-1"}, admin...)...); code != 2 {
		t.Errorf("flow pause without --for: %d %s", code, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "flow", "pause", "orders", "..", "--for", "1m"}, admin...)...); code != 2 {
		t.Errorf("flow pause ..: %d %s", code, stderr)
	}
	code, stdout, stderr = runSluice(t, append([]string{"queue", "flow", "rate", "orders", "merchant-1", "2/s"}, admin...)...)
	if code != 0 || !strings.Contains(stdout, "2/s") {
		t.Errorf("flow rate: %d %s %s", code, stdout, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "flow", "resume", "orders", "merchant-1"}, admin...)...); code != 0 {
		t.Fatalf("flow resume: %d %s", code, stderr)
	}
	for _, a := range held {
		waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	}
}

// Through the binaries: with --redis, a flow key's pace lives in Redis, so a
// `sluice dispatch` that takes a queue over from a dead one keeps it. The first
// dispatcher delivers the key's first order and is killed; the second, another process
// on the same NATS and Redis, starts the key's second order one key interval (10 s)
// after the first, not as soon as it has the queue.
func TestQueueFlowPaceInRedisThroughTheBinaries(t *testing.T) {
	t.Parallel()
	rs, nc := redistest.Start(t), natstest.Start(t)
	var mu sync.Mutex
	var arrived []time.Time
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		arrived = append(arrived, time.Now())
		mu.Unlock()
	}))
	t.Cleanup(down.Close)
	arrivals := func() []time.Time {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(arrived)
	}
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, `outflow: {rate: 20/s}
flow_by: {from: "header:X-Merchant", rate: 6/m}`))
	common := []string{"--rules", rulesPath, "--nats", nc.URL, "--queue-key", testQueueKey, "--redis", "redis://" + rs.Addr() + "/0",
		"--redis-timeout", "5s"} // the key's pace is shared only while Redis answers
	front := startCommand(t, "ingress", append(common, "--upstream", newUpstream(t, 0).URL)...)
	first := startCommand(t, "dispatch", append(common, dispatchFlags...)...)
	warmUp(t, front.url, "/v1/orders")
	mustDefer(t, front.url, "/v1/orders", "m1-a", "X-Merchant", "merchant-1")
	mustDefer(t, front.url, "/v1/orders", "m1-b", "X-Merchant", "merchant-1")
	waitFor(t, "the first order", 30*time.Second, func() bool { return len(arrivals()) == 1 })
	keys, err := rs.Client().Keys(context.Background(), "*flow*").Result()
	if err != nil || len(keys) == 0 {
		t.Errorf("no flow key pace in Redis: %v, %v", keys, err)
	}
	first.kill(t)
	startCommand(t, "dispatch", append(common, dispatchFlags...)...)
	waitFor(t, "the second order, from the second dispatcher", 60*time.Second, func() bool { return len(arrivals()) == 2 })
	a := arrivals()
	gap := a[1].Sub(a[0])
	t.Logf("the key's two deliveries, across the fail-over: %s apart (its interval 10s); Redis keys %v", gap.Round(time.Millisecond), keys)
	if gap < 10*time.Second-250*time.Millisecond {
		t.Errorf("the key's starts across the fail-over were %s apart, less than its interval", gap)
	}
}
