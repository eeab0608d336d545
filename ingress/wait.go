package ingress

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// HeaderWaited is the response header of a request that passed a wait rule
// (on_limit: wait): the seconds it was held for its paced slot, to the millisecond
// ("0.84"; "0" when its slot was free). It is the wait the store computed when the
// slot was reserved, not a measurement.
const HeaderWaited = "Sluice-Waited"

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

// reserve takes a slot of every wait rule among checks (v.waits) for a request that
// the other rules allow, and returns them with the longest wait. When a rule cannot
// hold the request (its max_waiting requests are held already, or its slot would
// come later than max_wait) the slots already taken are given back, v records the
// rule as violated with the time until a slot would be within max_wait, and nil is
// returned: the request then goes the way of the rule's then (reject or defer). The
// caller releases what reserve returns (release).
func (m *Middleware) reserve(ctx context.Context, checks []rules.Check, v *verdict) ([]held, time.Duration) {
	var holds []held
	var longest time.Duration
	for _, i := range v.waits {
		c := &checks[i]
		rule := c.Rule
		h := held{check: c, pace: rule.Pace(), count: m.waiting.of(rule)}
		if h.count.Add(1) > rule.MaxWaiting {
			h.count.Add(-1)
			m.release(ctx, holds, true)
			m.fallBack(v, rule, time.Duration(rule.MaxWaiting)*h.pace.Interval)
			return nil, 0
		}
		res, err := m.reserver.Reserve(ctx, c.Key(0), h.pace)
		if err != nil {
			// Only an invalid pace errs, and rules never compile one: let the
			// request through rather than fail it, and say so.
			m.log.Error("limiter failed to reserve", "rule", rule.Name, "err", err)
			h.count.Add(-1)
			continue
		}
		h.res = res
		l := rule.Limits[0]
		d := limiter.Decision{Allowed: res.OK, Limit: l.Rate, Remaining: min(res.Remaining, l.Rate),
			RetryAfter: res.RetryAfter(h.pace), ResetAfter: res.ResetAfter}
		if v.closestRule == nil || Closer(d, v.closest) {
			v.closest, v.closestRule, v.closestIdx = d, rule, 0
		}
		if !res.OK {
			h.count.Add(-1)
			m.release(ctx, holds, true)
			m.fallBack(v, rule, d.RetryAfter)
			return nil, 0
		}
		holds = append(holds, h)
		longest = max(longest, res.Wait)
	}
	return holds, longest
}

// fallBack records that wait rule could not hold the request, which may retry after
// retryAfter, and counts the rule's fallback.
func (m *Middleware) fallBack(v *verdict, rule *rules.Rule, retryAfter time.Duration) {
	v.violatedNames = append(v.violatedNames, rule.Name)
	v.violated, v.retryAfter = rule, retryAfter
	outcome := OutcomeRejected
	if rule.Then == rules.Defer {
		outcome = OutcomeDeferred
	}
	m.metrics.Count(rule.Name, outcome)
}

// release ends the hold of holds: it gives their slots back when cancel is set (the
// request will not use them), and counts each rule's outcome unless cancel is set.
func (m *Middleware) release(ctx context.Context, holds []held, cancel bool) {
	if cancel && len(holds) > 0 {
		// The request's context may be done (the client went away): the slots are
		// given back all the same, within a bound.
		cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
		defer stop()
		for _, h := range holds {
			if err := m.reserver.Cancel(cctx, h.check.Key(0), h.pace, h.res); err != nil {
				m.log.Error("limiter failed to cancel a reservation", "rule", h.check.Rule.Name, "err", err)
			}
		}
	}
	for _, h := range holds {
		h.count.Add(-1)
		if !cancel {
			outcome := OutcomeAllowed
			if h.res.Wait > 0 {
				outcome = OutcomeWaited
			}
			m.metrics.Count(h.check.Rule.Name, outcome)
		}
	}
}

// hold waits until the slots of holds start, wait from now, and reports whether the
// request may go on. A client that goes away meanwhile gets its slots given back
// (see limiter.Reserver.Cancel) and false.
func (m *Middleware) hold(ctx context.Context, holds []held, wait time.Duration) bool {
	if wait > 0 {
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			m.release(ctx, holds, true)
			return false
		}
	}
	m.release(ctx, holds, false)
	return true
}

// formatWaited writes d in seconds to the millisecond, as HeaderWaited carries it.
func formatWaited(d time.Duration) string {
	return strconv.FormatFloat(float64(d.Round(time.Millisecond).Milliseconds())/1000, 'f', -1, 64)
}

// answerWait answers a check (Authorize) whose request a wait rule would hold for
// wait: a check cannot hold the request it is asked about (the proxy's own timeout
// would pass first), so it gives the slots back and answers 429 with Retry-After the
// wait, rounded up to whole seconds: when the client's slot would have come.
func (m *Middleware) answerWait(ctx context.Context, w http.ResponseWriter, holds []held, v *verdict, wait time.Duration) {
	m.release(ctx, holds, true)
	names := make([]string, 0, len(holds))
	for _, h := range holds {
		names = append(names, h.check.Rule.Name)
		m.metrics.Count(h.check.Rule.Name, OutcomeRejected)
	}
	SetRetryAfter(w.Header(), wait)
	writeProblem(w, quotaExceeded(names, v.closest.Limit, wait))
}
