package decide

import (
	"context"
	"math"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/ratelimitheader"
	"github.com/sluicehq/sluice/rules"
)

// TestRateLimitFieldsReadBack: the RateLimit-Policy and RateLimit every entry point
// writes read back, with the codec the pacing client uses, to the decision they were
// written for, its durations rounded up to whole seconds; a name the fields cannot
// carry leaves both out and the X- fields in.
func TestRateLimitFieldsReadBack(t *testing.T) {
	rule := &rules.Rule{Name: `orders "eu"`, Limits: []limiter.Limit{
		{Algorithm: limiter.FixedWindow, Rate: 100, Period: 90 * time.Second},
		{Algorithm: limiter.TokenBucket, Rate: 1, Period: 1500 * time.Millisecond, Burst: 4},
	}}
	d := limiter.Decision{Limit: 4, Remaining: 2, ResetAfter: 2500 * time.Millisecond}
	f := FieldsOf(rule, 1, d)
	policies, err := ratelimitheader.ParsePolicy(f.Policy)
	// The bucket refills 4 in 6 s.
	if want := []ratelimitheader.Policy{{Name: rule.Name, Quota: 4, Window: 6}}; err != nil || !reflect.DeepEqual(policies, want) {
		t.Errorf("RateLimit-Policy %q: %+v, %v; want %+v", f.Policy, policies, err, want)
	}
	statuses, err := ratelimitheader.ParseRateLimit(f.RateLimit)
	if want := []ratelimitheader.Status{{Name: rule.Name, Remaining: 2, Reset: 3}}; err != nil || !reflect.DeepEqual(statuses, want) {
		t.Errorf("RateLimit %q: %+v, %v; want %+v", f.RateLimit, statuses, err, want)
	}

	bad := &rules.Rule{Name: "café", Limits: rule.Limits}
	if f := FieldsOf(bad, 0, d); f != (Fields{Limit: "4", Remaining: "2"}) {
		t.Errorf("fields of a non-ASCII name: %+v, want only the X- ones", f)
	}
}

func TestRetryAfterSecondsRoundsUpWithoutOverflow(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second:                   0,
		0:                              0,
		1:                              1,
		time.Second:                    1,
		time.Second + 1:                2,
		limiter.Never - 1:              int64(limiter.Never/time.Second) + 1,
		limiter.Never:                  int64(limiter.Never/time.Second) + 1,
		time.Duration(math.MinInt64):   0,
		999_999_999 * time.Millisecond: 1_000_000,
	} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%d) = %d, want %d", d, got, want)
		}
	}
}

// TestRateLimitFieldsOfAnAgelongBucket: a valid bucket that takes longer than a
// time.Duration holds to refill and to drain (1 a day with a burst of 2^20: 2,871
// years) gives the longest times the fields can carry, never a negative or zero one.
func TestRateLimitFieldsOfAnAgelongBucket(t *testing.T) {
	l := limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 1, Period: 24 * time.Hour, Burst: 1 << 20}
	rule := &rules.Rule{Name: "ages", Limits: []limiter.Limit{l}}
	m := limiter.NewMemory()
	ctx := context.Background()
	if d, err := m.AllowN(ctx, "k", l, 1<<20); err != nil || !d.Allowed {
		t.Fatalf("the whole burst: %+v, %v", d, err)
	}
	d, err := m.AllowN(ctx, "k", l, 1<<20)
	if err != nil || d.Allowed {
		t.Fatalf("a second burst: %+v, %v", d, err)
	}
	const longest = int64(math.MaxInt64/time.Second) + 1
	f := FieldsOf(rule, 0, d)
	policies, err := ratelimitheader.ParsePolicy(f.Policy)
	if want := []ratelimitheader.Policy{{Name: "ages", Quota: 1 << 20, Window: longest}}; err != nil || !reflect.DeepEqual(policies, want) {
		t.Errorf("RateLimit-Policy %q: %+v, %v; want %+v", f.Policy, policies, err, want)
	}
	statuses, err := ratelimitheader.ParseRateLimit(f.RateLimit)
	if want := []ratelimitheader.Status{{Name: "ages", Remaining: 0, Reset: longest}}; err != nil || !reflect.DeepEqual(statuses, want) {
		t.Errorf("RateLimit %q: %+v, %v; want %+v", f.RateLimit, statuses, err, want)
	}
}
