package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// arrivals is a downstream that records when each order (X-Order) first arrived and
// how often.
type arrivals struct {
	*httptest.Server
	mu    sync.Mutex
	first map[string]time.Time
	count map[string]int
}

func newArrivals(t *testing.T) *arrivals {
	a := &arrivals{first: map[string]time.Time{}, count: map[string]int{}}
	a.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		o := r.Header.Get("X-Order")
		a.mu.Lock()
		if a.count[o] == 0 {
			a.first[o] = time.Now()
		}
		a.count[o]++
		a.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(a.Close)
	return a
}

func (a *arrivals) seen(o string) (time.Time, int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.first[o], a.count[o]
}

// TestScheduledSurvivesKill: orders scheduled with Sluice-Not-Before (within the limit,
// so only the header makes them wait) are answered 202 "scheduled"; `sluice serve`
// (embedded NATS) is killed with SIGKILL while they wait; after a restart on the same
// data directory every one of them is delivered, none before its time, and an order
// cancelled while scheduled never is.
func TestScheduledSurvivesKill(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newArrivals(t)
	rulesPath := writeRules(t, t.TempDir(), strings.Replace(deferRules(down.URL, "outflow: {rate: 50/s}\nmax_delay: 1h"),
		"requests_per_unit: 1, name: orders", "requests_per_unit: 1000, name: orders", 1))
	dataDir := t.TempDir()
	args := append([]string{"--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir}, dispatchFlags...)
	p := startSluice(t, args...)

	const n = 25
	due := map[string]time.Time{}
	for i := range n {
		o := fmt.Sprintf("s-%d", i)
		acc := mustDefer(t, p.url, "/v1/orders", o, "Sluice-Not-Before", fmt.Sprint(8+i%4))
		if acc.Status != "scheduled" {
			t.Fatalf("order %s: status %q, want scheduled", o, acc.Status)
		}
		when, err := time.Parse(time.RFC3339, acc.EstimatedDelivery)
		if err != nil {
			t.Fatal(err)
		}
		due[o] = when
	}
	cancelled := mustDefer(t, p.url, "/v1/orders", "s-cancelled", "Sluice-Not-Before", "9")
	req, _ := http.NewRequest("DELETE", p.url+cancelled.Monitor, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("cancel while scheduled: %d", resp.StatusCode)
	}
	// Over-bound and malformed times are refused.
	if r, err := postOrder(p.url, "/v1/orders", "far", "{}", "Sluice-Not-Before", "7200"); err != nil || r.status != http.StatusBadRequest || !strings.Contains(r.body, "max_delay") {
		t.Fatalf("beyond max_delay: %+v %v", r, err)
	}

	delivered := 0
	for o := range due {
		if _, c := down.seen(o); c > 0 {
			delivered++
		}
	}
	p.kill(t)
	if delivered == n {
		t.Fatal("every order was delivered before the kill; the test proves nothing")
	}
	t.Logf("killed with %d scheduled orders, %d delivered", n, delivered)

	p2 := startSluice(t, args...)
	waitFor(t, "every scheduled order", 90*time.Second, func() bool {
		for o := range due {
			if _, c := down.seen(o); c == 0 {
				return false
			}
		}
		return true
	})
	for o, when := range due {
		if at, c := down.seen(o); at.Before(when) || c != 1 {
			t.Errorf("order %s: %d deliveries, first at %s; due %s", o, c, at.Format(time.RFC3339Nano), when)
		}
	}
	// Past its time, the cancelled order still has not come.
	waitFor(t, "the cancelled order's time", 30*time.Second, func() bool {
		when, _ := time.Parse(time.RFC3339, cancelled.EstimatedDelivery)
		return time.Now().After(when.Add(2 * time.Second))
	})
	if _, c := down.seen("s-cancelled"); c != 0 {
		t.Errorf("the cancelled order was delivered %d times", c)
	}
	waitStatus(t, p2.url, cancelled.Ticket, "cancelled", 10*time.Second)
}
