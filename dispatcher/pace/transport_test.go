package pace

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// stampTransport records when (on clock) each request is handed to the real transport.
type stampTransport struct {
	clock Clock
	base  http.RoundTripper
	mu    sync.Mutex
	times []time.Time
}

func (s *stampTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.times = append(s.times, s.clock.Now())
	s.mu.Unlock()
	return s.base.RoundTrip(req)
}

func (s *stampTransport) stamps() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.times...)
}

func newServer(t *testing.T, h http.HandlerFunc) *httptest.Server {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

func TestTransportPacesAndHonoursRetryAfter(t *testing.T) {
	var calls atomic.Int32
	var bodies sync.Map
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n := calls.Add(1)
		b, _ := io.ReadAll(r.Body)
		bodies.Store(n, string(b))
		if n == 5 {
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	clk := newSimClock()
	stamp := &stampTransport{clock: clk, base: http.DefaultTransport}
	rate := limiter.PerSecond(20)
	tr := mustTransport(t, stamp, rate, WithTransportClock(clk))
	client := &http.Client{Transport: tr}
	defer client.CloseIdleConnections()
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()

	for i := range 12 {
		resp, err := client.Post(srv.URL, "text/plain", strings.NewReader("order-"+string(rune('a'+i))))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i, resp.StatusCode)
		}
	}
	times := stamp.stamps()
	if len(times) != 13 { // 12 requests, one retried
		t.Fatalf("%d requests sent", len(times))
	}
	checkBound(t, rate, times, 0)
	if gap := times[5].Sub(times[4]); gap < 2*time.Second {
		t.Errorf("retry %v after the 429 with Retry-After: 2", gap)
	}
	if b, _ := bodies.Load(int32(6)); b != "order-e" {
		t.Errorf("retried body %q, want the replayed original", b)
	}
	if !tr.Pacer().PausedUntil().Equal(times[4].Add(2 * time.Second)) {
		t.Errorf("pause until %v", tr.Pacer().PausedUntil())
	}
}

type oneShotReader struct{ r io.Reader }

func (o *oneShotReader) Read(p []byte) (int, error) { return o.r.Read(p) }

func TestTransportReturnsUnreplayable429(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: the default pause
	})
	clk := newSimClock()
	tr := mustTransport(t, nil, limiter.PerSecond(100), WithTransportClock(clk), WithTransportPause(3*time.Second, time.Hour))
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	req, _ := http.NewRequest("POST", srv.URL, &oneShotReader{strings.NewReader("x")})
	start := clk.Now()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 503 || calls.Load() != 1 {
		t.Fatalf("status %d after %d calls", resp.StatusCode, calls.Load())
	}
	if got := tr.Pacer().PausedUntil().Sub(start); got != 3*time.Second {
		t.Errorf("default pause %v", got)
	}
	// A replayable request is retried up to the limit, then the 503 is returned.
	tr2 := mustTransport(t, nil, limiter.PerSecond(100), WithTransportClock(clk), WithRetryLimit(2))
	req2, _ := http.NewRequest("GET", srv.URL, nil)
	resp, err = tr2.RoundTrip(req2)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != 503 || calls.Load() != 4 {
		t.Fatalf("status %d after %d calls, want 1+3", resp.StatusCode, calls.Load())
	}
}

func mustTransport(t *testing.T, base http.RoundTripper, r limiter.Rate, opts ...TransportOption) *Transport {
	t.Helper()
	tr, err := NewTransport(base, r, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

// The transport reads the quota in each answer: it spreads what remains until the
// reset, waits for the reset when nothing remains, and on a 429 pauses for the longer
// of Retry-After and the reported reset, capped.
func TestTransportAdaptsToQuota(t *testing.T) {
	answers := []struct {
		status int
		header map[string]string
	}{
		1: {200, map[string]string{"RateLimit": `"api";r=4;t=2`, "RateLimit-Policy": `"api";q=50;w=2`}},
		2: {200, nil}, 3: {200, nil}, 4: {200, nil}, 5: {200, nil},
		6:  {200, map[string]string{"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "3"}},
		7:  {429, map[string]string{"RateLimit": `"api";r=0;t=5`, "Retry-After": "2"}},
		8:  {200, nil},
		9:  {200, map[string]string{"RateLimit": `"api";r=0;t=2,`}}, // malformed: ignored
		10: {200, nil},
	}
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		a := answers[calls.Add(1)]
		for k, v := range a.header {
			w.Header().Set(k, v)
		}
		w.WriteHeader(a.status)
	})
	clk := newSimClock()
	stamp := &stampTransport{clock: clk, base: http.DefaultTransport}
	rate := limiter.PerSecond(100)
	tr := mustTransport(t, stamp, rate, WithTransportClock(clk), WithTransportPause(time.Second, 4*time.Second))
	client := &http.Client{Transport: tr}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	for i := range 9 {
		resp, err := client.Get(srv.URL)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: %d", i+1, resp.StatusCode)
		}
	}
	ts := stamp.stamps()
	if len(ts) != 10 {
		t.Fatalf("%d requests sent, want 9 + 1 retried", len(ts))
	}
	checkBound(t, rate, ts, 0)
	g := gaps(ts) // g[i] is the wait before call i+2
	for i := 0; i < 4; i++ {
		if g[i] != 500*time.Millisecond {
			t.Errorf("call %d came %v after the previous; 4 left for 2s: want 500ms", i+2, g[i])
		}
	}
	if g[4] < 8*time.Millisecond || g[4] > 10*time.Millisecond {
		t.Errorf("call 6, after the reset, came %v after the previous; want the set rate's 10ms", g[4])
	}
	if g[5] != 3*time.Second {
		t.Errorf("call 7 came %v after X-RateLimit-Remaining: 0 with a reset in 3s", g[5])
	}
	if g[6] != 4*time.Second {
		t.Errorf("the retry came %v after a 429 with Retry-After: 2 and a reset in 5s, capped at 4s", g[6])
	}
	if g[7] != 10*time.Millisecond {
		t.Errorf("call 9 came %v after the previous, want 10ms", g[7])
	}
	if g[8] != 10*time.Millisecond {
		t.Errorf("call 10 came %v after a malformed RateLimit field, want 10ms (field ignored)", g[8])
	}
}

type connRequests struct{}

// TestTransportSendsEachRequestOnce: a server that closes a reused connection on the
// request it just read, unanswered, receives exactly the requests the transport paced
// — net/http's Transport sends none again on its own, for any method and body (with
// an Idempotency-Key, which makes it take even a POST for replayable) — and the
// request the caller passed is not modified.
func TestTransportSendsEachRequestOnce(t *testing.T) {
	var arrived atomic.Int64
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		arrived.Add(1)
		if r.Context().Value(connRequests{}).(*atomic.Int64).Add(1) > 1 {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				c.Close()
			}
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	srv.Config.ConnContext = func(ctx context.Context, _ net.Conn) context.Context {
		return context.WithValue(ctx, connRequests{}, new(atomic.Int64))
	}
	srv.Start()
	t.Cleanup(srv.Close)
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	stamps := &stampTransport{clock: SystemClock{}, base: base}
	tr := mustTransport(t, stamps, limiter.PerSecond(200))
	client := &http.Client{Transport: tr}
	requests, failed := 0, map[bool]int{}
	for _, keyed := range []bool{true, false} {
		for _, method := range []string{"POST", "PUT", "PATCH", "DELETE", "GET", "HEAD", "OPTIONS"} {
			for _, body := range []string{"", `{"n":1}`} {
				for range 2 { // the second goes on the reused connection and is dropped
					req, err := http.NewRequest(method, srv.URL, strings.NewReader(body))
					if err != nil {
						t.Fatal(err)
					}
					if keyed {
						req.Header.Set("Idempotency-Key", "k-"+method)
					}
					requests++
					resp, err := client.Do(req)
					if err != nil {
						failed[keyed || idempotentMethod(method)]++
					} else {
						resp.Body.Close()
					}
					if req.GetBody == nil && body != "" || keyed && req.Header.Get("Idempotency-Key") == "" {
						t.Errorf("%s: the caller's request was modified", method)
					}
				}
			}
		}
	}
	sent := len(stamps.stamps())
	t.Logf("%d requests: %d paced, %d reached the server; failed unanswered: %d replayable, %d not",
		requests, sent, arrived.Load(), failed[true], failed[false])
	if int(arrived.Load()) != sent {
		t.Errorf("%d requests reached the server, %d were paced", arrived.Load(), sent)
	}
	if failed[true] != 0 || sent <= requests {
		t.Errorf("the replayable requests dropped were not sent again at slots of their own (%d failed)", failed[true])
	}
	if failed[false] == 0 {
		t.Error("no request that net/http would not replay failed: the test tested nothing")
	}
}
