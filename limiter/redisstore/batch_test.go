package redisstore_test

import (
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// TestRedisMergedDecisions has many callers share one worker, so that the store
// merges their decisions into multi-key scripts, on keys of three algorithms, one of
// which holds a value of the wrong type: every decision on the good keys must be
// exact, and only the bad key's decisions may fall back.
func TestRedisMergedDecisions(t *testing.T) {
	srv := standalone(t)
	ctx := context.Background()
	clock := newTestClock() // stopped: each key allows exactly its capacity
	prefix := shared.uniquePrefix()
	r, err := redisstore.New(srv.Client(), redisstore.WithKeyPrefix(prefix), redisstore.WithWorkers(1),
		redisstore.WithTimeout(5*time.Second), redisstore.WithClock(clock.Now),
		redisstore.WithOverLimitCache(0), // every decision goes to Redis
		redisstore.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	const capacity, callers, perCaller = 20, 32, 63
	limits := []limiter.Limit{
		{Algorithm: limiter.FixedWindow, Rate: capacity, Period: time.Hour},
		{Algorithm: limiter.TokenBucket, Rate: capacity, Period: time.Hour},
		{Algorithm: limiter.SlidingWindowLog, Rate: capacity, Period: time.Hour},
	}
	const keys = 9 // k0…k8, k(i) under limits[i%3]; k4 is the bad one
	const perKey = callers * perCaller / keys
	if err := srv.Client().LPush(ctx, prefix+"{k4}:tb", "not a bucket").Err(); err != nil {
		t.Fatal(err)
	}
	evalshas := func() int64 {
		for line := range strings.Lines(srv.Client().Info(ctx, "commandstats").Val()) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
				return n
			}
		}
		return 0
	}
	before := evalshas()

	var allowed [keys]atomic.Int64
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			for i := range perCaller {
				k := (c + i) % keys
				d, err := r.AllowN(ctx, "k"+strconv.Itoa(k), limits[k%3], 1)
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
	wg.Wait()

	for k := range keys {
		if got := allowed[k].Load(); got != capacity {
			t.Errorf("k%d (%s): %d of %d requests allowed, want %d", k, limits[k%3].Algorithm, got, perKey, capacity)
		}
	}
	// The bad key's decisions fall back to memory (the default failure mode), which
	// allows as many; no other decision does.
	if got := r.Fallbacks(); got != perKey {
		t.Errorf("%d decisions fell back, want the bad key's %d", got, perKey)
	}
	if n, total := evalshas()-before, int64(callers*perCaller); n >= total {
		t.Errorf("%d EVALSHAs for %d decisions: none were merged", n, total)
	} else {
		t.Logf("%d EVALSHAs for %d decisions", n, total)
	}
	if v, err := srv.Client().LRange(ctx, prefix+"{k4}:tb", 0, -1).Result(); err != nil || len(v) != 1 {
		t.Errorf("the bad key was changed: %q, %v", v, err)
	}
}
