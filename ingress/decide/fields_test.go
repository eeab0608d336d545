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

// fieldsRules: rules whose header fields are written once per rule set (Engine.Use): a
// fixed window, a token bucket with a burst, a leaky bucket without one, two limits on
// one rule, a long name with long values.
const fieldsRules = `
domain: f
descriptors:
  - key: window
    rate_limit: {unit: minute, requests_per_unit: 100, name: per_minute}
  - key: bucket
    rate_limit: {window: 1500ms, requests_per_unit: 1, algorithm: token_bucket, burst: 4, name: bucket}
  - key: leaky
    rate_limit: {unit: hour, requests_per_unit: 7200, algorithm: leaky_bucket, name: leaky}
  - key: two
    name: two
    rate_limits:
      - {unit: second, requests_per_unit: 10}
      - {window: 10m, requests_per_unit: 3, algorithm: sliding_window_counter}
  - key: long
    rate_limit: {unit: second, requests_per_unit: 123456789012, name: a_rule_name_of_more_than_forty_bytes_at_that}
`

// TestFieldsOfTheSetInUse: the header fields of a verdict on the set an engine uses,
// whose limit and policy were written once for the set, are byte for byte those
// FieldsOf writes for the same decision, and what the draft says: the quota is the
// limit's capacity, the window the time to grant it. A decision whose Limit is not the
// capacity (as a limiter could report) gets its own.
func TestFieldsOfTheSetInUse(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "f.yaml", Data: []byte(fieldsRules)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2000, 1, 1, 0, 0, 30, 0, time.UTC)
	e, err := New(limiter.NewMemory(limiter.WithClock(func() time.Time { return now })))
	if err != nil {
		t.Fatal(err)
	}
	e.Use(set)
	for _, tc := range []struct {
		key   string
		limit int   // the index of the closest limit
		quota int64 // the decision's Limit, when not the capacity
		want  Fields
	}{
		{key: "window", want: Fields{Limit: "100", Remaining: "99",
			Policy: `"per_minute";q=100;w=60`, RateLimit: `"per_minute";r=99;t=30`}},
		{key: "bucket", want: Fields{Limit: "4", Remaining: "3",
			Policy: `"bucket";q=4;w=6`, RateLimit: `"bucket";r=3;t=2`}},
		{key: "leaky", want: Fields{Limit: "7200", Remaining: "7199",
			Policy: `"leaky";q=7200;w=3600`, RateLimit: `"leaky";r=7199;t=1`}},
		{key: "two", limit: 1, want: Fields{Limit: "3", Remaining: "2",
			Policy: `"two";q=3;w=600`, RateLimit: `"two";r=2;t=1170`}},
		{key: "long", want: Fields{Limit: "123456789012", Remaining: "123456789011",
			Policy:    `"a_rule_name_of_more_than_forty_bytes_at_that";q=123456789012;w=1`,
			RateLimit: `"a_rule_name_of_more_than_forty_bytes_at_that";r=123456789011;t=1`}},
		{key: "window", quota: 50, want: Fields{Limit: "50", Remaining: "98",
			Policy: `"per_minute";q=50;w=60`, RateLimit: `"per_minute";r=98;t=30`}},
	} {
		checks := set.Evaluate("f", [][]rules.Entry{{{Key: tc.key, Value: "v"}}}, nil)
		if len(checks) != 1 {
			t.Fatalf("%s: %d checks", tc.key, len(checks))
		}
		v := e.Decide(context.Background(), &Request{Checks: checks})
		if v.ClosestRule != checks[0].Rule || v.ClosestLimit != tc.limit {
			t.Fatalf("%s: closest limit %d of %v, want %d", tc.key, v.ClosestLimit, v.ClosestRule, tc.limit)
		}
		if tc.quota != 0 {
			v.Closest.Limit = tc.quota
		}
		if got := v.Fields(); got != tc.want {
			t.Errorf("%s (quota %d): fields %+v, want %+v", tc.key, tc.quota, got, tc.want)
		}
		if got := FieldsOf(v.ClosestRule, v.ClosestLimit, v.Closest); got != tc.want {
			t.Errorf("%s (quota %d): FieldsOf %+v, want %+v", tc.key, tc.quota, got, tc.want)
		}
	}
}

// Both ways of writing the fields allocate once a response: the set in use's, and
// FieldsOf's for a rule outside it (an Envoy override).
func TestFieldsAllocateOnce(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "f.yaml", Data: []byte(fieldsRules)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(limiter.NewMemory())
	if err != nil {
		t.Fatal(err)
	}
	e.Use(set)
	v := e.Decide(context.Background(), &Request{Checks: set.Evaluate("f", [][]rules.Entry{{{Key: "window", Value: "v"}}}, nil)})
	if v.ClosestRule == nil {
		t.Fatal("no closest rule")
	}
	if n := testing.AllocsPerRun(100, func() { _ = v.Fields() }); n > 1 {
		t.Errorf("Fields of the set in use: %v allocations, want 1", n)
	}
	if n := testing.AllocsPerRun(100, func() { _ = FieldsOf(v.ClosestRule, v.ClosestLimit, v.Closest) }); n > 1 {
		t.Errorf("FieldsOf: %v allocations, want 1", n)
	}
}
