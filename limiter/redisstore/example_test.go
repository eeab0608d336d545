package redisstore_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// The same limit shared by every replica through Redis: one round trip per decision,
// on Redis server time. If Redis fails, each rule's failure mode decides (by default
// an in-process limiter takes over until Redis answers again). It needs a Redis
// server, so it has no checked output.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	store, err := redisstore.New(client)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer store.Close()

	limit := limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 100, Period: time.Minute}
	d, err := store.AllowN(context.Background(), "api:key-7f3a", limit, 1)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(d.Allowed, d.Remaining)
}
