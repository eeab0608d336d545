package decide

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter/promshare"
	"github.com/sluicehq/sluice/queue/telemetry"
	"github.com/sluicehq/sluice/rules"
)

// Decision outcomes, the values of the outcome label.
const (
	OutcomeAllowed      = "allowed"
	OutcomeRejected     = "rejected"
	OutcomeDeferred     = "deferred"
	OutcomeShadowDenied = "shadow_rejected" // over the limit, not enforced
	OutcomeError        = "error"           // the limiter failed and the rule's failure mode decided
	// OutcomeQuotaExhausted: a quota-mode rule (rules.Rule.Quota) over its limit, on a
	// request that another quota of it still had room for (see Engine.Decide). Only
	// quota rules have this series.
	OutcomeQuotaExhausted = "quota_exhausted"
	// OutcomeWaited: a wait rule (on_limit: wait) held the request for its slot, then
	// let it go. Only wait rules have this series.
	OutcomeWaited = "waited"
)

var outcomes = [...]string{OutcomeAllowed, OutcomeRejected, OutcomeDeferred, OutcomeShadowDenied, OutcomeError, OutcomeQuotaExhausted, OutcomeWaited}

// Metrics are the series of rate-limit decisions (sluice_decisions_total by rule and
// outcome, sluice_decision_duration_seconds), shared by every engine of a process on
// one registry: the front door, the check endpoint, ext_authz and the Envoy rate
// limit service count into the same series. Labels are bounded: rule names come from
// the rules files, never from requests.
type Metrics struct {
	decisions        *prometheus.CounterVec
	decisionDuration prometheus.Histogram
	// byRule caches the counters of the rules initRules created (rule name →
	// *ruleCounters), which WithLabelValues would otherwise hash and look up on
	// every decision. Rule names are bounded as the labels are.
	byRule sync.Map
}

// ruleCounters are one rule's counters, one per outcome, in the order of outcomes
// (nil for an outcome the rule cannot have).
type ruleCounters [len(outcomes)]prometheus.Counter

// NewMetrics returns the decision series registered on reg (nil: not registered). A
// second call with the same registry returns series that count into the first
// one's; it fails only when reg holds other series under the same names.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions by rule and outcome.",
		}, []string{"rule", "outcome"}),
		decisionDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_decision_duration_seconds",
			Help:    "Time to decide one request against every rule that applies to it.",
			Buckets: []float64{5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2},
		}),
	}
	if reg != nil {
		var err error
		if m.decisions, err = promshare.Register(reg, m.decisions); err != nil {
			return nil, err
		}
		if m.decisionDuration, err = promshare.Register(reg, m.decisionDuration); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Count counts one decision of rule with outcome (one of the Outcome constants).
func (m *Metrics) Count(rule, outcome string) {
	i := slices.Index(outcomes[:], outcome)
	if i < 0 {
		m.decisions.WithLabelValues(rule, outcome).Inc()
		return
	}
	if c, ok := m.byRule.Load(rule); ok {
		if cnt := c.(*ruleCounters)[i]; cnt != nil {
			cnt.Inc()
			return
		}
	}
	m.decisions.WithLabelValues(rule, outcome).Inc()
}

// ObserveContext records how long deciding one request took, with an exemplar naming
// the trace of ctx's span when it is sampled.
func (m *Metrics) ObserveContext(ctx context.Context, d time.Duration) {
	telemetry.Observe(ctx, m.decisionDuration, d.Seconds())
}

// initRules creates every rule's series at 0, so dashboards and alerts see them before
// the first decision.
func (m *Metrics) initRules(set *rules.Set) {
	for _, r := range set.Rules() {
		var c ruleCounters
		for i, o := range outcomes {
			if o == OutcomeQuotaExhausted && !r.Quota || o == OutcomeWaited && r.OnLimit != rules.Wait {
				continue // a series no decision of this rule can count
			}
			c[i] = m.decisions.WithLabelValues(r.Name, o)
		}
		m.byRule.Store(r.Name, &c)
	}
}
