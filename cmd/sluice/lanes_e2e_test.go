package main

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// lanesRules defer every POST /v1/orders beyond the first into a queue with strict
// priorities (the route's priority comes from X-Priority, default low) and fair_by
// X-Tenant with a cap per tenant lane.
func lanesRules(downstreamURL string) string {
	return fmt.Sprintf(`
domain: e2e-lanes
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    algorithm: token_bucket
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
    priority: {from: "header:X-Priority", default: low}
queues:
  orders:
    downstream: %s
    outflow: {rate: 20/s}
    max_in_flight: 1
    priorities: {levels: [high, low], mode: strict}
    fair_by: header:X-Tenant
    fair_lanes: 64
    tenant_max_depth: 60
`, downstreamURL)
}

// positions returns the 1-based positions, among the orders delivered after the
// first skip, of the orders whose X-Order starts with prefix.
func (d *downstream) positions(skip int, prefix string) []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []int
	for i, key := range d.order[min(skip, len(d.order)):] {
		if strings.HasPrefix(d.requests[key].order, prefix) {
			out = append(out, i+1)
		}
	}
	return out
}

func (d *downstream) delivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.order)
}

// Through the binary: tenant A floods the queue; its lane's cap refuses the excess
// with 429 like a full queue; high-priority orders and other tenants' orders parked
// after the flood are delivered long before it has drained.
func TestLanesThroughTheBinary(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), lanesRules(down.URL))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")

	var accepted, refused int
	for i := range 120 {
		r, err := postOrder(p.url, "/v1/orders", fmt.Sprint("a", i), "{}", "X-Tenant", "tenant-a")
		switch {
		case err != nil:
			t.Fatal(err)
		case r.status == http.StatusAccepted:
			accepted++
		case r.status == http.StatusTooManyRequests && r.header.Get("Retry-After") != "" && strings.Contains(r.body, "full"):
			refused++
		default:
			t.Fatalf("order a%d: %d %s", i, r.status, r.body)
		}
	}
	t.Logf("tenant A: %d accepted, %d refused by tenant_max_depth 60", accepted, refused)
	if refused == 0 || accepted < 60 {
		t.Errorf("tenant A: %d accepted, %d refused; want the lane capped at 60 waiting orders", accepted, refused)
	}
	// Positions count from just before each order was sent: deliveries go on at 20/s
	// while the requests are sent, however slow the machine is, and an order may be
	// delivered before its sender has read its 202 (counted from after it, the first B
	// order was once missed altogether).
	skip := down.delivered()
	// Six other tenants (each hashed to one of 64 lanes: most, almost surely, not A's).
	bAccepted := 0
	for i := range 6 {
		r, err := postOrder(p.url, "/v1/orders", fmt.Sprint("b", i), "{}", "X-Tenant", fmt.Sprint("tenant-b", i))
		if err == nil && r.status == http.StatusAccepted {
			bAccepted++
		}
	}
	skipH := down.delivered()
	mustDefer(t, p.url, "/v1/orders", "h0", "X-Tenant", "tenant-a", "X-Priority", "high")
	if bAccepted == 0 {
		t.Fatal("no other tenant's order was accepted")
	}
	deadline := time.Now().Add(60 * time.Second)
	for len(down.positions(skip, "b")) < bAccepted || len(down.positions(skipH, "h")) < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("B's and the high orders did not arrive: b at %v, h at %v", down.positions(skip, "b"), down.positions(skipH, "h"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	b, h := down.positions(skip, "b"), down.positions(skipH, "h")
	left := accepted - skip // about A's orders waiting when B parked
	t.Logf("outflow 20/s: after B parked, the high order came at position %v, B's orders at %v; A had about %d orders waiting", h, b, left)
	if h[0] > 10 {
		t.Errorf("the high-priority order came at position %d", h[0])
	}
	if b[0] > 20 {
		t.Errorf("other tenants' first order came at position %d", b[0])
	}
}
