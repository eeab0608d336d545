package redisstore_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// The conformance suite: every algorithm on every store (see stores in stores_test.go),
// on an injected clock, with the exact decisions that the semantics in package
// limiter's table of algorithms (go doc ./limiter, section "Limiter") give.

// t0 is aligned to every whole second, minute, hour and day window.
var t0 = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// testClock is a settable clock, safe for concurrent use.
type testClock struct {
	mu  sync.Mutex
	now time.Time
}

func newTestClock() *testClock { return &testClock{now: t0} }

func (c *testClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Set moves the clock to t0+offset, forwards or backwards.
func (c *testClock) Set(offset time.Duration) {
	c.mu.Lock()
	c.now = t0.Add(offset)
	c.mu.Unlock()
}

// storeFactory makes an empty store reading time from clock.
type storeFactory struct {
	name string
	new  func(t *testing.T, clock *testClock) limiter.Limiter
}

type step struct {
	at   time.Duration // clock offset from t0
	key  string        // "" means "k"
	n    int64         // 0 means 1
	want limiter.Decision
}

const ms = time.Millisecond

const (
	// longest is the longest time.Duration, at which longer times saturate.
	longest = time.Duration(math.MaxInt64)
	// maxPeriod is the longest period a Limit takes: 2^53-1 µs, about 285 years.
	maxPeriod = (1<<53 - 1) * time.Microsecond
)

// t0Micros is t0 as a time since the Unix epoch, to the µs.
var t0Micros = time.Duration(t0.UnixMicro()) * time.Microsecond

func allow(remaining int64, reset time.Duration) limiter.Decision {
	return limiter.Decision{Allowed: true, Remaining: remaining, ResetAfter: reset}
}

func deny(remaining int64, retry, reset time.Duration) limiter.Decision {
	return limiter.Decision{Remaining: remaining, RetryAfter: retry, ResetAfter: reset}
}

var conformanceCases = []struct {
	name  string
	limit limiter.Limit
	steps []step
}{
	{
		name:  "token bucket starts full, refills continuously, capped at burst",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Second, Burst: 4},
		steps: []step{
			{at: 0, want: allow(3, 500*ms)},
			{at: 0, n: 3, want: allow(0, 2*time.Second)},
			{at: 0, want: deny(0, 500*ms, 2*time.Second)},
			{at: 250 * ms, want: deny(0, 250*ms, 1750*ms)},
			{at: 500 * ms, want: allow(0, 2*time.Second)},
			{at: 10 * time.Second, want: allow(3, 500*ms)},
			{at: 10 * time.Second, n: 5, want: deny(3, limiter.Never, 500*ms)},
			{at: 10 * time.Second, n: 4, want: deny(3, 500*ms, 500*ms)},
			{at: 10*time.Second + 500*ms, n: 4, want: allow(0, 2*time.Second)},
		},
	},
	{
		name:  "token bucket burst defaults to rate",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Minute},
		steps: []step{
			{at: 0, n: 2, want: allow(0, time.Minute)},
			{at: 0, want: deny(0, 30*time.Second, time.Minute)},
		},
	},
	{
		name:  "leaky bucket admits while the queue has room and drains at the outflow rate",
		limit: limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 1, Period: time.Second, Burst: 2},
		steps: []step{
			{at: 0, want: allow(1, time.Second)},
			{at: 0, want: allow(0, 2*time.Second)},
			{at: 0, want: deny(0, time.Second, 2*time.Second)},
			{at: 1500 * ms, want: allow(0, 1500*ms)},
			{at: 1500 * ms, n: 2, want: deny(0, 1500*ms, 1500*ms)},
			{at: 1500 * ms, n: 3, want: deny(0, limiter.Never, 1500*ms)},
			{at: time.Hour, n: 2, want: allow(0, 2*time.Second)},
		},
	},
	{
		name:  "fixed window resets at each boundary and ignores rejected requests",
		limit: limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 3, Period: time.Second},
		steps: []step{
			{at: 0, want: allow(2, time.Second)},
			{at: 400 * ms, n: 2, want: allow(0, 600*ms)},
			{at: 999 * ms, want: deny(0, 1*ms, 1*ms)},
			{at: 1000 * ms, want: allow(2, time.Second)},
			{at: 1500 * ms, n: 4, want: deny(2, limiter.Never, 500*ms)},
			{at: 1500 * ms, n: 3, want: deny(2, 500*ms, 500*ms)},
			{at: 2500 * ms, n: 3, want: allow(0, 500*ms)},
			{at: 3000 * ms, want: allow(2, time.Second)},
		},
	},
	{
		// t0 is 946684800s after the epoch, 5s into a 7s window.
		name:  "fixed window is aligned to the Unix epoch",
		limit: limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: 7 * time.Second},
		steps: []step{
			{at: 0, want: allow(0, 2*time.Second)},
			{at: 1999 * ms, want: deny(0, 1*ms, 1*ms)},
			{at: 2 * time.Second, want: allow(0, 7*time.Second)},
		},
	},
	{
		name:  "sliding window log keeps rejected timestamps",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 3, Period: time.Second},
		steps: []step{
			{at: 0, want: allow(2, time.Second)},
			{at: 100 * ms, want: allow(1, time.Second)},
			{at: 200 * ms, want: allow(0, time.Second)},
			// Rejected, recorded: the log is 100, 200, 300.
			{at: 300 * ms, want: deny(0, 800*ms, time.Second)},
			// 0 has expired, but the rejected 300 still counts: log 200, 300, 1000.
			{at: 1000 * ms, want: deny(0, 200*ms, time.Second)},
			// 200 and 300 have expired: log 1000, 1900.
			{at: 1900 * ms, want: allow(1, time.Second)},
			// Rejected, recorded: the log keeps the newest three, 1900 thrice.
			{at: 1900 * ms, n: 2, want: deny(0, time.Second, time.Second)},
			// A timestamp at exactly now-window is out.
			{at: 2900 * ms, n: 3, want: allow(0, time.Second)},
			{at: 2900 * ms, n: 4, want: deny(0, limiter.Never, time.Second)},
		},
	},
	{
		name:  "sliding window log can forgive rejected requests",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 3, Period: time.Second, ForgiveRejected: true},
		steps: []step{
			{at: 0, want: allow(2, time.Second)},
			{at: 100 * ms, want: allow(1, time.Second)},
			{at: 200 * ms, want: allow(0, time.Second)},
			{at: 300 * ms, want: deny(0, 700*ms, 900*ms)},
			{at: 1000 * ms, want: allow(0, time.Second)},
			{at: 1000 * ms, n: 2, want: deny(0, 200*ms, time.Second)},
			{at: 1200 * ms, n: 2, want: allow(0, time.Second)},
		},
	},
	{
		name:  "sliding window counter weighs the previous window by its overlap",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 10, Period: time.Second},
		steps: []step{
			{at: 500 * ms, n: 8, want: allow(2, 1500*ms)},
			// The current window is full for 3 more: wait until 8*(1-e) < 8 in the next.
			{at: 900 * ms, n: 3, want: deny(2, 100*ms+time.Microsecond, 1100*ms)},
			// Estimate 0 + 8*0.75 = 6: allowed, then 7 in all.
			{at: 1250 * ms, want: allow(3, 1750*ms)},
			// 1 + floor(8*0.75) + 4 = 11 > 10; allowed as soon as 8's share is below 6.
			{at: 1250 * ms, n: 4, want: deny(3, time.Microsecond, 1750*ms)},
			{at: 1250*ms + time.Microsecond, n: 4, want: allow(0, 1750*ms-time.Microsecond)},
			{at: 1250*ms + time.Microsecond, n: 11, want: deny(0, limiter.Never, 1750*ms-time.Microsecond)},
			// Estimate 0 + 5*0.1 = 0.5: floor 0 < 10.
			{at: 2900 * ms, want: allow(9, 1100*ms)},
			// A window with no traffic in between: nothing carries over.
			{at: 5500 * ms, n: 10, want: allow(0, 1500*ms)},
		},
	},
	// Valid limits whose times exceed a time.Duration (about 292 years): they
	// saturate at the longest Duration, never wrap to a negative one.
	{
		name:  "a bucket's times beyond a time.Duration saturate",
		limit: limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1 << 20},
		steps: []step{
			{at: 0, want: allow(1<<20-1, 24*time.Hour)},
			// 2^20 days to drain.
			{at: 0, n: 1<<20 - 1, want: allow(0, longest)},
			{at: 0, want: deny(0, 24*time.Hour, longest)},
			{at: 0, n: 1 << 20, want: deny(0, longest, longest)},
			{at: 0, n: 1<<20 + 1, want: deny(0, limiter.Never, longest)},
			{at: 0, n: 1 << 62, want: deny(0, limiter.Never, longest)},
		},
	},
	{
		// level × period is about 2^106 µs, beyond any int64.
		name:  "the largest bucket saturates",
		limit: limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 1, Period: maxPeriod, Burst: 1<<53 - 1},
		steps: []step{
			{at: 0, n: 1<<53 - 1, want: allow(0, longest)},
			{at: 0, want: deny(0, maxPeriod, longest)},
			{at: 0, n: 1<<53 - 1, want: deny(0, longest, longest)},
		},
	},
	{
		// Windows of 2^53-1 µs: t0 is in the first; the counter's reset and wait
		// reach into the next one, past a time.Duration.
		name:  "a sliding window counter's times beyond a time.Duration saturate",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 1000, Period: maxPeriod},
		steps: []step{
			{at: 0, n: 1000, want: allow(0, longest)},
			{at: 0, n: 1000, want: deny(0, longest, longest)},
		},
	},
	{
		name:  "the longest fixed window",
		limit: limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1<<53 - 1, Period: maxPeriod},
		steps: []step{
			{at: 0, n: 1<<53 - 1, want: allow(0, maxPeriod-t0Micros)},
			{at: 0, want: deny(0, maxPeriod-t0Micros, maxPeriod-t0Micros)},
		},
	},
	{
		name:  "the longest sliding window log",
		limit: limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 2, Period: maxPeriod, ForgiveRejected: true},
		steps: []step{
			{at: 0, n: 2, want: allow(0, maxPeriod)},
			{at: 0, want: deny(0, maxPeriod, maxPeriod)},
		},
	},
}

func TestConformance(t *testing.T) {
	for _, store := range stores(t) {
		t.Run(store.name, func(t *testing.T) {
			for _, tc := range conformanceCases {
				t.Run(tc.name, func(t *testing.T) {
					clock := newTestClock()
					lim := store.new(t, clock)
					for i, s := range tc.steps {
						clock.Set(s.at)
						got := check(t, lim, key(s.key), tc.limit, s.n)
						want := s.want
						want.Limit = tc.limit.Capacity()
						if got != want {
							t.Fatalf("step %d (at %v, n=%d):\n got %+v\nwant %+v", i, s.at, max(s.n, 1), got, want)
						}
					}
				})
			}
		})
	}
}

func key(k string) string {
	if k == "" {
		return "k"
	}
	return k
}

func check(t *testing.T, lim limiter.Limiter, key string, l limiter.Limit, n int64) limiter.Decision {
	t.Helper()
	d, err := lim.AllowN(context.Background(), key, l, max(n, 1))
	if err != nil {
		t.Fatalf("AllowN(%q, n=%d): %v", key, n, err)
	}
	return d
}

// everyAlgorithm gives one limit per algorithm, each with a capacity of capacity.
func everyAlgorithm(capacity int64, period time.Duration) []limiter.Limit {
	var ls []limiter.Limit
	for _, a := range limiter.Algorithms {
		ls = append(ls, limiter.Limit{Algorithm: a, Rate: capacity, Period: period})
	}
	return ls
}

func TestHugeNIsNeverAllowed(t *testing.T) {
	for _, store := range stores(t) {
		for _, l := range everyAlgorithm(3, time.Second) {
			t.Run(store.name+"/"+string(l.Algorithm), func(t *testing.T) {
				lim := store.new(t, newTestClock())
				d := check(t, lim, "k", l, 1<<62)
				remaining := int64(3)
				if l.Algorithm == limiter.SlidingWindowLog {
					remaining = 0 // the rejected request is recorded, as always
				}
				if d.Allowed || d.RetryAfter != limiter.Never || d.Remaining != remaining {
					t.Fatalf("n=2^62 on a capacity of 3: %+v", d)
				}
			})
		}
	}
}

func TestBackwardsClockGrantsNothing(t *testing.T) {
	for _, store := range stores(t) {
		for _, l := range everyAlgorithm(3, time.Second) {
			t.Run(store.name+"/"+string(l.Algorithm), func(t *testing.T) {
				clock := newTestClock()
				lim := store.new(t, clock)
				clock.Set(1500 * ms)
				if d := check(t, lim, "k", l, 3); !d.Allowed {
					t.Fatalf("first request denied: %+v", d)
				}
				for _, back := range []time.Duration{time.Microsecond, 600 * ms, time.Second, 24 * time.Hour} {
					clock.Set(1500*ms - back)
					if d := check(t, lim, "k", l, 1); d.Allowed {
						t.Fatalf("clock stepped back by %v: allowed %+v", back, d)
					}
				}
			})
		}
	}
}

func TestKeysAreIndependent(t *testing.T) {
	const keys = 300
	for _, store := range stores(t) {
		for _, l := range everyAlgorithm(2, time.Minute) {
			t.Run(store.name+"/"+string(l.Algorithm), func(t *testing.T) {
				lim := store.new(t, newTestClock())
				for round, wantAllowed := range []bool{true, true, false} {
					for i := range keys {
						k := fmt.Sprintf("key-%d", i)
						if d := check(t, lim, k, l, 1); d.Allowed != wantAllowed {
							t.Fatalf("round %d, %s: %+v, want allowed=%v", round, k, d, wantAllowed)
						}
					}
				}
			})
		}
	}
}

// TestConcurrentCallersNeverExceedTheLimit runs many goroutines on one key with the
// clock stopped: exactly the capacity is granted, never more.
func TestConcurrentCallersNeverExceedTheLimit(t *testing.T) {
	const goroutines, perGoroutine, capacity = 32, 20, 100
	for _, store := range stores(t) {
		for _, l := range everyAlgorithm(capacity, time.Hour) {
			t.Run(store.name+"/"+string(l.Algorithm), func(t *testing.T) {
				lim := store.new(t, newTestClock())
				var allowed atomic.Int64
				var wg sync.WaitGroup
				for range goroutines {
					wg.Go(func() {
						for range perGoroutine {
							d, err := lim.AllowN(context.Background(), "hot", l, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if d.Allowed {
								allowed.Add(1)
							}
						}
					})
				}
				wg.Wait()
				if got := allowed.Load(); got != capacity {
					t.Fatalf("allowed %d of %d requests, want exactly %d", got, goroutines*perGoroutine, capacity)
				}
			})
		}
	}
}

// TestStoresAgree replays one random trace through every store: their decisions must
// be identical, to the microsecond.
func TestStoresAgree(t *testing.T) {
	all := stores(t)
	if len(all) < 2 {
		t.Skip("only one store configured")
	}
	limits := append(everyAlgorithm(5, 700*ms),
		limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 3, Period: 1100 * ms, Burst: 7},
		limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 7, Period: 300 * ms, Burst: 4},
		limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 4, Period: 900 * ms, ForgiveRejected: true},
	)
	for _, l := range limits {
		t.Run(fmt.Sprintf("%s/%d/%v", l.Algorithm, l.Rate, l.Period), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(1, uint64(l.Rate)))
			type event struct {
				at  time.Duration
				key string
				n   int64
			}
			var trace []event
			at := time.Duration(0)
			for range 400 {
				at += time.Duration(rng.Int64N(int64(250 * ms)))
				if rng.IntN(20) == 0 {
					at -= time.Duration(rng.Int64N(int64(time.Second))) // clock steps back
				}
				trace = append(trace, event{at, fmt.Sprint("k", rng.IntN(3)), 1 + rng.Int64N(3)})
			}
			var want []limiter.Decision
			for i, store := range all {
				clock := newTestClock()
				lim := store.new(t, clock)
				for j, e := range trace {
					clock.Set(e.at)
					got := check(t, lim, e.key, l, e.n)
					if i == 0 {
						want = append(want, got)
					} else if got != want[j] {
						t.Fatalf("event %d %+v: %s decided %+v, %s decided %+v", j, e, store.name, got, all[0].name, want[j])
					}
				}
			}
		})
	}
}

func TestInvalidRequests(t *testing.T) {
	valid := limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Second}
	cases := []struct {
		name  string
		limit limiter.Limit
		n     int64
	}{
		{"unknown algorithm", limiter.Limit{Algorithm: "gcra", Rate: 1, Period: time.Second}, 1},
		{"zero rate", limiter.Limit{Algorithm: limiter.TokenBucket, Period: time.Second}, 1},
		{"negative rate", limiter.Limit{Algorithm: limiter.FixedWindow, Rate: -1, Period: time.Second}, 1},
		{"sub-microsecond period", limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Nanosecond}, 1},
		{"negative burst", limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second, Burst: -2}, 1},
		{"unknown failure mode", limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Second, FailureMode: "maybe"}, 1},
		{"n of zero", valid, 0},
		{"negative n", valid, -3},
	}
	for _, store := range stores(t) {
		for _, tc := range cases {
			t.Run(store.name+"/"+tc.name, func(t *testing.T) {
				lim := store.new(t, newTestClock())
				_, err := lim.AllowN(context.Background(), "k", tc.limit, tc.n)
				if !errorsIs(err, limiter.ErrInvalidLimit) {
					t.Fatalf("got %v, want ErrInvalidLimit", err)
				}
			})
		}
	}
}
