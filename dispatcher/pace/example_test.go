package pace_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/limiter"
)

// A loop that may start at most 20 jobs per second, evenly spaced, as with
// x/time/rate's Limiter.Wait (burst 1) — but without catching up after a stall.
func ExamplePacer_Wait() {
	p, err := pace.New(limiter.PerSecond(20))
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for job := range 3 {
		if err := p.Wait(ctx); err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("job", job)
	}
	// Output:
	// job 0
	// job 1
	// job 2
}

// A client for a paid API that allows 5 calls per second: the transport spaces the
// calls evenly and, when the API answers 429 with Retry-After, waits and retries.
// With pace.WithShared(sched), sched from redispace.New(redisClient, "pace:{partner-api}"),
// the 5/s would be shared by every replica of the program.
func ExampleNewTransport() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "quote for", r.URL.Query().Get("sku"))
	}))
	defer api.Close()

	tr, err := pace.NewTransport(http.DefaultTransport, limiter.PerSecond(5))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	for _, sku := range []string{"a-1", "b-2", "c-3"} {
		resp, err := client.Get(api.URL + "/quote?sku=" + sku)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(resp.Status)
		resp.Body.Close()
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Output:
	// 200 OK
	// 200 OK
	// 200 OK
}

// The API reports its quota in the draft RateLimit field: after the first call nothing
// is left for one second, so the transport holds the second call until the quota
// resets instead of sending it into a 429.
func ExampleTransport_quota() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("RateLimit-Policy", `"hourly";q=1000;w=3600, "burst";q=10;w=1`)
			w.Header().Set("RateLimit", `"hourly";r=900;t=1800, "burst";r=0;t=1`)
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	defer api.Close()

	tr, err := pace.NewTransport(nil, limiter.PerSecond(50))
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: tr}
	start := time.Now()
	for range 2 {
		resp, err := client.Get(api.URL)
		if err != nil {
			fmt.Println(err)
			return
		}
		resp.Body.Close()
		fmt.Println(resp.Status)
	}
	fmt.Println("second call held for the reset:", time.Since(start) >= time.Second)
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Output:
	// 204 No Content
	// 204 No Content
	// second call held for the reset: true
}

// A program that paces calls it does not make through net/http (or its own
// RoundTripper) adapts a Pacer to the answers itself: ParseQuota reads the fields,
// Spread slows the pacer down until the reset.
func ExampleParseQuota() {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	h := http.Header{}
	h.Set("X-RateLimit-Remaining", "30")
	h.Set("X-RateLimit-Reset", fmt.Sprint(now.Add(time.Minute).Unix())) // a Unix time
	h.Set("RateLimit", `"per-second";r=8;t=1`)

	q, ok := pace.ParseQuota(h, now)
	fmt.Println(ok, q.Remaining, "left for", q.Reset)
	// With p a *pace.Pacer: p.Spread(q.Remaining, time.Now().Add(q.Reset))

	// Output:
	// true 30 left for 1m0s
}
