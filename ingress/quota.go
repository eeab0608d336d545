package ingress

import (
	"time"

	"github.com/sluicehq/sluice/rules"
)

// QuotaTally gathers the decisions of a request's quota-mode rules (rules.Rule.Quota,
// Envoy's quota_mode), which deny the request only when every one of them is over
// its limit. The front door and the Envoy rate limit service decide each check, hand
// the quota rules' decisions to Add, and settle the exhausted ones once every check
// is decided: as violations when Exhausted, else counted OutcomeQuotaExhausted. The
// zero value is an empty tally.
type QuotaTally struct {
	total, over int
	wait        time.Duration // the shortest wait of those over
}

// Add records decision d of quota rule r and reports whether r is exhausted: over
// its limit and not in shadow mode. An exhausted rule's outcome waits for Exhausted;
// any other (under its limit, failed, or over in shadow mode, which Envoy reports
// OK and so never exhausts) is decided as for a rule without quota mode.
func (q *QuotaTally) Add(r *rules.Rule, d RuleDecision) bool {
	q.total++
	if !d.Over || r.Shadow {
		return false
	}
	if q.over == 0 || d.RetryAfter < q.wait {
		q.wait = d.RetryAfter
	}
	q.over++
	return true
}

// Exhausted reports whether the quota rules deny the request: it reached at least
// one, and every one it reached is exhausted.
func (q *QuotaTally) Exhausted() bool { return q.total > 0 && q.over == q.total }

// RetryAfter is, when Exhausted, the shortest wait of the quota rules: the request
// passes them again once any one has room.
func (q *QuotaTally) RetryAfter() time.Duration { return q.wait }
