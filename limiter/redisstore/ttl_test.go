package redisstore_test

import (
	"context"
	"encoding/binary"
	"math"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// TestRedisKeepsALongEnoughTTL: on the server's clock, a decision whose key needs no
// later deadline than the one its TTL was last set to leaves the TTL as it is
// (KEEPTTL), and every key lives at least as long as its state needs (resetAfter
// plus the grace). Run by one caller (one-decision scripts) and by 16 callers
// sharing one worker (merged scripts), each caller on a key of its own.
func TestRedisKeepsALongEnoughTTL(t *testing.T) {
	srv := standalone(t)
	client := srv.Client()
	ctx := context.Background()
	const grace = 2 * time.Second
	type step struct {
		n    int64
		kept bool // the TTL must not have grown since the step before
	}
	bucket := []step{
		{n: 40},              // resetAfter 24 min: the TTL is set to 1.25 × (24 min + grace)
		{n: 1, kept: true},   // 24.6 min: still within it
		{n: 1, kept: true},   // 25.2 min
		{n: 50, kept: false}, // 55.2 min: past it, the TTL is set again
	}
	window := []step{{n: 1}, {n: 1, kept: true}, {n: 3, kept: true}}
	cases := []struct {
		limit limiter.Limit
		steps []step
	}{
		{limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Hour}, bucket},
		{limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 100, Period: time.Hour}, bucket},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 10, Period: time.Hour}, window},
		{limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 10, Period: time.Hour}, window},
	}
	for _, run := range []struct {
		name    string
		callers int
	}{{"alone", 1}, {"merged", 16}} {
		for _, c := range cases {
			t.Run(run.name+"/"+limitName(c.limit), func(t *testing.T) {
				prefix := shared.uniquePrefix()
				r := newTestRedis(t, client, redisstore.WithKeyPrefix(prefix), redisstore.WithKeyGrace(grace),
					redisstore.WithWorkers(1), redisstore.WithOverLimitCache(0))
				var wg sync.WaitGroup
				for caller := range run.callers {
					wg.Go(func() {
						key := "user:" + strconv.Itoa(caller)
						rkey := prefix + "{" + key + "}:" + suffixOf(c.limit.Algorithm)
						var used int64
						var before time.Duration
						for i, s := range c.steps {
							start := time.Now()
							d, err := r.AllowN(ctx, key, c.limit, s.n)
							if err != nil {
								t.Error(err)
								return
							}
							ttl, err := client.PTTL(ctx, rkey).Result()
							took := time.Since(start)
							if err != nil {
								t.Error(err)
								return
							}
							used += s.n
							if !d.Allowed || d.Remaining != c.limit.Capacity()-used {
								t.Errorf("%s step %d: %+v, want allowed with %d remaining", key, i, d, c.limit.Capacity()-used)
							}
							// What the key needs from the decision on; PTTL was read
							// up to took after it.
							if need := d.ResetAfter + grace - took - time.Millisecond; ttl < need {
								t.Errorf("%s step %d (%+v): TTL %v, shorter than resetAfter + grace (less %v)", key, i, d, ttl, took)
							}
							if s.kept && ttl > before {
								t.Errorf("%s step %d (%+v): TTL %v grew from %v: it was set again", key, i, d, ttl, before)
							}
							before = ttl
						}
					})
				}
				wg.Wait()
			})
		}
	}
}

// TestRedisReadsTheEarlierLayout: keys written before the scripts recorded their
// TTL's deadline (a bucket's '<dd', a fixed window's '<ddd', a sliding counter's
// '<dddd') are read as they were, and decided on exactly. Each key's latest time seen
// lies an hour ahead, so the decision is made at that time, on the state as written.
func TestRedisReadsTheEarlierLayout(t *testing.T) {
	srv := standalone(t)
	client := srv.Client()
	ctx := context.Background()
	ahead := float64(time.Now().Add(time.Hour).UnixMicro())
	hour := float64(time.Hour.Microseconds())
	start := ahead - math.Mod(ahead, hour)
	cases := []struct {
		limit     limiter.Limit
		state     []float64
		remaining int64 // after a request of 1
	}{
		{limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 100, Period: time.Hour}, []float64{ahead, 30}, 69},
		{limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: 100, Period: time.Hour}, []float64{ahead, 30}, 69},
		{limiter.Limit{Algorithm: limiter.FixedWindow, Rate: 10, Period: time.Hour}, []float64{ahead, start, 4}, 5},
		{limiter.Limit{Algorithm: limiter.SlidingWindowCounter, Rate: 10, Period: time.Hour}, []float64{ahead, start, 3, 0}, 6},
	}
	for _, c := range cases {
		t.Run(limitName(c.limit), func(t *testing.T) {
			prefix := shared.uniquePrefix()
			r := newTestRedis(t, client, redisstore.WithKeyPrefix(prefix), redisstore.WithOverLimitCache(0))
			var v []byte
			for _, f := range c.state {
				v = binary.LittleEndian.AppendUint64(v, math.Float64bits(f))
			}
			if err := client.Set(ctx, prefix+"{k}:"+suffixOf(c.limit.Algorithm), v, time.Hour).Err(); err != nil {
				t.Fatal(err)
			}
			d := check(t, r, "k", c.limit, 1)
			if !d.Allowed || d.Remaining != c.remaining {
				t.Errorf("%+v, want allowed with %d remaining", d, c.remaining)
			}
		})
	}
}

// suffixOf is the end of the Redis key of algorithm a (see Store).
func suffixOf(a limiter.Algorithm) string {
	switch a {
	case limiter.TokenBucket:
		return "tb"
	case limiter.LeakyBucket:
		return "lb"
	case limiter.FixedWindow:
		return "fw"
	case limiter.SlidingWindowLog:
		return "swl"
	default:
		return "swc"
	}
}
