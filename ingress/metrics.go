package ingress

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
	// request that another quota of it still had room for (see QuotaTally). Only quota
	// rules have this series.
	OutcomeQuotaExhausted = "quota_exhausted"
	// OutcomeWaited: a wait rule (on_limit: wait) held the request for its slot, then
	// let it go. Only wait rules have this series.
	OutcomeWaited = "waited"
)

var outcomes = [...]string{OutcomeAllowed, OutcomeRejected, OutcomeDeferred, OutcomeShadowDenied, OutcomeError, OutcomeQuotaExhausted, OutcomeWaited}

// statusClasses are the values of the upstream series' class label: 1xx..5xx at
// 0..4 (see classIndex), error (no response) last.
var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "error"}

// DecisionMetrics are the series of rate-limit decisions (sluice_decisions_total by rule
// and outcome, sluice_decision_duration_seconds), shared by every decider of a process
// on one registry: the front door, the ext_authz check and the Envoy rate limit service
// count into the same series. Labels are bounded: rule names come from the rules files,
// never from requests.
type DecisionMetrics struct {
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

type metrics = DecisionMetrics

// NewDecisionMetrics returns the decision series registered on reg (nil: not
// registered). A second call with the same registry returns series that count into
// the first one's; it fails only when reg holds other series under the same names.
func NewDecisionMetrics(reg prometheus.Registerer) (*DecisionMetrics, error) { return newMetrics(reg) }

// Count counts one decision of rule with outcome (one of the Outcome constants).
func (m *DecisionMetrics) Count(rule, outcome string) {
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

// Observe records how long deciding one request took.
func (m *DecisionMetrics) Observe(d time.Duration) { m.decisionDuration.Observe(d.Seconds()) }

// ObserveContext is Observe with an exemplar naming the trace of ctx's span when it is
// sampled.
func (m *DecisionMetrics) ObserveContext(ctx context.Context, d time.Duration) {
	telemetry.Observe(ctx, m.decisionDuration, d.Seconds())
}

// InitRules creates every rule's series of set at 0.
func (m *DecisionMetrics) InitRules(set *rules.Set) { m.initRules(set) }

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
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
		if m.decisions, err = registerShared(reg, m.decisions); err != nil {
			return nil, err
		}
		if m.decisionDuration, err = registerShared(reg, m.decisionDuration); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// registerShared registers c on reg, or returns the collector of the same description
// registered before, so that two users of one registry count into the same series.
// It fails when reg holds a different collector under c's names.
func registerShared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("ingress: registering metrics: %w", err)
	}
	return c, nil
}

// upstreamMetrics count what the reverse proxy gets from the upstream.
type upstreamMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newUpstreamMetrics(reg prometheus.Registerer) (*upstreamMetrics, error) {
	m := &upstreamMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_upstream_requests_total",
			Help: "Requests proxied to the upstream, by response status class (error: no response).",
		}, []string{"class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_upstream_duration_seconds",
			Help:    "Time until the upstream's response headers, by status class.",
			Buckets: prometheus.DefBuckets,
		}, []string{"class"}),
	}
	for _, class := range statusClasses {
		m.requests.WithLabelValues(class)
		m.duration.WithLabelValues(class)
	}
	if reg != nil {
		var err error
		if m.requests, err = registerShared(reg, m.requests); err != nil {
			return nil, err
		}
		if m.duration, err = registerShared(reg, m.duration); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RoundTrip-side instrumentation of the proxy's transport.
type instrumentedTransport struct {
	next    http.RoundTripper
	metrics *upstreamMetrics
}

func (t instrumentedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	class := "error"
	if err == nil {
		class = statusClass(resp.StatusCode)
	}
	t.metrics.requests.WithLabelValues(class).Inc()
	// An exemplar when the request carries a sampled span (an outer instrumentation's).
	telemetry.Observe(r.Context(), t.metrics.duration.WithLabelValues(class), time.Since(start).Seconds())
	return resp, err
}

// initRules creates every rule's series at 0, so dashboards and alerts see them before
// the first decision.
func (m *metrics) initRules(set *rules.Set) {
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

func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}
