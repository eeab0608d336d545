package limiter_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// A token bucket of 3 that refills 2 tokens a second, on the in-process store. The
// clock is injected so that the output is exact; by default the store reads time.Now.
func ExampleNewMemory() {
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)
	store := limiter.NewMemory(limiter.WithClock(func() time.Time { return now }))
	limit := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Second, Burst: 3}
	ctx := context.Background()

	for i := 1; i <= 4; i++ {
		d, err := store.AllowN(ctx, "orders:user-42", limit, 1)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("request %d: allowed=%t remaining=%d retry after %v\n", i, d.Allowed, d.Remaining, d.RetryAfter)
	}
	now = now.Add(500 * time.Millisecond) // one token back
	d, _ := store.AllowN(ctx, "orders:user-42", limit, 1)
	fmt.Printf("after 500ms: allowed=%t remaining=%d\n", d.Allowed, d.Remaining)
	// Output:
	// request 1: allowed=true remaining=2 retry after 0s
	// request 2: allowed=true remaining=1 retry after 0s
	// request 3: allowed=true remaining=0 retry after 0s
	// request 4: allowed=false remaining=0 retry after 500ms
	// after 500ms: allowed=true remaining=0
}
