package decide

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/ratelimitheader"
	"github.com/sluicehq/sluice/rules"
)

// Fields are the values of the rate-limit header fields that describe one decision,
// as every entry point sends them: the front door as HTTP headers, the Envoy services
// as headers for Envoy to add.
type Fields struct {
	Limit, Remaining string // X-Ratelimit-Limit, X-Ratelimit-Remaining
	// Policy and RateLimit are RateLimit-Policy and RateLimit
	// (draft-ietf-httpapi-ratelimit-headers, limiter/ratelimitheader); empty when the
	// rule's name cannot be written in them.
	Policy, RateLimit string
}

// SetHeaders sets X-Ratelimit-Limit, X-Ratelimit-Remaining and, when they are not
// empty, RateLimit-Policy and RateLimit to f, replacing any values h had.
func (f Fields) SetHeaders(h http.Header) {
	// As h.Set would, under the canonical names, but the four values share one
	// backing array: these headers are on every response, and the front door's
	// allocations are a good part of its CPU per request.
	vals := []string{f.Limit, f.Remaining, f.Policy, f.RateLimit}
	set := func(k string, i int) { h[k] = vals[i : i+1 : i+1] }
	set("X-Ratelimit-Limit", 0)
	set("X-Ratelimit-Remaining", 1)
	if f.Policy != "" {
		set("Ratelimit-Policy", 2)
	}
	if f.RateLimit != "" {
		set("Ratelimit", 3)
	}
}

// SetRetryAfter sets Retry-After and X-Ratelimit-Retry-After to d in whole seconds,
// rounded up (RetryAfterSeconds).
func SetRetryAfter(h http.Header, d time.Duration) {
	secs := strconv.FormatInt(RetryAfterSeconds(d), 10)
	h.Set("Retry-After", secs)
	h.Set("X-Ratelimit-Retry-After", secs)
}

// Fields returns the fields of v's closest limit; all empty when v has none
// (ClosestRule nil). What does not depend on the request was written once for the
// set in use when v was decided (see Engine.Use); a rule not in it (an Envoy
// override), or a decision whose Limit is not the limit's capacity, gets FieldsOf.
func (v *Verdict) Fields() Fields {
	if v.ClosestRule == nil {
		return Fields{}
	}
	if lf := v.limits.of(v.ClosestRule, v.ClosestLimit); lf != nil && lf.quota == v.Closest.Limit {
		return lf.fields(v.Closest)
	}
	return FieldsOf(v.ClosestRule, v.ClosestLimit, v.Closest)
}

// FieldsOf returns the fields of decision d of rule.Limits[limit]: its limit and
// remaining, the quota over its window (see quotaWindow) and the time to its reset,
// durations rounded up to whole seconds (RetryAfterSeconds).
func FieldsOf(rule *rules.Rule, limit int, d limiter.Decision) Fields {
	// The four values are written into one buffer and cut from one string: one
	// allocation instead of four.
	var buf [256]byte
	b := strconv.AppendInt(buf[:0], d.Limit, 10)
	ends := [4]int{len(b)}
	b = strconv.AppendInt(b, d.Remaining, 10)
	ends[1] = len(b)
	// A name the fields cannot carry leaves b as it was: those two values are empty.
	b, _ = ratelimitheader.AppendPolicy(b, ratelimitheader.Policy{Name: rule.Name, Quota: d.Limit,
		Window: RetryAfterSeconds(quotaWindow(rule.Limits[limit]))})
	ends[2] = len(b)
	b, _ = ratelimitheader.AppendRateLimit(b, ratelimitheader.Status{Name: rule.Name, Remaining: d.Remaining,
		Reset: RetryAfterSeconds(d.ResetAfter)})
	ends[3] = len(b)
	all := string(b)
	return Fields{Limit: all[:ends[0]], Remaining: all[ends[0]:ends[1]], Policy: all[ends[1]:ends[2]], RateLimit: all[ends[2]:ends[3]]}
}

// fields returns the fields of decision d, whose Limit is lf.quota: the two values
// of the request are written into one buffer and cut from one string, one
// allocation on every response.
func (lf *limitFields) fields(d limiter.Decision) Fields {
	var buf [256]byte
	b := strconv.AppendInt(buf[:0], d.Remaining, 10)
	n := len(b)
	if lf.name != "" {
		b = ratelimitheader.AppendStatus(b, lf.name, d.Remaining, RetryAfterSeconds(d.ResetAfter))
	}
	all := string(b)
	return Fields{Limit: lf.limit, Remaining: all[:n], Policy: lf.policy, RateLimit: all[n:]}
}

// limitFields are what the fields of a decision whose Limit is quota say of one limit
// of a rule, whatever the request: written once per rule set (see Engine.Use) rather
// than on every response.
type limitFields struct {
	quota  int64
	limit  string // X-Ratelimit-Limit
	policy string // RateLimit-Policy
	// name is the rule's name as the String that begins RateLimit's item. It and
	// policy are empty when a String cannot carry the name: the response then has
	// neither field.
	name string
}

func newLimitFields(rule *rules.Rule, limit int, quota int64) limitFields {
	lf := limitFields{quota: quota, limit: strconv.FormatInt(quota, 10)}
	var err error
	if lf.name, err = ratelimitheader.QuoteName(rule.Name); err == nil {
		lf.policy, _ = ratelimitheader.FormatPolicy(ratelimitheader.Policy{Name: rule.Name, Quota: quota,
			Window: RetryAfterSeconds(quotaWindow(rule.Limits[limit]))})
	}
	return lf
}

// limitFieldsMap holds the limitFields of every limit of a rule set's rules, by rule,
// for the Limit their decisions report (the limit's capacity).
type limitFieldsMap map[*rules.Rule][]limitFields

func newLimitFieldsMap(set *rules.Set) limitFieldsMap {
	if set == nil {
		return nil
	}
	rs := set.Rules()
	m := make(limitFieldsMap, len(rs))
	for _, r := range rs {
		lfs := make([]limitFields, len(r.Limits))
		for i, l := range r.Limits {
			lfs[i] = newLimitFields(r, i, l.Capacity())
		}
		m[r] = lfs
	}
	return m
}

// of returns the limitFields of rule.Limits[limit], nil for a rule not in m.
func (m limitFieldsMap) of(rule *rules.Rule, limit int) *limitFields {
	if lfs := m[rule]; limit >= 0 && limit < len(lfs) {
		return &lfs[limit]
	}
	return nil
}

// quotaWindow is the time over which a limit grants its whole quota: the window, or
// for the buckets the time to refill an empty bucket, at most the longest Duration
// (a valid bucket may take longer: 1 a day with a burst of 2^20).
func quotaWindow(l limiter.Limit) time.Duration {
	switch l.Algorithm {
	case limiter.TokenBucket, limiter.LeakyBucket:
		w := float64(l.Period) * float64(l.Capacity()) / float64(l.Rate)
		if w >= math.MaxInt64 {
			return math.MaxInt64 // converting w would give a negative Duration on amd64
		}
		return time.Duration(w)
	}
	return l.Period
}

// RetryAfterSeconds rounds d up to whole seconds, as Retry-After and the w and t of the
// RateLimit fields (limiter/ratelimitheader) count them (0 for d ≤ 0). It never
// overflows: rounding up divides first, so the longest Duration gives its whole
// seconds plus one, never a negative number.
func RetryAfterSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	secs := int64(d / time.Second)
	if d%time.Second != 0 {
		secs++
	}
	return secs
}
