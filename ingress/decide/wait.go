package decide

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// cancelTimeout bounds giving back the reservation of a client that went away.
const cancelTimeout = time.Second

// held is one reservation of a wait rule for a request.
type held struct {
	check *rules.Check
	pace  limiter.Pace
	res   limiter.Reservation
	count *atomic.Int64 // the rule's held requests in this process
}

// waiters counts the requests each wait rule holds in this process, for max_waiting.
// Keyed by domain and descriptor path, which name one rule across reloads, so that
// requests held across a reload count against the rule's new version.
type waiters struct{ byRule sync.Map } // string → *atomic.Int64

func (ws *waiters) of(r *rules.Rule) *atomic.Int64 {
	k := r.Domain + "\x00" + r.Descriptor
	if c, ok := ws.byRule.Load(k); ok {
		return c.(*atomic.Int64)
	}
	c, _ := ws.byRule.LoadOrStore(k, new(atomic.Int64))
	return c.(*atomic.Int64)
}

// Holding is how many requests e holds for the slots of wait rule r in this process
// (bounded by its max_waiting), across reloads of r's rules.
func (e *Engine) Holding(r *rules.Rule) int64 { return e.waiting.of(r).Load() }

// Reserve takes a slot of every wait rule that Decide left to it (see Request.Hold),
// for a request that the other rules allow, and sets v.Wait to the longest wait. The
// checks are those given to Decide. When a rule cannot hold the request (its
// max_waiting requests are held already, or its slot would come later than
// max_wait) the slots already taken are given back and v records the rule as
// violated, with the time until a slot would be within max_wait: the request then
// goes the way of the rule's then (reject or defer). The caller ends what Reserve
// took with Hold or Cancel.
func (e *Engine) Reserve(ctx context.Context, checks []rules.Check, v *Verdict) {
	for _, i := range v.waits {
		c := &checks[i]
		rule := c.Rule
		h := held{check: c, pace: rule.Pace(), count: e.waiting.of(rule)}
		if h.count.Add(1) > rule.MaxWaiting {
			h.count.Add(-1)
			e.fallBack(ctx, v, rule, time.Duration(rule.MaxWaiting)*h.pace.Interval)
			return
		}
		res, err := e.reserver.Reserve(ctx, c.Key(0), h.pace)
		if err != nil {
			// Only an invalid pace errs, and rules never compile one: let the
			// request through rather than fail it, and say so.
			e.log.Error("limiter failed to reserve", "rule", rule.Name, "err", err)
			h.count.Add(-1)
			continue
		}
		h.res = res
		l := rule.Limits[0]
		d := limiter.Decision{Allowed: res.OK, Limit: l.Rate, Remaining: min(res.Remaining, l.Rate),
			RetryAfter: res.RetryAfter(h.pace), ResetAfter: res.ResetAfter}
		if v.ClosestRule == nil || closer(d, v.Closest) {
			v.Closest, v.ClosestRule, v.ClosestLimit = d, rule, 0
		}
		if !res.OK {
			h.count.Add(-1)
			e.fallBack(ctx, v, rule, d.RetryAfter)
			return
		}
		v.holds = append(v.holds, h)
		v.Wait = max(v.Wait, res.Wait)
	}
}

// fallBack gives back what v holds, records that wait rule could not hold the
// request, which may retry after retryAfter, and counts the rule's fallback.
func (e *Engine) fallBack(ctx context.Context, v *Verdict, rule *rules.Rule, retryAfter time.Duration) {
	e.Cancel(ctx, v)
	v.ViolatedNames = append(v.ViolatedNames, rule.Name)
	v.Violated, v.RetryAfter, v.Wait = rule, retryAfter, 0
	outcome := OutcomeRejected
	if v.parks(rule) {
		outcome = OutcomeDeferred
	}
	e.metrics.Count(rule.Name, outcome)
}

// Holding reports whether v holds slots that Reserve took.
func (v *Verdict) Holding() bool { return len(v.holds) > 0 }

// Held returns the names of the wait rules whose slots v holds.
func (v *Verdict) Held() []string {
	names := make([]string, 0, len(v.holds))
	for _, h := range v.holds {
		names = append(names, h.check.Rule.Name)
	}
	return names
}

// Cancel gives back the slots v holds, for a request that will not use them, and
// their places among max_waiting; nothing is counted.
func (e *Engine) Cancel(ctx context.Context, v *Verdict) {
	if len(v.holds) > 0 {
		// The request's context may be done (the client went away): the slots are
		// given back all the same, within a bound.
		cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer stop()
		for _, h := range v.holds {
			if err := e.reserver.Cancel(cctx, h.check.Key(0), h.pace, h.res); err != nil {
				e.log.Error("limiter failed to cancel a reservation", "rule", h.check.Rule.Name, "err", err)
			}
		}
	}
	e.end(v, "")
}

// Refuse gives back the slots v holds, as Cancel, for a request refused because it
// would wait for them (a check cannot hold the request it is asked about), and counts
// each wait rule's rejection.
func (e *Engine) Refuse(ctx context.Context, v *Verdict) {
	holds := v.holds
	e.Cancel(ctx, v)
	for _, h := range holds {
		e.metrics.Count(h.check.Rule.Name, OutcomeRejected)
	}
}

// Hold waits until the slots v holds start (v.Wait from Reserve) and reports whether
// the request may go on, counting each wait rule's outcome (OutcomeWaited, or
// OutcomeAllowed when its slot was free). A request whose ctx is done meanwhile (the
// client went away) gets its slots given back, as Cancel, and false.
func (e *Engine) Hold(ctx context.Context, v *Verdict) bool {
	if v.Wait > 0 {
		t := time.NewTimer(v.Wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			e.Cancel(ctx, v)
			return false
		}
	}
	e.end(v, OutcomeAllowed)
	return true
}

// end frees the places of v's holds among max_waiting and forgets them; with an
// outcome, it counts each rule's (OutcomeWaited for a slot that was not free).
func (e *Engine) end(v *Verdict, outcome string) {
	for _, h := range v.holds {
		h.count.Add(-1)
		if outcome != "" {
			o := outcome
			if h.res.Wait > 0 {
				o = OutcomeWaited
			}
			e.metrics.Count(h.check.Rule.Name, o)
		}
	}
	v.holds = nil
}
