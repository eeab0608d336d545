package limiter_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func TestMemoryIsBounded(t *testing.T) {
	const maxKeys = 1000
	clock := newTestClock()
	m := limiter.NewMemory(limiter.WithClock(clock.Now), limiter.WithMaxKeys(maxKeys), limiter.WithShards(8))
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
	clock := newTestClock()
	m := limiter.NewMemory(limiter.WithClock(clock.Now), limiter.WithShards(1))
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 10, Period: time.Second}
	for i := range 100 {
		check(t, m, fmt.Sprint("idle-", i), l, 1)
	}
	// A tenth of a second later every bucket is full again: the keys are as good as
	// new, and new keys sweep them away without any eviction.
	clock.Set(time.Second)
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
	for _, l := range everyAlgorithm(1<<40, time.Second) {
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
