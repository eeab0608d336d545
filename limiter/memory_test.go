package limiter_test

import (
	"context"
	"fmt"
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
