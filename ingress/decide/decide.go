// Package decide is sluice's rate-limit decision, the one every entry point uses:
// the front door and its authorization checks (package ingress: the middleware, the
// check endpoint, Envoy's ext_authz through it) and Envoy's rate limit service
// (package ingress/envoy). An entry point turns its request into the checks of the
// rules it reaches (rules.Set.Match, rules.Set.Evaluate), hands them to an Engine,
// and turns the Verdict into its wire format; how a rule's limits, shadow mode,
// quota mode and wait rules decide, which limit is the closest, and what is counted
// are written here once.
package decide

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Engine decides checks with a limiter and counts the outcomes. Create it with New;
// it is safe for concurrent use.
type Engine struct {
	lim      limiter.Limiter
	reserver limiter.Reserver // lim's, for wait rules; nil: they decide as others
	waiting  waiters
	metrics  *Metrics
	reg      prometheus.Registerer
	log      *slog.Logger
	shadow   bool
	seen     atomic.Pointer[inUse]
	// epoch is when e was made: time.Since(epoch) reads the monotonic clock alone,
	// where time.Now reads the wall clock too, to time each decision.
	epoch time.Time
}

// inUse is the rule set an engine was last told to use, with the header field values
// of its limits.
type inUse struct {
	set    *rules.Set
	limits limitFieldsMap
}

// Option configures an Engine.
type Option func(*Engine)

// WithShadow puts every rule in shadow mode: decisions are computed, counted and
// logged, never enforced (a Verdict then never has a Violated rule).
func WithShadow(on bool) Option { return func(e *Engine) { e.shadow = on } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(e *Engine) { e.log = l } }

// WithRegisterer counts the decisions in series registered on reg (see NewMetrics:
// the engines of one process share the series of one registry).
func WithRegisterer(reg prometheus.Registerer) Option { return func(e *Engine) { e.reg = reg } }

// New returns an engine deciding with lim; wait rules hold requests when lim is a
// limiter.Reserver. It fails when lim is nil, WithLogger was given nil, or the metrics
// cannot be registered.
func New(lim limiter.Limiter, opts ...Option) (*Engine, error) {
	if lim == nil {
		return nil, errors.New("decide: New needs a limiter")
	}
	e := &Engine{lim: lim, log: slog.Default(), epoch: time.Now()}
	e.seen.Store(&inUse{})
	e.reserver, _ = lim.(limiter.Reserver)
	for _, o := range opts {
		o(e)
	}
	if e.log == nil {
		return nil, errors.New("decide: WithLogger(nil)")
	}
	var err error
	if e.metrics, err = NewMetrics(e.reg); err != nil {
		return nil, err
	}
	return e, nil
}

// Use tells e the rule set the next decisions are made on: the first time e sees a
// set, it creates the series of its rules at 0, so that dashboards see them before
// their first decision, and writes the header field values of its limits that no
// request changes (see Verdict.Fields).
func (e *Engine) Use(set *rules.Set) {
	if old := e.seen.Load(); old.set != set && e.seen.CompareAndSwap(old, &inUse{set: set, limits: newLimitFieldsMap(set)}) {
		e.metrics.initRules(set)
	}
}

// Request is what Decide decides: the checks of one request.
type Request struct {
	Checks []rules.Check
	// Hits is what each check costs (Envoy's hits_addend), by index; nil: 1 each.
	Hits []int64
	// Hold says that the entry point can hold a request for the slot of a wait rule
	// (on_limit: wait): enforced wait rules with one limit, not in quota mode, are
	// then left to Reserve (when the limiter is a limiter.Reserver); otherwise they
	// decide as reject rules do.
	Hold bool
	// RejectOnly says that the entry point cannot park this request, so that it
	// answers a parking rule's violation as a rejection: Envoy's rate limit service,
	// a check whose proxy cannot carry an order (nginx auth_request, Traefik
	// ForwardAuth, ext_authz without the body), a front door without a queue. A rule
	// that parks (rules.Rule.Parks) then counts its violations, and a wait rule with
	// then: defer its fallbacks, as rejected, and is as restrictive as any other.
	RejectOnly bool
	// Results, when not nil, has a place for each check, where Decide writes how
	// the check was decided.
	Results []Result
}

// Result is how one check was decided.
type Result struct {
	Decision
	// Outcome is what was counted for the check (an Outcome constant); empty for a
	// wait rule left to Reserve.
	Outcome string
}

// Decision is the outcome of every limit of one check.
type Decision struct {
	// Over reports that a limit refused, or that the rule denies everything.
	Over bool
	// Failed reports that the limiter erred on some limit (only an invalid limit or
	// request size does); that limit was skipped.
	Failed bool
	// Closest is the decision of the limit closest to running out, ClosestLimit its
	// index in Rule.Limits (-1 when no limit was decided: unlimited, deny, failed).
	Closest      limiter.Decision
	ClosestLimit int
	// RetryAfter is, when Over, the longest wait of the limits that refused. A limit
	// that can never allow the hits (more than its capacity: limiter.Never) waits as
	// a block-list rule does (an hour): the same request never passes, and the client
	// must not be told to retry it at once, nor given a wait no header can carry.
	RetryAfter time.Duration
}

// Verdict is the outcome of every check of one request.
type Verdict struct {
	// Closest is the decision closest to running out (see closer), of
	// ClosestRule.Limits[ClosestLimit]: what the rate-limit headers describe.
	// ClosestRule is nil when no limit was decided.
	Closest      limiter.Decision
	ClosestRule  *rules.Rule
	ClosestLimit int
	// Violated is the enforced rule over its limit that is most restrictive (a
	// rejecting rule before a parking one, then the longest wait), nil when the
	// request may pass; RetryAfter is when Violated would let it. ViolatedNames are
	// the names of every enforced rule over its limit, in the order they were found.
	Violated      *rules.Rule
	RetryAfter    time.Duration
	ViolatedNames []string
	// Wait is, after Reserve, how long the request waits for the latest of the
	// slots it holds.
	Wait time.Duration

	rejectOnly bool
	limits     limitFieldsMap // of the set in use when decided, for Fields
	waits      []int          // the checks left to Reserve
	holds      []held         // what Reserve took
}

// Decide decides every check of req, counts each outcome and how long it took, and
// returns the verdict. A quota-mode rule (rules.Rule.Quota, Envoy's quota_mode) over
// its limit is counted OutcomeQuotaExhausted and violates nothing while another
// quota-mode rule of the request has room; when every one is exhausted they all
// violate, the request retrying after the shortest of their waits. A rule in shadow
// mode (its own, or the engine's) over its limit is counted OutcomeShadowDenied and
// violates nothing.
func (e *Engine) Decide(ctx context.Context, req *Request) Verdict {
	start := time.Since(e.epoch)
	v := Verdict{rejectOnly: req.RejectOnly, limits: e.seen.Load().limits}
	var (
		quota quotaTally
		// exhausted are the checks of quota rules over their limit, settled once
		// every check is decided (on the stack for the usual few).
		buf       [8]int
		exhausted = buf[:0]
	)
	for i := range req.Checks {
		c := &req.Checks[i]
		rule := c.Rule
		if req.Hold && e.holds(rule) {
			v.waits = append(v.waits, i)
			continue
		}
		n := int64(1)
		if req.Hits != nil {
			n = req.Hits[i]
		}
		d, err := decideCheck(ctx, e.lim, c, n)
		if err != nil {
			// Only an invalid limit errs, and rules never compile one: let the
			// request through rather than fail it, and say so.
			e.log.Error("limiter failed", "rule", rule.Name, "err", err)
		}
		if d.ClosestLimit >= 0 && (v.ClosestRule == nil || closer(d.Closest, v.Closest)) {
			v.Closest, v.ClosestRule, v.ClosestLimit = d.Closest, rule, d.ClosestLimit
		}
		outcome := OutcomeAllowed
		switch {
		case rule.Quota && quota.add(rule, d):
			exhausted = append(exhausted, i)
			outcome = OutcomeQuotaExhausted // unless all are (below)
		case d.Over:
			outcome = e.judge(&v, rule, d.RetryAfter)
		case d.Failed:
			outcome = OutcomeError
		}
		if req.Results != nil {
			req.Results[i] = Result{Decision: d, Outcome: outcome}
		}
		if outcome != OutcomeQuotaExhausted {
			e.metrics.Count(rule.Name, outcome)
		}
	}
	// The quota rules deny only all together; the request then passes again once
	// one of them has room.
	denied := quota.exhausted()
	for _, i := range exhausted {
		rule := req.Checks[i].Rule
		outcome := OutcomeQuotaExhausted
		if denied {
			outcome = e.judge(&v, rule, quota.wait)
			if req.Results != nil {
				req.Results[i].Outcome = outcome
			}
		}
		e.metrics.Count(rule.Name, outcome)
	}
	e.metrics.ObserveContext(ctx, time.Since(e.epoch)-start)
	return v
}

// holds reports whether a request that can be held is held for rule's slot rather
// than decided on its limit.
func (e *Engine) holds(rule *rules.Rule) bool {
	return rule.OnLimit == rules.Wait && e.reserver != nil && !rule.Shadow && !e.shadow && !rule.Quota && len(rule.Limits) == 1
}

// judge records in v that rule is over its limit, the request may retry after
// retryAfter, and returns the outcome to count.
func (e *Engine) judge(v *Verdict, rule *rules.Rule, retryAfter time.Duration) string {
	if rule.Shadow || e.shadow {
		e.log.Debug("over the limit in shadow mode", "rule", rule.Name, "retry_after", retryAfter)
		return OutcomeShadowDenied
	}
	v.violate(rule, retryAfter)
	if v.parks(rule) {
		return OutcomeDeferred
	}
	return OutcomeRejected
}

// violate records that rule is over its limit, the request may retry after
// retryAfter.
func (v *Verdict) violate(rule *rules.Rule, retryAfter time.Duration) {
	v.ViolatedNames = append(v.ViolatedNames, rule.Name)
	if v.Violated == nil || v.moreRestrictive(rule, retryAfter) {
		v.Violated, v.RetryAfter = rule, retryAfter
	}
}

// parks reports whether a request over rule's limit is parked on v's entry point.
func (v *Verdict) parks(rule *rules.Rule) bool { return !v.rejectOnly && rule.Parks() }

// moreRestrictive reports whether rule, waiting wait, is more restrictive than
// v.Violated: rejecting is more restrictive than parking, then a longer wait is.
func (v *Verdict) moreRestrictive(rule *rules.Rule, wait time.Duration) bool {
	if a, b := !v.parks(rule), !v.parks(v.Violated); a != b {
		return a
	}
	return wait > v.RetryAfter
}

// decideCheck asks lim for n units under every limit of c; it returns the first
// limiter error beside the decision.
func decideCheck(ctx context.Context, lim limiter.Limiter, c *rules.Check, n int64) (Decision, error) {
	rule := c.Rule
	out := Decision{Over: rule.Deny, ClosestLimit: -1}
	if rule.Deny {
		out.RetryAfter = denyRetryAfter
	}
	var first error
	for j, l := range rule.Limits {
		d, err := lim.AllowN(ctx, c.Key(j), l, n)
		if err != nil {
			out.Failed = true
			if first == nil {
				first = err
			}
			continue
		}
		if out.ClosestLimit < 0 || closer(d, out.Closest) {
			out.Closest, out.ClosestLimit = d, j
		}
		if !d.Allowed {
			out.Over = true
			wait := d.RetryAfter
			if wait == limiter.Never {
				wait = denyRetryAfter
			}
			out.RetryAfter = max(out.RetryAfter, wait)
		}
	}
	return out, first
}

// denyRetryAfter is what a block-list rule (requests_per_unit: 0) tells clients.
const denyRetryAfter = time.Hour

// closer reports whether a is closer to running out than b: fewer remaining, then a
// longer wait, then a longer time to reset.
func closer(a, b limiter.Decision) bool {
	if a.Remaining != b.Remaining {
		return a.Remaining < b.Remaining
	}
	if a.RetryAfter != b.RetryAfter {
		return a.RetryAfter > b.RetryAfter
	}
	return a.ResetAfter > b.ResetAfter
}
