package ingress

import "time"

// RetryAfterSeconds rounds d up to whole seconds, as Retry-After and the w and t of the
// RateLimit fields (limiter/ratelimitheader) count them (0 for d ≤ 0). It never overflows: rounding up divides first,
// so the longest Duration gives its whole seconds plus one, never a negative number.
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
