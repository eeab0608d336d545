package limiter_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Benchmarks of the memory store's decision path, for every algorithm, on one key and
// on 100k distinct keys. The limits are high enough that every request is allowed, so
// the figures are the cost of a decision rather than of a cheap early rejection. The
// side-by-side comparison with golang.org/x/time/rate is `go run ./cmd/sluice-bench limiter`.
//
//	go test -run '^$' -bench . -benchmem ./limiter/

// benchLimits allows everything at any speed a benchmark reaches. The sliding window
// log keeps one timestamp per allowed request inside the window, so its window is
// short: one millisecond holds far fewer requests than its limit.
var benchLimits = map[limiter.Algorithm]limiter.Limit{
	limiter.TokenBucket:          {Algorithm: limiter.TokenBucket, Rate: 1e12, Period: time.Second, Burst: 1e12},
	limiter.LeakyBucket:          {Algorithm: limiter.LeakyBucket, Rate: 1e12, Period: time.Second, Burst: 1e12},
	limiter.FixedWindow:          {Algorithm: limiter.FixedWindow, Rate: 1e15, Period: time.Second},
	limiter.SlidingWindowLog:     {Algorithm: limiter.SlidingWindowLog, Rate: 1 << 20, Period: time.Millisecond},
	limiter.SlidingWindowCounter: {Algorithm: limiter.SlidingWindowCounter, Rate: 1e15, Period: time.Second},
}

// benchKeys are built once, outside every timed loop, so the benchmarks measure
// decisions and not string building.
var benchKeys = func() []string {
	keys := make([]string, 100_000)
	for i := range keys {
		keys[i] = "bench:user-" + strconv.Itoa(i)
	}
	return keys
}()

func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	for _, alg := range limiter.Algorithms {
		l := benchLimits[alg]
		b.Run(string(alg)+"/1key", func(b *testing.B) {
			m := limiter.NewMemory()
			key := benchKeys[0]
			b.ReportAllocs()
			for b.Loop() {
				if d, err := m.AllowN(ctx, key, l, 1); err != nil || !d.Allowed {
					b.Fatalf("decision %+v, %v", d, err)
				}
			}
		})
		b.Run(string(alg)+"/100kkeys", func(b *testing.B) {
			m := limiter.NewMemory()
			// Track every key before timing: the first decision on a key allocates
			// its state, which is not the steady state being measured.
			for _, k := range benchKeys {
				if _, err := m.AllowN(ctx, k, l, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if d, err := m.AllowN(ctx, benchKeys[i], l, 1); err != nil || !d.Allowed {
					b.Fatalf("decision %+v, %v", d, err)
				}
				if i++; i == len(benchKeys) {
					i = 0
				}
			}
		})
	}
}

// BenchmarkMemoryParallel is the one-key and 100k-key pattern with GOMAXPROCS
// goroutines, where shard locks are contended.
func BenchmarkMemoryParallel(b *testing.B) {
	ctx := context.Background()
	l := benchLimits[limiter.TokenBucket]
	b.Run("token_bucket/1key", func(b *testing.B) {
		m := limiter.NewMemory()
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := m.AllowN(ctx, benchKeys[0], l, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("token_bucket/100kkeys", func(b *testing.B) {
		m := limiter.NewMemory()
		for _, k := range benchKeys {
			if _, err := m.AllowN(ctx, k, l, 1); err != nil {
				b.Fatal(err)
			}
		}
		var goroutines atomic.Int64
		b.ReportAllocs()
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			// Each goroutine starts elsewhere in the keys, so they do not walk the
			// same shards in lockstep.
			i := int(goroutines.Add(1)*7919) % len(benchKeys)
			for pb.Next() {
				if _, err := m.AllowN(ctx, benchKeys[i], l, 1); err != nil {
					b.Error(err)
					return
				}
				if i++; i == len(benchKeys) {
					i = 0
				}
			}
		})
	})
}
