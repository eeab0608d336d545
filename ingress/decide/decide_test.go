package decide

import (
	"context"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// decideRules: a defer rule that waits an hour once over, a reject rule that waits a
// minute, both reached by one descriptor list each.
const decideRules = `
domain: d
descriptors:
  - key: park
    rate_limit: {unit: hour, requests_per_unit: 1, name: park}
    on_limit: defer
    queue: q
  - key: refuse
    rate_limit: {unit: minute, requests_per_unit: 2, name: refuse}
queues:
  q:
    outflow: {rate: 1/s}
    downstream: http://127.0.0.1:9
`

func decideChecks(t *testing.T) []rules.Check {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "d.yaml", Data: []byte(decideRules)})
	if err != nil {
		t.Fatal(err)
	}
	checks := set.Evaluate("d", [][]rules.Entry{{{Key: "park", Value: "x"}}, {{Key: "refuse", Value: "x"}}}, nil)
	if len(checks) != 2 {
		t.Fatalf("%d checks", len(checks))
	}
	return checks
}

// TestDecideMostRestrictive: over a defer and a reject rule at once, the reject rule
// decides where the entry point can park, though the defer rule waits longer; where
// it can only reject (RejectOnly), the longer wait decides and both count as
// rejected. Hits are charged as given; Results say how each check went.
func TestDecideMostRestrictive(t *testing.T) {
	for _, rejectOnly := range []bool{false, true} {
		now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
		e, err := New(limiter.NewMemory(limiter.WithClock(func() time.Time { return now })))
		if err != nil {
			t.Fatal(err)
		}
		checks := decideChecks(t)
		// The first request takes the defer rule's one and both of the reject
		// rule's: the next is over both.
		first := make([]Result, 2)
		v := e.Decide(context.Background(), &Request{Checks: checks, Hits: []int64{1, 2}, RejectOnly: rejectOnly, Results: first})
		if v.Violated != nil || first[0].Outcome != OutcomeAllowed || first[1].Outcome != OutcomeAllowed || first[1].Closest.Remaining != 0 {
			t.Fatalf("rejectOnly %v, first request: violated %v, results %+v", rejectOnly, v.Violated, first)
		}
		if v.ClosestRule == nil || v.ClosestRule.Name != "park" {
			// Both have none left; the defer rule's window resets later.
			t.Errorf("rejectOnly %v: closest %v, want park", rejectOnly, v.ClosestRule)
		}
		res := make([]Result, 2)
		v = e.Decide(context.Background(), &Request{Checks: checks, RejectOnly: rejectOnly, Results: res})
		wantRule, wantWait, wantPark := "refuse", time.Minute, OutcomeDeferred
		if rejectOnly {
			wantRule, wantWait, wantPark = "park", time.Hour, OutcomeRejected
		}
		if v.Violated == nil || v.Violated.Name != wantRule || v.RetryAfter != wantWait {
			t.Errorf("rejectOnly %v: violated %v after %v, want %s after %v", rejectOnly, v.Violated, v.RetryAfter, wantRule, wantWait)
		}
		if res[0].Outcome != wantPark || res[1].Outcome != OutcomeRejected || !res[0].Over || !res[1].Over {
			t.Errorf("rejectOnly %v: results %+v", rejectOnly, res)
		}
		if len(v.ViolatedNames) != 2 || v.ViolatedNames[0] != "park" || v.ViolatedNames[1] != "refuse" {
			t.Errorf("rejectOnly %v: violated names %v", rejectOnly, v.ViolatedNames)
		}
	}
}

// TestDecideShadow: the engine's shadow mode decides, counts and reports every
// check, and enforces none.
func TestDecideShadow(t *testing.T) {
	e, err := New(limiter.NewMemory(), WithShadow(true))
	if err != nil {
		t.Fatal(err)
	}
	checks := decideChecks(t)
	res := make([]Result, 2)
	for range 3 {
		if v := e.Decide(context.Background(), &Request{Checks: checks, Results: res}); v.Violated != nil || len(v.ViolatedNames) != 0 {
			t.Fatalf("shadow mode enforced %v (%v)", v.Violated, v.ViolatedNames)
		}
	}
	if res[0].Outcome != OutcomeShadowDenied || res[1].Outcome != OutcomeShadowDenied {
		t.Errorf("results after three requests %+v, want both shadow-rejected", res)
	}
}

// TestWaitFallBackCounts: a wait rule whose slot is too far for its max_wait falls
// back to its then: defer, counted deferred where the entry point can park, and
// rejected where it cannot (RejectOnly), as it is then answered.
func TestWaitFallBackCounts(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "w.yaml", Data: []byte(`
domain: w
descriptors:
  - key: pace
    rate_limit: {unit: second, requests_per_unit: 1, name: pace}
    on_limit: wait
    max_wait: 100ms
    then: defer
    queue: q
queues:
  q:
    outflow: {rate: 1/s}
    downstream: http://127.0.0.1:9
`)})
	if err != nil {
		t.Fatal(err)
	}
	for _, rejectOnly := range []bool{false, true} {
		now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
		e, err := New(limiter.NewMemory(limiter.WithClock(func() time.Time { return now })))
		if err != nil {
			t.Fatal(err)
		}
		checks := set.Evaluate("w", [][]rules.Entry{{{Key: "pace", Value: "x"}}}, nil)
		if len(checks) != 1 {
			t.Fatalf("%d checks", len(checks))
		}
		ctx := context.Background()
		for i := range 2 { // the first takes the slot of now; the second's is a second away
			v := e.Decide(ctx, &Request{Checks: checks, Hold: true, RejectOnly: rejectOnly})
			e.Reserve(ctx, checks, &v)
			if fell := v.Violated != nil; fell != (i == 1) {
				t.Fatalf("rejectOnly %v, request %d: violated %v", rejectOnly, i+1, v.Violated)
			}
			if i == 0 && !e.Hold(ctx, &v) { // its slot is now: no wait
				t.Fatal("Hold refused")
			}
		}
		want, other := OutcomeDeferred, OutcomeRejected
		if rejectOnly {
			want, other = other, want
		}
		if got := counted(t, e, "pace", want); got != 1 {
			t.Errorf("rejectOnly %v: %s counted %v, want 1", rejectOnly, want, got)
		}
		if got := counted(t, e, "pace", other); got != 0 {
			t.Errorf("rejectOnly %v: %s counted %v, want 0", rejectOnly, other, got)
		}
	}
}

// counted is what e counted for rule with outcome.
func counted(t *testing.T, e *Engine, rule, outcome string) float64 {
	t.Helper()
	var m dto.Metric
	if err := e.metrics.decisions.WithLabelValues(rule, outcome).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}
