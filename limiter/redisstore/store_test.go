package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
)

// Tests specific to the Redis store. The conformance suite (conformance_test.go)
// runs everything else on it too.

// standalone returns the shared standalone server, skipping t without Redis.
func standalone(t testing.TB) *redistest.Server {
	t.Helper()
	srv := shared.server(t)
	if srv == nil {
		t.Skip("redis-server not installed")
	}
	return srv
}

func cluster(t testing.TB) *redistest.Cluster {
	t.Helper()
	c := shared.clusterOf(t)
	if c == nil {
		t.Skip("redis-server not installed")
	}
	return c
}

// testLogger sends the store's logs to the test's log.
func testLogger(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, nil))
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// lockstep runs the same requests on a memory store and on lims, on one clock, and
// fails at the first decision that differs.
type lockstep struct {
	t     *testing.T
	clock *testClock
	mem   *limiter.Memory
	lims  map[string]limiter.Limiter
}

func newLockstep(t *testing.T, clock *testClock, lims map[string]limiter.Limiter) *lockstep {
	return &lockstep{t: t, clock: clock, mem: limiter.NewMemory(limiter.WithClock(clock.Now)), lims: lims}
}

func (s *lockstep) check(at time.Duration, key string, l limiter.Limit, n int64) limiter.Decision {
	s.t.Helper()
	s.clock.Set(at)
	want := check(s.t, s.mem, key, l, n)
	for name, lim := range s.lims {
		if got := check(s.t, lim, key, l, n); got != want {
			s.t.Fatalf("at %v, %s n=%d: %s decided %+v, memory %+v", at, key, n, name, got, want)
		}
	}
	return want
}

// everyLimit is one limit per algorithm, and the forgiving sliding log.
func everyLimit(capacity int64, period time.Duration) []limiter.Limit {
	return append(everyAlgorithm(capacity, period),
		limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: capacity, Period: period, ForgiveRejected: true})
}

func limitName(l limiter.Limit) string {
	if l.ForgiveRejected {
		return string(l.Algorithm) + "/forgiving"
	}
	return string(l.Algorithm)
}

// TestRedisCacheKeepsDecisions hammers a few keys far beyond their limits, with a
// clock that sometimes steps back, on Redis with and without the over-limit cache and
// on memory: every decision must be the same, and the cache must have answered many.
func TestRedisCacheKeepsDecisions(t *testing.T) {
	srv, c := standalone(t), cluster(t)
	limits := append(everyLimit(4, 500*ms),
		limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 3, Period: 1100 * ms, Burst: 7},
		limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 7, Period: 300 * ms, Burst: 4},
		limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 10, Period: 330 * ms},
	)
	for _, l := range limits {
		t.Run(fmt.Sprintf("%s/%d/%v", limitName(l), l.Rate, l.Period), func(t *testing.T) {
			clock := newTestClock()
			cached := newTestRedis(t, srv.Client(), redisstore.WithClock(clock.Now))
			clustered := newTestRedis(t, c.Client(), redisstore.WithClock(clock.Now))
			s := newLockstep(t, clock, map[string]limiter.Limiter{
				"redis":         cached,
				"redis-cluster": clustered,
				"redis-nocache": newTestRedis(t, srv.Client(), redisstore.WithClock(clock.Now), redisstore.WithOverLimitCache(0)),
			})
			rng := rand.New(rand.NewPCG(7, uint64(l.Rate)))
			at := time.Duration(0)
			for range 1500 {
				at += time.Duration(rng.Int64N(int64(40 * ms)))
				if rng.IntN(25) == 0 {
					at -= time.Duration(rng.Int64N(int64(600 * ms)))
				}
				s.check(at, fmt.Sprint("k", rng.IntN(2)), l, 1+rng.Int64N(2))
			}
			if l.Algorithm == limiter.SlidingWindowLog && !l.ForgiveRejected {
				return // rejections are recorded: not for the cache
			}
			if cached.CacheHits() == 0 || clustered.CacheHits() == 0 {
				t.Fatalf("the over-limit cache answered nothing (%d, %d)", cached.CacheHits(), clustered.CacheHits())
			}
			t.Logf("cache hits: %d, %d of 1500", cached.CacheHits(), clustered.CacheHits())
		})
	}
}

// TestRedisSlidingLogLargeRequests pushes more timestamps than one Lua call can
// unpack, and trims the log to its limit.
func TestRedisSlidingLogLargeRequests(t *testing.T) {
	srv := standalone(t)
	for _, forgive := range []bool{false, true} {
		t.Run(fmt.Sprint("forgive=", forgive), func(t *testing.T) {
			clock := newTestClock()
			s := newLockstep(t, clock, map[string]limiter.Limiter{
				"redis": newTestRedis(t, srv.Client(), redisstore.WithClock(clock.Now)),
			})
			l := limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 20000, Period: time.Minute, ForgiveRejected: forgive}
			s.check(0, "k", l, 15000)
			s.check(time.Second, "k", l, 6000)
			s.check(2*time.Second, "k", l, 5000)
			s.check(61*time.Second, "k", l, 19999)
			s.check(62*time.Second, "k", l, 20001)
			s.check(63*time.Second, "k", l, 2)
			s.check(200*time.Second, "k", l, 20000)
		})
	}
}

// TestRedisScriptsReload flushes Redis' script cache between decisions: they must go
// on, with the same results, without falling back.
func TestRedisScriptsReload(t *testing.T) {
	ctx := context.Background()
	targets := []struct {
		name   string
		client redis.UniversalClient
		flush  func() error
	}{
		{"standalone", standalone(t).Client(), func() error { return standalone(t).Client().ScriptFlush(ctx).Err() }},
		{"cluster", cluster(t).Client(), func() error {
			return cluster(t).Client().ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				return m.ScriptFlush(ctx).Err()
			})
		}},
	}
	for _, target := range targets {
		t.Run(target.name, func(t *testing.T) {
			clock := newTestClock()
			s := newLockstep(t, clock, map[string]limiter.Limiter{
				"redis": newTestRedis(t, target.client, redisstore.WithClock(clock.Now)),
			})
			at := time.Duration(0)
			for round := range 4 {
				for _, l := range everyLimit(3, time.Second) {
					for i := range 5 {
						// One key per limit: on a key whose algorithm changes, the memory
						// store starts afresh while Redis keeps each algorithm's state.
						s.check(at, fmt.Sprint(limitName(l), i%2), l, 1)
						at += 100 * ms
					}
				}
				if err := target.flush(); err != nil {
					t.Fatalf("round %d: SCRIPT FLUSH: %v", round, err)
				}
			}
		})
	}
}

// TestRedisKeysHaveTTL checks every key a decision touches: hash-tagged, named after
// the algorithm, and expiring no sooner than the decision's reset. The over-limit cache
// is off: a rejection it answers estimates Redis' time from the moment its request was
// sent, ahead by that request's latency (erring towards allowing), so its reset may
// fall short of the TTL Redis set by as much, which on a busy machine is more than the
// few milliseconds this test allows above reset + grace.
func TestRedisKeysHaveTTL(t *testing.T) {
	srv := standalone(t)
	client := srv.Client()
	ctx := context.Background()
	const grace = 3 * time.Second
	for _, l := range append(everyLimit(3, 2*time.Second), limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour, Burst: 5}) {
		t.Run(limitName(l), func(t *testing.T) {
			prefix := shared.uniquePrefix()
			r := newTestRedis(t, client, redisstore.WithKeyPrefix(prefix), redisstore.WithKeyGrace(grace), redisstore.WithOverLimitCache(0))
			for i := range 4 {
				d := check(t, r, "user:42", l, 2)
				keys, err := client.Keys(ctx, prefix+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				want := 1
				if l.Algorithm == limiter.SlidingWindowLog {
					want = 2
				}
				if len(keys) != want {
					t.Fatalf("decision %d: keys %q, want %d", i, keys, want)
				}
				for _, k := range keys {
					if !strings.HasPrefix(k, prefix+"{user:42}:") {
						t.Errorf("key %q is not hash-tagged by the user's key", k)
					}
					ttl, err := client.PTTL(ctx, k).Result()
					if err != nil {
						t.Fatal(err)
					}
					// The scripts set a TTL a quarter longer than needed, and keep it
					// while it is long enough (see luaStore).
					if most := d.ResetAfter + grace + (d.ResetAfter+grace)/4 + 5*time.Millisecond; ttl <= 0 || ttl < d.ResetAfter.Truncate(time.Millisecond) || ttl > most {
						t.Errorf("decision %d (%+v): key %q has TTL %v, want in [reset, 1.25 (reset+grace)]", i, d, k, ttl)
					}
				}
			}
		})
	}
}

// TestRedisLongestTTL: the longest TTL a script can set, a drain time at
// algo.MaxMicros plus the longest grace (past 2^63 ns, below 2^53 ms), is still an
// integer Redis takes: every decision comes from Redis, and its key lives at least
// as long as its state.
func TestRedisLongestTTL(t *testing.T) {
	srv := standalone(t)
	client := srv.Client()
	ctx := context.Background()
	agelong := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1 << 20}
	for _, l := range append(everyAlgorithm(3, farWindow), agelong) {
		t.Run(limitName(l), func(t *testing.T) {
			prefix := shared.uniquePrefix()
			r := newTestRedis(t, client, redisstore.WithKeyPrefix(prefix),
				redisstore.WithKeyGrace(time.Duration(math.MaxInt64)), redisstore.WithOverLimitCache(0))
			d := check(t, r, "k", l, 2)
			if n := r.Fallbacks(); n != 0 {
				t.Fatalf("%d decisions fell back: Redis refused the TTL", n)
			}
			keys, err := client.Keys(ctx, prefix+"*").Result()
			if err != nil || len(keys) == 0 {
				t.Fatalf("keys %q, %v", keys, err)
			}
			for _, k := range keys {
				// In ms: past 2^63 ns, which go-redis' PTTL would wrap.
				ttl, err := client.Do(ctx, "PTTL", k).Int64()
				if err != nil || ttl < d.ResetAfter.Milliseconds() {
					t.Errorf("key %q: TTL %dms, %v; want at least %v", k, ttl, err, d.ResetAfter)
				}
			}
		})
	}
}

// farWindow is a window so long (about 143 years) that no test runs across one of
// its epoch-aligned boundaries.
const farWindow = time.Duration(1<<52) * time.Microsecond

// TestRedisServerTime runs without an injected clock: the scripts read Redis' TIME.
func TestRedisServerTime(t *testing.T) {
	srv := standalone(t)
	for _, tc := range []struct {
		limit limiter.Limit
		retry time.Duration // most the retry-after can be
	}{
		{limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 3, Period: farWindow}, farWindow},
		{limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour, Burst: 3}, time.Hour},
		{limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 1, Period: time.Hour, Burst: 3}, time.Hour},
		{limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 3, Period: time.Hour}, time.Hour},
		{limiter.Limit{Algorithm: limiter.SlidingWindowLog, Rate: 3, Period: time.Hour, ForgiveRejected: true}, time.Hour},
		{limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 3, Period: farWindow}, 2 * farWindow},
	} {
		t.Run(limitName(tc.limit), func(t *testing.T) {
			r := newTestRedis(t, srv.Client())
			for i := range 3 {
				if d := check(t, r, "k", tc.limit, 1); !d.Allowed || d.Remaining != int64(2-i) {
					t.Fatalf("request %d: %+v, want allowed with %d remaining", i, d, 2-i)
				}
			}
			var prev time.Duration
			for i := range 20 {
				d := check(t, r, "k", tc.limit, 1)
				if d.Allowed || d.Remaining != 0 || d.RetryAfter <= 0 || d.RetryAfter > tc.retry {
					t.Fatalf("request %d over the limit: %+v", i, d)
				}
				if i > 0 && d.RetryAfter > prev && !tc.limit.ForgiveRejected && tc.limit.Algorithm == limiter.SlidingWindowLog {
					continue // rejected timestamps are recorded: the wait may grow
				}
				if i > 0 && d.RetryAfter > prev {
					t.Fatalf("request %d: retry-after grew from %v to %v", i, prev, d.RetryAfter)
				}
				prev = d.RetryAfter
			}
			if tc.limit.Algorithm != limiter.SlidingWindowLog || tc.limit.ForgiveRejected {
				if r.CacheHits() == 0 {
					t.Errorf("no rejection came from the over-limit cache")
				}
			}
		})
	}
}

// TestRedisAwkwardKeys uses keys that are empty or contain braces and tildes, on
// Redis Cluster, where a decision's keys must share a slot.
func TestRedisAwkwardKeys(t *testing.T) {
	c := cluster(t)
	keys := []string{"", "{", "}", "{}", "}{", "a}b", "x{y}z", "~", "~~", "~)", "~~)", "}}", "plain"}
	for _, l := range everyLimit(1, time.Hour) {
		t.Run(limitName(l), func(t *testing.T) {
			r := newTestRedis(t, c.Client(), redisstore.WithClock(newTestClock().Now))
			for round, wantAllowed := range []bool{true, false} {
				for _, k := range keys {
					if d := check(t, r, k, l, 1); d.Allowed != wantAllowed {
						t.Fatalf("round %d, key %q: %+v, want allowed=%v", round, k, d, wantAllowed)
					}
				}
			}
		})
	}
}

// fallbackMetric reads sluice_limiter_fallback_total by mode from reg.
func fallbackMetric(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "sluice_limiter_fallback_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "mode" {
					got[lp.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return got
}

// TestRedisFailureModes decides while Redis is down: each failure mode gives its
// documented decision, and every fallback is counted.
func TestRedisFailureModes(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	srv.Stop()
	reg := prometheus.NewRegistry()
	r, err := redisstore.New(client, redisstore.WithRegisterer(reg), redisstore.WithLogger(testLogger(t)),
		redisstore.WithProbeBackoff(time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	limit := func(mode limiter.FailureMode) limiter.Limit {
		return limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 2, Period: farWindow, FailureMode: mode}
	}
	steps := []struct {
		mode limiter.FailureMode
		n    int64
		want limiter.Decision
	}{
		{limiter.FailOpen, 1, limiter.Decision{Allowed: true, Limit: 2, Remaining: 1}},
		{limiter.FailOpen, 2, limiter.Decision{Allowed: true, Limit: 2, Remaining: 0}},
		{limiter.FailOpen, 5, limiter.Decision{Allowed: true, Limit: 2, Remaining: 0}},
		{limiter.FailClosed, 1, limiter.Decision{Limit: 2, RetryAfter: time.Second, ResetAfter: time.Second}},
		{limiter.FailClosed, 5, limiter.Decision{Limit: 2, RetryAfter: limiter.Never, ResetAfter: time.Second}},
	}
	for i, s := range steps {
		if got := check(t, r, "k-"+string(s.mode), limit(s.mode), s.n); got != s.want {
			t.Errorf("step %d, %s n=%d: got %+v, want %+v", i, s.mode, s.n, got, s.want)
		}
	}
	// local (also the default): an in-process limiter with the same limit.
	for _, mode := range []limiter.FailureMode{limiter.FailLocal, ""} {
		for i, wantAllowed := range []bool{true, true, false} {
			d := check(t, r, "k-local-"+string(mode), limit(mode), 1)
			if d.Allowed != wantAllowed || d.Limit != 2 || d.Remaining != 0 && !wantAllowed {
				t.Errorf("mode %q, request %d: %+v, want allowed=%v", mode, i, d, wantAllowed)
			}
		}
	}
	if got, want := r.Fallbacks(), int64(len(steps)+6); got != want {
		t.Errorf("Fallbacks() = %d, want %d", got, want)
	}
	want := map[string]float64{"open": 3, "closed": 2, "local": 6}
	if got := fallbackMetric(t, reg); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("sluice_limiter_fallback_total = %v, want %v", got, want)
	}
}

// TestRedisOutage stops the Redis server in the middle of a run of decisions and
// starts it again: no decision hangs, fallbacks are counted, and decisions go back to
// Redis once it answers.
func TestRedisOutage(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	reg := prometheus.NewRegistry()
	r, err := redisstore.New(client,
		redisstore.WithKeyPrefix("outage:"),
		// A stopped server refuses connections at once, so the outage needs no short
		// timeout; a long one keeps a busy machine's slow answer from counting as a
		// fallback before the outage or in the stretch after it.
		redisstore.WithTimeout(2*time.Second),
		redisstore.WithProbeBackoff(10*ms, 200*ms),
		redisstore.WithRegisterer(reg),
		redisstore.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1e9, Period: time.Second}

	// Callers run decisions until told to stop; each call must return well before
	// the guard deadline of its context.
	const guard = 5 * time.Second
	var (
		stop      atomic.Bool
		calls     atomic.Int64
		slowest   atomic.Int64
		wg        sync.WaitGroup
		failures  = make(chan string, 8)
		keyOf     = func(g int) string { return fmt.Sprint("caller-", g) }
		recordMax = func(d time.Duration) {
			for {
				old := slowest.Load()
				if int64(d) <= old || slowest.CompareAndSwap(old, int64(d)) {
					return
				}
			}
		}
	)
	for g := range 4 {
		wg.Go(func() {
			for !stop.Load() {
				ctx, cancel := context.WithTimeout(context.Background(), guard)
				start := time.Now()
				d, err := r.AllowN(ctx, keyOf(g), l, 1)
				elapsed := time.Since(start)
				cancel()
				calls.Add(1)
				recordMax(elapsed)
				switch {
				case err != nil:
					failures <- fmt.Sprintf("AllowN: %v", err)
					return
				case elapsed >= guard-time.Second:
					failures <- fmt.Sprintf("AllowN took %v", elapsed)
					return
				case !d.Allowed:
					failures <- fmt.Sprintf("decision %+v, want allowed", d)
					return
				}
			}
		})
	}
	defer func() {
		stop.Store(true)
		wg.Wait()
		close(failures)
		for f := range failures {
			t.Error(f)
		}
		t.Logf("%d decisions; the slowest took %v", calls.Load(), time.Duration(slowest.Load()))
	}()

	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("gave up waiting for %s", what)
			}
			time.Sleep(5 * ms)
		}
	}
	waitFor("decisions on Redis", func() bool { return client.Exists(context.Background(), "outage:{caller-0}:tb").Val() == 1 })
	if n := r.Fallbacks(); n != 0 {
		t.Fatalf("%d fallbacks before the outage", n)
	}

	srv.Stop()
	waitFor("fallbacks", func() bool { return r.Fallbacks() > 100 && r.Down() })
	before := calls.Load()
	waitFor("decisions during the outage", func() bool { return calls.Load() > before+1000 })
	// The callers go on meanwhile: the metric is read between two readings of
	// Fallbacks(), and each caller may have counted one in Fallbacks() only.
	fb1 := r.Fallbacks()
	metric := fallbackMetric(t, reg)["local"]
	fb2 := r.Fallbacks()
	if metric < float64(fb1-4) || metric > float64(fb2) {
		t.Errorf("sluice_limiter_fallback_total{mode=local} = %v, Fallbacks() = %v..%v", metric, fb1, fb2)
	}

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	// The restarted server is empty: a key appears when decisions are on Redis again.
	waitFor("decisions back on Redis", func() bool {
		return !r.Down() && client.Exists(context.Background(), "outage:{caller-0}:tb").Val() == 1
	})
	// And they stay there: a stretch of decisions without a fallback.
	waitFor("a stretch of decisions without fallback", func() bool {
		fb, c := r.Fallbacks(), calls.Load()
		for calls.Load() < c+200 {
			time.Sleep(ms)
		}
		return r.Fallbacks() == fb
	})
}

// TestRedisHungServer freezes Redis: decisions fall back within the timeout instead of
// waiting for it, and return to Redis when it wakes up. With a client that honours
// context deadlines a lone caller calls Redis itself; with one that does not, every
// decision goes through the workers, and callers stop waiting at the timeout.
func TestRedisHungServer(t *testing.T) {
	for _, contextTimeouts := range []bool{true, false} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", contextTimeouts), func(t *testing.T) {
			srv := redistest.Start(t)
			opts := redistest.ClientOptions(srv.Addr())
			opts.ContextTimeoutEnabled = contextTimeouts
			// How long a worker may stay blocked without context deadlines: past the
			// 3s a decision may take below, so that a wait bounded by it, not by the
			// store's timeout, fails the test.
			opts.ReadTimeout = 10 * time.Second
			client := redis.NewClient(opts)
			defer client.Close()
			r, err := redisstore.New(client,
				redisstore.WithTimeout(50*ms),
				redisstore.WithProbeBackoff(10*ms, 100*ms),
				redisstore.WithLogger(testLogger(t)))
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			l := limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1e6, Period: farWindow}
			check(t, r, "k", l, 1)
			if err := srv.Pause(); err != nil {
				t.Fatal(err)
			}
			resumed := false
			defer func() {
				if !resumed {
					srv.Resume()
				}
			}()
			// Long enough for several probes to time out. Concurrent callers hand
			// their decisions to the workers, whose calls the hang blocks too.
			var wg sync.WaitGroup
			for c := range 8 {
				wg.Go(func() {
					for i, start := 0, time.Now(); time.Since(start) < 500*ms; i++ {
						begin := time.Now()
						d, err := r.AllowN(context.Background(), "k", l, 1)
						if elapsed := time.Since(begin); err != nil || elapsed > 3*time.Second || !d.Allowed {
							t.Errorf("caller %d, decision %d while Redis hangs: %+v, %v after %v", c, i, d, err, elapsed)
							return
						}
						time.Sleep(ms)
					}
				})
			}
			wg.Wait()
			if t.Failed() {
				return
			}
			if r.Fallbacks() == 0 || !r.Down() {
				t.Fatalf("Fallbacks() = %d, Down() = %v while Redis hangs", r.Fallbacks(), r.Down())
			}
			srv.Resume()
			resumed = true
			deadline := time.Now().Add(20 * time.Second)
			for r.Down() {
				if time.Now().After(deadline) {
					t.Fatal("Redis still considered down after it woke up")
				}
				time.Sleep(5 * ms)
			}
			// Back on Redis, which has counted the decisions that reached it (memory the
			// others). A busy machine may still miss the 50 ms budget now and then: a
			// decision that does not fall back must come, not the very next one.
			for {
				fb := r.Fallbacks()
				d := check(t, r, "k", l, 1)
				if r.Fallbacks() == fb {
					if !d.Allowed || d.Remaining >= 1e6-1 {
						t.Fatalf("after Redis woke up: %+v", d)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("every decision fell back after Redis woke up")
				}
				time.Sleep(5 * ms)
			}
		})
	}
}

// TestRedisClose: decisions after Close do not hang, and fall back.
func TestRedisClose(t *testing.T) {
	srv := standalone(t)
	r, err := redisstore.New(srv.Client(), redisstore.WithKeyPrefix(shared.uniquePrefix()))
	if err != nil {
		t.Fatal(err)
	}
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: farWindow}
	if d := check(t, r, "k", l, 1); !d.Allowed {
		t.Fatalf("%+v", d)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	r.Close()
	start := time.Now()
	if d := check(t, r, "other", l, 1); !d.Allowed || time.Since(start) > 3*time.Second {
		t.Fatalf("after Close: %+v in %v", d, time.Since(start))
	}
}

// Bad option values are errors, never a panic or a silent default.
func TestNewRefusesBadOptions(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer client.Close()
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_limiter_fallback_total", Help: "not sluice's"}))
	for name, opts := range map[string][]redisstore.Option{
		"braces in the prefix": {redisstore.WithKeyPrefix("a{b}:")},
		"no workers":           {redisstore.WithWorkers(0)},
		"empty batches":        {redisstore.WithBatch(0)},
		"no timeout":           {redisstore.WithTimeout(0)},
		"negative timeout":     {redisstore.WithTimeout(-time.Second)},
		"nil logger":           {redisstore.WithLogger(nil)},
		"clashing registry":    {redisstore.WithRegisterer(clash)},
	} {
		if s, err := redisstore.New(client, opts...); !errors.Is(err, redisstore.ErrInvalidOption) || s != nil {
			t.Errorf("%s: New = %v, %v; want ErrInvalidOption", name, s, err)
		}
	}
	if _, err := redisstore.New(nil); !errors.Is(err, redisstore.ErrInvalidOption) {
		t.Errorf("no client: %v", err)
	}
}
