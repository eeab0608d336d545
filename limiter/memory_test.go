package limiter_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// t0 is aligned to every whole second.
var t0 = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// check is AllowN, failing t on error. (The conformance suite, in
// limiter/redisstore, checks the memory store's decisions beside Redis'.)
func check(t *testing.T, lim limiter.Limiter, key string, l limiter.Limit, n int64) limiter.Decision {
	t.Helper()
	d, err := lim.AllowN(context.Background(), key, l, n)
	if err != nil {
		t.Fatalf("AllowN(%q, n=%d): %v", key, n, err)
	}
	return d
}

func TestMemoryIsBounded(t *testing.T) {
	const maxKeys = 1000
	m := limiter.NewMemory(limiter.WithClock(func() time.Time { return t0 }), limiter.WithMaxKeys(maxKeys), limiter.WithShards(8))
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Hour}
	for i := range 50 * maxKeys {
		check(t, m, fmt.Sprint("flood-", i), l, 1)
	}
	if n := m.Len(); n > maxKeys {
		t.Fatalf("%d keys tracked, cap %d", n, maxKeys)
	}
	if m.Evictions() == 0 {
		t.Fatal("a flood of keys over the cap evicted nothing")
	}
}

// TestMemoryIsBoundedUnderHotKeys: keys being decided while a new key needs room are
// evicted all the same, so the cap holds while hot keys are hammered.
func TestMemoryIsBoundedUnderHotKeys(t *testing.T) {
	const maxKeys = 2
	m := limiter.NewMemory(limiter.WithClock(func() time.Time { return t0 }), limiter.WithMaxKeys(maxKeys), limiter.WithShards(1))
	l := limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 1e6, Period: time.Hour}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for !stop.Load() {
				_, _ = m.AllowN(context.Background(), fmt.Sprint("hot-", g%maxKeys), l, 1)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	for i := range 20_000 {
		check(t, m, fmt.Sprint("flood-", i), l, 1)
		if n := m.Len(); n > maxKeys {
			t.Fatalf("after %d new keys: %d keys tracked, cap %d", i+1, n, maxKeys)
		}
	}
}

func TestMemoryDropsIdleKeys(t *testing.T) {
	now := t0
	m := limiter.NewMemory(limiter.WithClock(func() time.Time { return now }), limiter.WithShards(1))
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second}
	for i := range 100 {
		check(t, m, fmt.Sprint("idle-", i), l, 1)
	}
	// A tenth of a second later every bucket is full again: the keys are as good as
	// new, and new keys sweep them away without any eviction.
	now = t0.Add(time.Second)
	for i := range 100 {
		check(t, m, fmt.Sprint("new-", i), l, 1)
	}
	if n := m.Len(); n >= 150 {
		t.Fatalf("%d keys tracked: idle keys were not dropped", n)
	}
	if m.Evictions() != 0 {
		t.Fatalf("%d evictions: idle keys should be dropped, not evicted", m.Evictions())
	}
}

// TestMemoryKeepsABucketThatDrainsForAges: a valid bucket that takes longer than
// int64 µs (292,000 years) to drain is not fresh for ages (its drain time saturates
// at 2^53 µs, 285 years), so new keys in its shard must not sweep it away (its drain
// time once overflowed to a negative expiry, and the key's whole burst was granted
// again).
func TestMemoryKeepsABucketThatDrainsForAges(t *testing.T) {
	m := limiter.NewMemory(limiter.WithClock(func() time.Time { return t0 }), limiter.WithShards(1))
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1 << 30}
	if d := check(t, m, "k", l, 1<<30); !d.Allowed {
		t.Fatalf("the whole burst of a new key: %+v", d)
	}
	for i := range 20 {
		check(t, m, fmt.Sprint("new-", i), l, 1)
	}
	if d := check(t, m, "k", l, 1); d.Allowed {
		t.Fatalf("a bucket emptied a moment ago allowed a unit: %+v", d)
	}
}

func TestMemoryDecisionsDoNotAllocate(t *testing.T) {
	m := limiter.NewMemory()
	ctx := context.Background()
	for _, a := range limiter.Algorithms {
		l := limiter.Limit{Algorithm: a, Rate: 1 << 40, Period: time.Second}
		check(t, m, "k", l, 1)
		allocs := testing.AllocsPerRun(1000, func() {
			if _, err := m.AllowN(ctx, "k", l, 1); err != nil {
				t.Fatal(err)
			}
		})
		// The sliding log grows its ring while the log fills; it is bounded by the
		// limit and amortised, far below one allocation per decision.
		if allocs > 0.05 {
			t.Errorf("%s: %.2f allocations per decision", l.Algorithm, allocs)
		}
	}
}

// TestMemoryConcurrentDecisionsAreNotLost has goroutines decide on a few hot keys
// while another floods the same shard with new keys, so that keys are evicted and the
// hot ones shifted back (evicting), or the table grows and every key moves to a new
// one (growing), under the deciders, which look their keys up without the shard's
// lock. Every decision on a hot key must count: none may be made on a stale copy of
// its state, and no hot key may be lost. (The clock stands still, and the hot keys'
// window ends last, so they are never fresh nor the ones evicted.)
func TestMemoryConcurrentDecisionsAreNotLost(t *testing.T) {
	for _, tc := range []struct {
		name                    string
		maxKeys, floods, rounds int
	}{
		// 13/16 of a table of 64 slots: long probe runs, keys off their home slot.
		{"evicting", 52, 20_000, 5},
		// From a table of 64 slots to one of 1024, in each of many stores: a key
		// moves in a few nanoseconds, so it takes many moves to meet a decision.
		{"growing", 1 << 20, 600, 200},
	} {
		// A fixed window and a token bucket: every algorithm is decided under its
		// slot's lock, which whatever moves keys takes.
		for _, a := range []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket} {
			t.Run(tc.name+"/"+string(a), func(t *testing.T) {
				for range tc.rounds {
					testConcurrentDecisions(t, a, tc.maxKeys, tc.floods)
					if t.Failed() {
						return
					}
				}
			})
		}
	}
}

func testConcurrentDecisions(t *testing.T, a limiter.Algorithm, maxKeys, floods int) {
	const (
		hotKeys  = 4
		deciders = 4
		rate     = 1 << 40
	)
	m := limiter.NewMemory(limiter.WithClock(func() time.Time { return t0 }), limiter.WithShards(1), limiter.WithMaxKeys(maxKeys))
	// A bucket of 2^40 that refills once an hour: its remaining count is the
	// window's, on a clock that stands still.
	hot := limiter.Limit{Algorithm: a, Rate: rate, Period: time.Hour}
	if a == limiter.TokenBucket {
		hot = limiter.Limit{Algorithm: a, Rate: 1, Period: time.Hour, Burst: rate}
	}
	// Churn keys' windows end at different times, so that evictions pick them all over
	// the table rather than the first one a sample meets; every other one is a
	// bucket that is full again within a few µs, so that buckets move too.
	churn := func(i int) limiter.Limit {
		if i%2 == 1 {
			return limiter.Limit{Algorithm: limiter.TokenBucket, Rate: rate, Period: time.Duration(1+i%13) * time.Microsecond}
		}
		return limiter.Limit{Algorithm: limiter.FixedWindow, Rate: rate, Period: time.Duration(1+i%13) * time.Microsecond}
	}
	ctx := context.Background()
	// The hot keys arrive in a full table, so that most of them land off their home
	// slot, and backward shifts move them.
	for i := range min(maxKeys, 52) {
		if _, err := m.AllowN(ctx, fmt.Sprint("churn-", i), churn(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	counts := make([][hotKeys]int64, deciders)
	for g := range deciders {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				k := (g + i) % hotKeys
				if d, err := m.AllowN(ctx, hotNames[k], hot, 1); err != nil || !d.Allowed {
					t.Errorf("%s: %+v, %v", hotNames[k], d, err)
					return
				}
				counts[g][k]++
			}
		})
	}
	for i := range floods {
		if _, err := m.AllowN(ctx, fmt.Sprint("churn-", i), churn(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
	if floods > maxKeys && m.Evictions() == 0 {
		t.Error("the flood evicted nothing: the test did not move keys under the deciders")
	}
	if floods < maxKeys && m.Len() < floods {
		t.Errorf("%d keys tracked after a flood of %d: the table did not grow under the deciders", m.Len(), floods)
	}
	for k, key := range hotNames {
		decided := int64(0)
		for g := range deciders {
			decided += counts[g][k]
		}
		if d := check(t, m, key, hot, 1); d.Remaining != rate-decided-1 {
			t.Errorf("%s: remaining %d after %d decisions, want %d (decisions lost or key evicted)", key, d.Remaining, decided, rate-decided-1)
		}
	}
}

var hotNames = [...]string{"hot-0", "hot-1", "hot-2", "hot-3"}

// TestMemoryExpiryDoesNotForgetADecision has goroutines decide on keys whose window
// has just ended, while new keys arriving in their shard sweep away the keys that are
// fresh again. A key's state that a decision has changed is no longer fresh: dropping
// it would forget that decision, and the next one would be allowed again. With a
// limit of one unit per window, exactly one decision per key and window must be
// allowed. (No key is evicted: evicting forgets history by design.) A bucket of one
// that refills in a second is the same limit, decided without the slot's lock.
func TestMemoryExpiryDoesNotForgetADecision(t *testing.T) {
	for _, l := range []limiter.Limit{
		{Algorithm: limiter.FixedWindow, Rate: 1, Period: time.Second},
		{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Second},
	} {
		t.Run(string(l.Algorithm), func(t *testing.T) { testExpiry(t, l) })
	}
}

func testExpiry(t *testing.T, l limiter.Limit) {
	const (
		rounds   = 2000
		hotKeys  = 16
		deciders = 3
		floods   = 24 // new keys per round; last round's are fresh again
	)
	var now atomic.Int64 // µs since t0
	clock := func() time.Time { return t0.Add(time.Duration(now.Load()) * time.Microsecond) }
	m := limiter.NewMemory(limiter.WithClock(clock), limiter.WithShards(1), limiter.WithMaxKeys(1<<20))
	ctx := context.Background()
	var hot [hotKeys]string
	for k := range hot {
		hot[k] = fmt.Sprint("hot-", k)
	}
	var flood [2][floods]string
	for i := range flood {
		for j := range flood[i] {
			flood[i][j] = fmt.Sprint("flood-", i, "-", j)
		}
	}
	for r := range rounds {
		// Every key's window ended as the round begins. The flood alternates between
		// two sets of keys: the other set, last round's, is fresh again.
		now.Store(int64(r) * time.Second.Microseconds())
		var start, wg sync.WaitGroup
		start.Add(1)
		var allowed [hotKeys]atomic.Int64
		for g := range deciders {
			wg.Go(func() {
				start.Wait()
				// Each decider takes the keys in its own order, so that the first
				// decision on each key, the one that makes it no longer fresh, meets
				// the sweep at a different point of it.
				for i := range 2 * hotKeys {
					k := (r + g*5 + i) % hotKeys
					d, err := m.AllowN(ctx, hot[k], l, 1)
					if err != nil {
						t.Error(err)
						return
					}
					if d.Allowed {
						allowed[k].Add(1)
					}
				}
			})
		}
		wg.Go(func() {
			start.Wait()
			for _, key := range flood[r%2] {
				if _, err := m.AllowN(ctx, key, l, 1); err != nil {
					t.Error(err)
					return
				}
			}
		})
		start.Done()
		wg.Wait()
		for k := range allowed {
			if n := allowed[k].Load(); n != 1 {
				t.Fatalf("round %d: %s: %d of %d decisions allowed in one window of a limit of 1", r, hot[k], n, 2*deciders)
			}
		}
	}
	if m.Evictions() != 0 {
		t.Fatalf("%d evictions: the test means keys to be dropped as fresh, not evicted", m.Evictions())
	}
}
