package dispatcher

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redistest"
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

func TestPacingTransportPacesAndHonoursRetryAfter(t *testing.T) {
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
	tr := NewPacingTransport(stamp, rate, WithTransportClock(clk))
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

func TestPacingTransportReturnsUnreplayable429(t *testing.T) {
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(http.StatusServiceUnavailable) // no Retry-After: the default pause
	})
	clk := newSimClock()
	tr := NewPacingTransport(nil, limiter.PerSecond(100), WithTransportClock(clk), WithTransportPause(3*time.Second, time.Hour))
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
	tr2 := NewPacingTransport(nil, limiter.PerSecond(100), WithTransportClock(clk), WithRetryLimit(2))
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

func TestPacingTransportSharedThroughRedis(t *testing.T) {
	rs := redistest.Start(t)
	var calls atomic.Int32
	var throttle atomic.Bool
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if throttle.CompareAndSwap(true, false) {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	rate := limiter.PerSecond(40)
	clock := SystemClock{}
	stamp := &stampTransport{clock: clock, base: http.DefaultTransport}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Two "processes": separate transports, one Redis key.
	a := NewPacingTransport(stamp, rate, WithRedisPacing(rs.Client(), "{pace}:thirdparty"))
	b := NewPacingTransport(stamp, rate, WithRedisPacing(rs.Client(), "{pace}:thirdparty"))
	const perTransport = 30
	var wg sync.WaitGroup
	start := time.Now()
	for _, tr := range []*PacingTransport{a, b} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range perTransport {
				req, _ := http.NewRequest("GET", srv.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				_ = resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	// 60 starts at 40/s: the last slot is at least 59/40 s after the first (minus the
	// tolerance). Two unshared pacers would take half as long.
	if took := time.Since(start); took < 59*rate.Interval()-DefaultTolerance {
		t.Errorf("60 requests at a shared 40/s took %v", took)
	}

	// A 429 seen by one process pauses the other.
	throttle.Store(true)
	req, _ := http.NewRequest("GET", srv.URL, nil)
	pausedAt := time.Now()
	resp, err := a.RoundTrip(req) // 429, pause 1s, retried
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("status %d", resp.StatusCode)
	}
	n := len(stamp.stamps())
	req, _ = http.NewRequest("GET", srv.URL, nil)
	resp, err = b.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if gap := stamp.stamps()[n].Sub(pausedAt); gap < 900*time.Millisecond {
		t.Errorf("the other process sent %v after the 429 with Retry-After: 1", gap)
	}

	// Redis gone: fail closed, nothing sent.
	rs.Stop()
	before := calls.Load()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ = http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
	if _, err := a.RoundTrip(req); err == nil {
		t.Error("no error without Redis")
	}
	if calls.Load() != before {
		t.Error("a request went out without a slot")
	}
}
