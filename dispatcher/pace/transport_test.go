package pace

import (
	"io"
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
