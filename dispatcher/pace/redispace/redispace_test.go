package redispace_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/dispatcher/pace/redispace"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redistest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// stampTransport records when each request is handed to the real transport.
type stampTransport struct {
	base  http.RoundTripper
	mu    sync.Mutex
	times []time.Time
}

func (s *stampTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	s.times = append(s.times, time.Now())
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

func newTransport(t *testing.T, base http.RoundTripper, r limiter.Rate, c redis.UniversalClient, key string) *pace.Transport {
	t.Helper()
	s, err := redispace.New(c, key)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := pace.NewTransport(base, r, pace.WithShared(s))
	if err != nil {
		t.Fatal(err)
	}
	return tr
}

func TestNewRefusesBadArguments(t *testing.T) {
	if _, err := redispace.New(nil, "k"); !errors.Is(err, pace.ErrInvalidOption) {
		t.Errorf("nil client: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer c.Close()
	if _, err := redispace.New(c, ""); !errors.Is(err, pace.ErrInvalidOption) {
		t.Errorf("empty key: %v", err)
	}
	s, err := redispace.New(c, "k")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Reserve(context.Background(), limiter.Rate{}); !errors.Is(err, pace.ErrInvalidOption) {
		t.Errorf("zero rate: %v", err)
	}
}

func TestScheduleSharedByTwoTransports(t *testing.T) {
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
	stamp := &stampTransport{base: http.DefaultTransport}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Two "processes": separate transports, one Redis key.
	a := newTransport(t, stamp, rate, rs.Client(), "{pace}:thirdparty")
	b := newTransport(t, stamp, rate, rs.Client(), "{pace}:thirdparty")
	const perTransport = 30
	var wg sync.WaitGroup
	start := time.Now()
	for _, tr := range []*pace.Transport{a, b} {
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
	if took := time.Since(start); took < 59*rate.Interval()-pace.DefaultTolerance {
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

// A quota reported to one process slows its next start on the shared schedule at once:
// the spread's interval separates it from the previous start of any process.
func TestScheduleSpread(t *testing.T) {
	rs := redistest.Start(t)
	var calls atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("RateLimit", `"api";r=2;t=1`)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	stamp := &stampTransport{base: http.DefaultTransport}
	defer http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	tr := newTransport(t, stamp, limiter.PerSecond(100), rs.Client(), "{pace}:spread")
	begin := time.Now()
	for range 3 {
		req, _ := http.NewRequest("GET", srv.URL, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
	}
	ts := stamp.stamps()
	// 2 left for 1s: start i is granted 500ms after start i-1 (less the tolerance), not
	// 10ms. Measured from before the first start, not between starts: a start that
	// woke late (a busy machine) would shorten the gap to the next one.
	for i, at := range ts {
		if since, want := at.Sub(begin), time.Duration(i)*(500*time.Millisecond-pace.DefaultTolerance); since < want {
			t.Errorf("start %d came %v after the first was asked for, want at least %v", i, since, want)
		}
	}
}
