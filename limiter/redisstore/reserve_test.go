package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
)

// reserveStep is one call of the reservation conformance case: a reservation (cancel
// < 0) or the cancel of the reservation made at step cancel.
type reserveStep struct {
	at     time.Duration
	cancel int
	want   limiter.Reservation // Slot: as an offset from t0
}

// TestReserveConformance runs the waiting rules' leaking bucket on every store on the
// injected clock: slots one interval apart, each reservation the next free one, a
// refusal past the longest wait that changes nothing, a cancel that frees the latest
// slot and skips any other, a clock that steps back granting nothing, and a key that
// is fresh again once its slots have passed.
func TestReserveConformance(t *testing.T) {
	pace := limiter.Pace{Interval: 100 * ms, MaxWait: 250 * ms}
	ok := func(wait, remaining int64, reset, slot time.Duration) limiter.Reservation {
		return limiter.Reservation{OK: true, Wait: time.Duration(wait) * ms, Remaining: remaining, ResetAfter: reset, Slot: int64(slot / time.Microsecond)}
	}
	refused := func(wait int64, remaining int64, reset, slot time.Duration) limiter.Reservation {
		r := ok(wait, remaining, reset, slot)
		r.OK = false
		return r
	}
	steps := []reserveStep{
		0: {0, -1, ok(0, 2, 100*ms, 100*ms)},
		1: {0, -1, ok(100, 1, 200*ms, 200*ms)},
		2: {0, -1, ok(200, 0, 300*ms, 300*ms)},
		3: {0, -1, refused(300, 0, 300*ms, 300*ms)},
		4: {0, 2, ok(0, 1, 200*ms, 200*ms)}, // the latest slot goes back
		5: {0, -1, ok(200, 0, 300*ms, 300*ms)},
		6: {0, 0, ok(0, 0, 300*ms, 300*ms)}, // not the latest: skipped
		7: {0, -1, refused(300, 0, 300*ms, 300*ms)},
		8: {50 * ms, -1, ok(250, 0, 350*ms, 400*ms)},
		// Back to 10ms: read as 50ms, the latest time the key has seen.
		9:  {10 * ms, -1, refused(350, 0, 350*ms, 400*ms)},
		10: {time.Second, -1, ok(0, 2, 100*ms, 1100*ms)},
	}
	for _, store := range stores(t) {
		t.Run(store.name, func(t *testing.T) {
			clock := newTestClock()
			res := store.new(t, clock).(limiter.Reserver)
			ctx := context.Background()
			made := make([]limiter.Reservation, len(steps))
			for i, s := range steps {
				clock.Set(s.at)
				if s.cancel >= 0 {
					// What a cancel leaves, the next reservation shows.
					if err := res.Cancel(ctx, "r", pace, made[s.cancel]); err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					continue
				}
				got, err := res.Reserve(ctx, "r", pace)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				made[i] = got
				want := s.want
				want.Slot += t0.UnixMicro()
				if got != want {
					t.Fatalf("step %d (at %v):\n got %+v\nwant %+v", i, s.at, got, want)
				}
			}
			if r, err := res.Reserve(ctx, "other", pace); err != nil || !r.OK || r.Wait != 0 {
				t.Fatalf("another key: %+v, %v; want its first slot now", r, err)
			}
			if r, err := res.Reserve(ctx, "bad", limiter.Pace{}); err == nil {
				t.Fatalf("a zero pace reserved %+v", r)
			}
		})
	}
}

// TestReserveConcurrentCallersGetDistinctSlots: callers racing on one key each get
// their own slot, one interval apart, and no more than the longest wait allows.
func TestReserveConcurrentCallersGetDistinctSlots(t *testing.T) {
	pace := limiter.Pace{Interval: 10 * ms, MaxWait: 195 * ms}
	for _, store := range stores(t) {
		t.Run(store.name, func(t *testing.T) {
			res := store.new(t, newTestClock()).(limiter.Reserver)
			var mu sync.Mutex
			waits := map[time.Duration]int{}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					for range 10 {
						r, err := res.Reserve(context.Background(), "hot", pace)
						if err != nil {
							t.Error(err)
							return
						}
						if r.OK {
							mu.Lock()
							waits[r.Wait]++
							mu.Unlock()
						}
					}
				})
			}
			wg.Wait()
			if len(waits) != 20 {
				t.Fatalf("%d slots reserved, want 20 (0 to 190ms): %v", len(waits), waits)
			}
			for w, n := range waits {
				if n != 1 || w%(10*ms) != 0 || w > pace.MaxWait {
					t.Fatalf("wait %v given %d times: %v", w, n, waits)
				}
			}
		})
	}
}

// TestRedisReserveServerTimeAndTTL: without an injected clock the slots run on the
// Redis server's TIME (a second reservation waits at most one interval), and the
// bucket's key is hash-tagged by the caller's key and expires once its slots have
// passed (TTL at most the time until them plus the grace).
func TestRedisReserveServerTimeAndTTL(t *testing.T) {
	srv := standalone(t)
	client := srv.Client()
	prefix := shared.uniquePrefix()
	const grace = 2 * time.Second
	r := newTestRedis(t, client, redisstore.WithKeyPrefix(prefix), redisstore.WithKeyGrace(grace))
	ctx := context.Background()
	pace := limiter.Pace{Interval: time.Minute, MaxWait: time.Hour}
	first, err := r.Reserve(ctx, "acct:7}", pace)
	if err != nil || !first.OK || first.Wait != 0 {
		t.Fatalf("first reservation %+v, %v", first, err)
	}
	second, err := r.Reserve(ctx, "acct:7}", pace)
	if err != nil || !second.OK || second.Wait <= 0 || second.Wait > time.Minute {
		t.Fatalf("second reservation %+v, %v: want a wait in (0, 1m]", second, err)
	}
	keys, err := client.Keys(ctx, prefix+"*").Result()
	if err != nil || len(keys) != 1 || keys[0] != prefix+"{~acct:7~)}:rsv" {
		t.Fatalf("keys %q, %v", keys, err)
	}
	ttl, err := client.PTTL(ctx, keys[0]).Result()
	if err != nil || ttl <= second.ResetAfter-time.Second || ttl > second.ResetAfter+grace+time.Second {
		t.Fatalf("TTL %v (%v), want about %v plus the grace", ttl, err, second.ResetAfter)
	}
	if err := r.Cancel(ctx, "acct:7}", pace, second); err != nil {
		t.Fatal(err)
	}
	third, err := r.Reserve(ctx, "acct:7}", pace)
	if err != nil || third.Slot != second.Slot {
		t.Fatalf("after the latest reservation was cancelled, the next one got %+v, %v; want its slot %d", third, err, second.Slot)
	}
}

// TestRedisReserveFailureModes: with Redis gone a reservation follows the pace's
// failure mode, never hangs, and is counted as a fallback; a local reservation is
// given back to the in-process store.
func TestRedisReserveFailureModes(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client()
	srv.Stop()
	r, err := redisstore.New(client, redisstore.WithLogger(testLogger(t)), redisstore.WithProbeBackoff(time.Hour, time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx := context.Background()
	pace := func(mode limiter.FailureMode) limiter.Pace {
		return limiter.Pace{Interval: time.Hour, MaxWait: 90 * time.Minute, FailureMode: mode}
	}
	if got, err := r.Reserve(ctx, "k", pace(limiter.FailOpen)); err != nil || !got.OK || got.Wait != 0 {
		t.Errorf("open: %+v, %v; want a slot now", got, err)
	}
	if got, err := r.Reserve(ctx, "k", pace(limiter.FailClosed)); err != nil || got.OK || got.RetryAfter(pace(limiter.FailClosed)) != time.Second {
		t.Errorf("closed: %+v, %v; want refused, retry in 1s", got, err)
	}
	first, _ := r.Reserve(ctx, "local", pace(""))
	second, _ := r.Reserve(ctx, "local", pace(""))
	nearHour := func(d time.Duration) bool { return d > time.Hour-time.Minute && d <= time.Hour }
	if !first.OK || first.Wait != 0 || !second.OK || !nearHour(second.Wait) {
		t.Fatalf("local: %+v then %+v; want slots now and in an hour", first, second)
	}
	if err := r.Cancel(ctx, "local", pace(""), second); err != nil {
		t.Fatal(err)
	}
	if again, _ := r.Reserve(ctx, "local", pace("")); !again.OK || !nearHour(again.Wait) {
		t.Errorf("after the local cancel: %+v; want the freed slot in an hour", again)
	}
	if got := r.Fallbacks(); got != 5 {
		t.Errorf("Fallbacks() = %d, want 5", got)
	}
}

// TestReserveTimesSaturate: a long pace's times exceed a time.Duration; they
// saturate at the longest one on every store, never wrap to a negative one. (Its
// slots stay exact in Redis' doubles: t0 in µs is even, and past 2^53 doubles are.)
func TestReserveTimesSaturate(t *testing.T) {
	const interval = (1 << 52) * time.Microsecond
	pace := limiter.Pace{Interval: interval, MaxWait: maxPeriod}
	for _, store := range stores(t) {
		t.Run(store.name, func(t *testing.T) {
			res := store.new(t, newTestClock()).(limiter.Reserver)
			ctx := context.Background()
			want := []limiter.Reservation{
				{OK: true, Remaining: 1, ResetAfter: interval, Slot: t0.UnixMicro() + 1<<52},
				{OK: true, Wait: interval, ResetAfter: longest, Slot: t0.UnixMicro() + 1<<53},
				{Wait: longest, ResetAfter: longest, Slot: t0.UnixMicro() + 1<<53},
			}
			for i, w := range want {
				got, err := res.Reserve(ctx, "r", pace)
				if err != nil {
					t.Fatal(err)
				}
				if got != w {
					t.Fatalf("reservation %d:\n got %+v\nwant %+v", i, got, w)
				}
			}
		})
	}
}
