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
// on 100k distinct keys. The side-by-side comparison with golang.org/x/time/rate is
// `go run -C cmd/sluice-bench . limiter` (with --rounds 5 on a machine shared with
// other work: it alternates the contenders and reports the median round).
//
//	go test -run '^$' -bench . -benchmem ./limiter/
//
// The limits allow every request, so the figures are the cost of a decision rather
// than of a cheap early rejection, and they keep every key's state live between two
// visits: a key whose state is back to a fresh key's may be dropped by the store and
// created again on its next request, which is key creation, not the steady-state
// decision. BenchmarkMemoryChurn measures that case on its own.

// benchLimit is the limit of alg in a benchmark over keys keys.
func benchLimit(alg limiter.Algorithm, keys int) limiter.Limit {
	switch alg {
	case limiter.TokenBucket, limiter.LeakyBucket:
		// A bucket of 10^12 refilled at 10/s: never empty in any run, and a key visited
		// more often than every 100ms is never back to fresh.
		return limiter.Limit{Algorithm: alg, Rate: 10, Period: time.Second, Burst: 1e12}
	case limiter.SlidingWindowLog:
		// The log keeps a timestamp per request inside the window, so the window must
		// hold fewer requests than the limit: one key sees millions per second, while
		// each of 100k keys is visited every few tens of milliseconds.
		if keys == 1 {
			return limiter.Limit{Algorithm: alg, Rate: 1 << 20, Period: time.Millisecond}
		}
		return limiter.Limit{Algorithm: alg, Rate: 1 << 20, Period: time.Second}
	default:
		return limiter.Limit{Algorithm: alg, Rate: 1e15, Period: time.Second}
	}
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

// keyRand picks benchmark keys at random, as real traffic does: walking them in order
// would let the hardware prefetcher hide the cache misses that dominate with many keys,
// since the store allocated their state in that same order. An xorshift generator
// costs a few nanoseconds.
type keyRand struct{ x uint64 }

func (r *keyRand) next() int {
	if r.x == 0 {
		r.x = 0x9E3779B97F4A7C15
	}
	r.x ^= r.x << 13
	r.x ^= r.x >> 7
	r.x ^= r.x << 17
	return int((r.x >> 32) * uint64(len(benchKeys)) >> 32) // in [0, len) without a division
}

func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	for _, alg := range limiter.Algorithms {
		b.Run(string(alg)+"/1key", func(b *testing.B) {
			l := benchLimit(alg, 1)
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
			l := benchLimit(alg, len(benchKeys))
			m := limiter.NewMemory()
			// Track every key before timing: the first decision on a key allocates
			// its state, which is not the steady state being measured.
			for _, k := range benchKeys {
				if _, err := m.AllowN(ctx, k, l, 1); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			var r keyRand
			for b.Loop() {
				if d, err := m.AllowN(ctx, benchKeys[r.next()], l, 1); err != nil || !d.Allowed {
					b.Fatalf("decision %+v, %v", d, err)
				}
			}
		})
	}
}

// BenchmarkMemoryParallel is the one-key and 100k-key pattern with GOMAXPROCS
// goroutines: one key's state is contended (its slot's lock), and 100k keys' shards
// are shared.
func BenchmarkMemoryParallel(b *testing.B) {
	ctx := context.Background()
	l := benchLimit(limiter.TokenBucket, len(benchKeys))
	for _, l := range []limiter.Limit{l, benchLimit(limiter.FixedWindow, 1), benchLimit(limiter.SlidingWindowCounter, 1)} {
		b.Run(string(l.Algorithm)+"/1key", func(b *testing.B) {
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
	}
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
			r := keyRand{x: uint64(goroutines.Add(1))}
			for pb.Next() {
				if _, err := m.AllowN(ctx, benchKeys[r.next()], l, 1); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

// BenchmarkMemoryChurn is 100k keys whose state is fresh again long before their next
// request (a refill of 10^12/s): the store drops such keys as new ones arrive, to stay
// bounded, so here decisions include creating the key's state again.
func BenchmarkMemoryChurn(b *testing.B) {
	ctx := context.Background()
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1e12, Period: time.Second, Burst: 1e12}
	m := limiter.NewMemory()
	for _, k := range benchKeys {
		if _, err := m.AllowN(ctx, k, l, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	var r keyRand
	for b.Loop() {
		if _, err := m.AllowN(ctx, benchKeys[r.next()], l, 1); err != nil {
			b.Fatal(err)
		}
	}
}
