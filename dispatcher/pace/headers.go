package pace

import (
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter/ratelimitheader"
)

// Quota is what a response says about the caller's remaining quota: Remaining more
// requests are allowed until the quota resets, Reset from when the response was read.
type Quota struct {
	Policy    string // the draft's policy name; "" for X-RateLimit-* fields
	Remaining int64
	Reset     time.Duration // > 0
}

// ParseQuota reads the quota a response reports, from any of these fields:
//
//   - RateLimit (draft-ietf-httpapi-ratelimit-headers-11): a Structured Field list of
//     policies, `"name";r=REMAINING;t=SECONDS_TO_RESET`, read by limiter/ratelimitheader
//     (the codec the front door writes it with). An item without t takes the window w
//     of the RateLimit-Policy item of the same name (`"name";q=QUOTA;w=SECONDS`): the
//     quota resets at the latest one window from now. An item with neither, with a
//     negative or non-Integer r or t, or whose name is not a String, is skipped; a
//     field that is not a valid list is ignored whole.
//   - X-RateLimit-Remaining with X-RateLimit-Reset (the de-facto pair; one without the
//     other says nothing usable). Remaining is a non-negative integer. Reset is a
//     non-negative number of seconds, fraction allowed, read by its size: below 10⁹ it
//     is seconds from now (10⁹ s is 31 years, longer than any window); from 10⁹ to
//     below 10¹² it is a Unix time in seconds (10⁹ is September 2001); from 10¹² a
//     Unix time in milliseconds. A reset at or before now is skipped (the quota has
//     already been refilled).
//
// When several quotas are reported, ParseQuota returns the most restrictive: the one
// that allows the fewest requests per second until its reset (Remaining / Reset), a
// quota with nothing remaining before any other, the later reset first among those.
// ok is false when no field gives a usable quota.
func ParseQuota(h http.Header, now time.Time) (q Quota, ok bool) {
	take := func(c Quota) {
		if c.Remaining < 0 || c.Reset <= 0 {
			return
		}
		if !ok || tighter(c, q) {
			q, ok = c, true
		}
	}
	if vs := h.Values("RateLimit"); len(vs) > 0 {
		if statuses, err := ratelimitheader.ParseRateLimit(strings.Join(vs, ", ")); err == nil {
			var policies []ratelimitheader.Policy
			if pv := h.Values("RateLimit-Policy"); len(pv) > 0 {
				policies, _ = ratelimitheader.ParsePolicy(strings.Join(pv, ", "))
			}
			for _, s := range statuses {
				t := s.Reset
				if t == ratelimitheader.NoReset {
					t = window(policies, s.Name) // 0 without one: skipped
				}
				take(Quota{Policy: s.Name, Remaining: s.Remaining, Reset: seconds(float64(t))})
			}
		}
	}
	if rem, reset := h.Get("X-RateLimit-Remaining"), h.Get("X-RateLimit-Reset"); rem != "" && reset != "" {
		r, errR := strconv.ParseInt(strings.TrimSpace(rem), 10, 64)
		d, okD := parseReset(reset, now)
		if errR == nil && okD {
			take(Quota{Remaining: r, Reset: d})
		}
	}
	return q, ok
}

// window returns the window of the first policy named name, 0 without one.
func window(policies []ratelimitheader.Policy, name string) int64 {
	for _, p := range policies {
		if p.Name == name {
			return p.Window
		}
	}
	return 0
}

// tighter reports whether a allows fewer requests per unit of time than b:
// a.Remaining / a.Reset < b.Remaining / b.Reset, compared exactly; with nothing
// remaining in both, the later reset.
func tighter(a, b Quota) bool {
	if a.Remaining == 0 && b.Remaining == 0 {
		return a.Reset > b.Reset
	}
	ah, al := bits.Mul64(uint64(a.Remaining), uint64(b.Reset))
	bh, bl := bits.Mul64(uint64(b.Remaining), uint64(a.Reset))
	return ah < bh || ah == bh && al < bl
}

// Thresholds of X-RateLimit-Reset, see ParseQuota.
const (
	epochSeconds = 1e9
	epochMillis  = 1e12
)

// parseReset reads X-RateLimit-Reset as ParseQuota documents.
func parseReset(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if !isDecimal(v) {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	var d time.Duration
	switch {
	case f < epochSeconds:
		d = seconds(f)
	case f < epochMillis:
		d = epochAfter(f*1e9, now)
	default:
		d = epochAfter(f*1e6, now)
	}
	return d, d > 0
}

// isDecimal reports whether v is digits with at most one '.' between digits: what
// ParseFloat would also read as hex, with exponents, signs, Inf or NaN is refused.
func isDecimal(v string) bool {
	dot := -1
	for i := 0; i < len(v); i++ {
		switch {
		case '0' <= v[i] && v[i] <= '9':
		case v[i] == '.' && dot < 0 && i > 0 && i < len(v)-1:
			dot = i
		default:
			return false
		}
	}
	return v != ""
}

// epochAfter returns how long after now the Unix time ns is (≤ 0: not after).
func epochAfter(ns float64, now time.Time) time.Duration {
	if ns >= float64(math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Unix(0, int64(ns)).Sub(now)
}

// seconds converts a non-negative number of seconds to a Duration, saturating.
func seconds(f float64) time.Duration {
	if f*1e9 >= float64(math.MaxInt64) {
		return math.MaxInt64
	}
	return time.Duration(f * 1e9)
}

// RetryAfter reads a Retry-After field: delay-seconds or an HTTP-date (RFC 9110
// §10.2.3), returned as the time from now (0 for a date in the past; seconds are capped
// at 2³¹). ok is false when it is missing or malformed.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, 1<<31)) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
