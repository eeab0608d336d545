package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

var errorsIs = errors.Is

// stores lists the stores the conformance suite runs on: memory, and Redis on a real
// standalone server and a real 3-master Cluster (shared by the test binary, each
// store with its own key prefix). Without redis-server the Redis stores are left out
// (the test fails instead when CI is set).
func stores(t *testing.T) []storeFactory {
	t.Helper()
	all := []storeFactory{
		{"memory", func(t *testing.T, clock *testClock) limiter.Limiter {
			return limiter.NewMemory(limiter.WithClock(clock.Now))
		}},
	}
	if srv := shared.server(t); srv != nil {
		all = append(all, storeFactory{"redis", func(t *testing.T, clock *testClock) limiter.Limiter {
			return newTestRedis(t, srv.Client(), redisstore.WithClock(clock.Now))
		}})
	}
	if c := shared.clusterOf(t); c != nil {
		all = append(all, storeFactory{"redis-cluster", func(t *testing.T, clock *testClock) limiter.Limiter {
			return newTestRedis(t, c.Client(), redisstore.WithClock(clock.Now))
		}})
	}
	return all
}

// newTestRedis returns a Redis store with a key prefix of its own, closed when t ends.
// Its timeout is generous: a slow test machine must not turn decisions into fallbacks.
func newTestRedis(t testing.TB, client redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	t.Helper()
	opts = append([]redisstore.Option{
		redisstore.WithKeyPrefix(shared.uniquePrefix()),
		redisstore.WithTimeout(5 * time.Second),
	}, opts...)
	r, err := redisstore.New(client, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.Close()
		if n := r.Fallbacks(); n > 0 {
			t.Errorf("%d decisions fell back from Redis", n)
		}
	})
	return r
}
