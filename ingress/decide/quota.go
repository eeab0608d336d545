package decide

import (
	"time"

	"github.com/sluicehq/sluice/rules"
)

// quotaTally gathers the decisions of a request's quota-mode rules (rules.Rule.Quota,
// Envoy's quota_mode), which deny the request only when every one of them is over
// its limit. The zero value is an empty tally.
type quotaTally struct {
	total, over int
	wait        time.Duration // the shortest wait of those over
}

// add records decision d of quota rule r and reports whether r is exhausted: over
// its limit and not in shadow mode. An exhausted rule's outcome waits for exhausted;
// any other (under its limit, failed, or over in shadow mode, which Envoy reports
// OK and so never exhausts) is decided as for a rule without quota mode.
func (q *quotaTally) add(r *rules.Rule, d Decision) bool {
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

// exhausted reports whether the quota rules deny the request: it reached at least
// one, and every one it reached is exhausted. The request passes them again after
// q.wait, once any one has room.
func (q *quotaTally) exhausted() bool { return q.total > 0 && q.over == q.total }
