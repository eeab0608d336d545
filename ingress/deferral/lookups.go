package deferral

import (
	"net/http"
	"strconv"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/limiter"
)

// WithLookupLimit limits each client's ticket lookups (StatusHandler and
// CancelHandler) to rate, with a burst of twice its count, decided in memory per client
// address group (ids; nil: the peer address). Looking up an unknown ticket reads NATS
// once or more in every queue, so without a limit anybody could have the front door
// read NATS as fast as they send requests. Over the limit: 429 with Retry-After. A
// zero rate: no limit (the default).
func WithLookupLimit(ids *ingress.ClientIdentity, rate limiter.Rate) Option {
	return func(q *Deferrer) {
		if rate.IsZero() {
			q.lookups = nil
			return
		}
		if ids == nil {
			ids, _ = ingress.NewClientIdentity(nil, 0) // trusts no proxy; cannot fail
		}
		q.lookups = &lookupLimit{ids: ids, store: limiter.NewMemory(),
			limit: limiter.Limit{Algorithm: limiter.TokenBucket, Rate: rate.Count, Period: rate.Period, Burst: 2 * rate.Count}}
	}
}

// lookupLimit is a WithLookupLimit.
type lookupLimit struct {
	ids   *ingress.ClientIdentity
	store *limiter.Memory
	limit limiter.Limit
}

// allow reports whether r's client may look a ticket up now; when not, it has answered
// 429 on w.
func (l *lookupLimit) allow(w http.ResponseWriter, r *http.Request) bool {
	if l == nil {
		return true
	}
	key := l.ids.Group(l.ids.Addr(r)).String()
	d, err := l.store.AllowN(r.Context(), key, l.limit, 1)
	if err != nil || d.Allowed { // err: a limit Validate refuses, which rates of ParseRate are not
		return true
	}
	w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(d.RetryAfter), 10))
	ingress.WriteProblem(w, http.StatusTooManyRequests, "Too many ticket lookups from this client; ask again after Retry-After.")
	return false
}
