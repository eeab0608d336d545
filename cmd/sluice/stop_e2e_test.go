package main

import (
	"fmt"
	"net/http"
	"testing"
	"time"
)

// SIGTERM to `sluice serve` mid-run, restart on the same data directory (its embedded
// NATS restarts with it): the orders the dispatcher had fetched but not started are
// handed back with a stored nak, so every order arrives long before the ack wait (10
// minutes here) could have expired.
func TestServeCleanStopHandsOrdersBack(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 2/s}"))
	dataDir := t.TempDir()
	args := []string{"--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir, "--ack-wait", "10m"}
	p := startSluice(t, args...)
	warmUp(t, p.url, "/v1/orders")
	var tickets []string
	for i := range 8 {
		tickets = append(tickets, mustDefer(t, p.url, "/v1/orders", fmt.Sprintf("o-%d", i)).Ticket)
	}
	waitFor(t, "the first deliveries", 30*time.Second, func() bool { return down.arrived(tickets) >= 2 })
	started := time.Now()
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	before := down.arrived(tickets)
	if before == len(tickets) {
		t.Fatal("everything was delivered before the stop; the test proves nothing")
	}
	p2 := startSluice(t, args...)
	down.waitArrived(t, tickets, 3*time.Minute)
	if took := time.Since(started); took >= 10*time.Minute {
		t.Fatalf("took %s: the ack wait may have expired", took)
	}
	for _, tk := range tickets {
		st, r := getStatus(t, p2.url, tk)
		if r.status != http.StatusOK || st.Status != "done" {
			waitStatus(t, p2.url, tk, "done", 20*time.Second)
		}
	}
	t.Logf("%d of %d delivered before the stop; the rest %s after it", before, len(tickets), time.Since(started).Round(time.Millisecond))
}
