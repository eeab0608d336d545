package redisstore_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// Benchmarks of the Redis store against a real local redis-server, with 1, 16 and 64
// concurrent callers. The side-by-side comparison with github.com/go-redis/redis_rate
// on the same server is `sluice-bench limiter` (cmd/sluice-bench, a module of its own
// so that the library's users do not inherit its peers):
//
//	go test -run '^$' -bench 'Redis' -benchmem ./limiter/
//
// On a busy machine, compare runs made at the same time: -count and interleaving help.
//
// "allowed" spreads decisions over 10k keys under a limit that allows all of them, so
// each costs a script run in Redis; "over-limit" hammers one key far over its limit,
// which the over-limit cache answers in-process.

var benchCallers = []int{1, 16, 64}

// runCallers runs b.N calls of fn spread over callers goroutines and reports
// decisions per second.
func runCallers(b *testing.B, callers int, fn func(i int64)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for range callers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				fn(i)
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "decisions/s")
}

var redisBenchKeys = func() []string {
	keys := make([]string, 10_000)
	for i := range keys {
		keys[i] = "bench-" + strconv.Itoa(i)
	}
	return keys
}()

func BenchmarkRedis(b *testing.B) {
	srv := shared.server(b)
	if srv == nil {
		b.Skip("redis-server not installed")
	}
	ctx := context.Background()
	allowAll := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1e12, Period: time.Second}
	overLimit := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: time.Hour}
	for _, callers := range benchCallers {
		b.Run("allowed/callers="+strconv.Itoa(callers), func(b *testing.B) {
			r, err := redisstore.New(srv.Client(), redisstore.WithKeyPrefix(shared.uniquePrefix()), redisstore.WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			runCallers(b, callers, func(i int64) {
				if d, _ := r.AllowN(ctx, redisBenchKeys[i%int64(len(redisBenchKeys))], allowAll, 1); !d.Allowed {
					b.Fatalf("denied: %+v", d)
				}
			})
			if n := r.Fallbacks(); n > 0 {
				b.Logf("%d fallbacks", n)
			}
		})
	}
	for _, callers := range benchCallers {
		b.Run("over-limit/callers="+strconv.Itoa(callers), func(b *testing.B) {
			r, err := redisstore.New(srv.Client(), redisstore.WithKeyPrefix(shared.uniquePrefix()), redisstore.WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			runCallers(b, callers, func(i int64) { _, _ = r.AllowN(ctx, "hot", overLimit, 1) })
		})
	}
}

// BenchmarkRedisCluster: the same on the 3-master Cluster (all on this machine).
func BenchmarkRedisCluster(b *testing.B) {
	c := shared.clusterOf(b)
	if c == nil {
		b.Skip("redis-server not installed")
	}
	ctx := context.Background()
	allowAll := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1e12, Period: time.Second}
	for _, callers := range benchCallers {
		b.Run("allowed/callers="+strconv.Itoa(callers), func(b *testing.B) {
			r, err := redisstore.New(c.Client(), redisstore.WithKeyPrefix(shared.uniquePrefix()), redisstore.WithTimeout(time.Second))
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close()
			runCallers(b, callers, func(i int64) {
				if d, _ := r.AllowN(ctx, redisBenchKeys[i%int64(len(redisBenchKeys))], allowAll, 1); !d.Allowed {
					b.Fatalf("denied: %+v", d)
				}
			})
		})
	}
}
