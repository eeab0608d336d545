package limiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Algorithm names one of the rate-limit algorithms. The names are the ones rules files use.
type Algorithm string

const (
	// TokenBucket: a bucket of Burst tokens that starts full and refills continuously at
	// Rate tokens per Period, never above Burst. A request takes n tokens.
	TokenBucket Algorithm = "token_bucket"
	// LeakyBucket, as a meter: a virtual queue of Burst places that drains continuously
	// at Rate per Period. A request is admitted while the queue has room for n more.
	// Its level is the token bucket's Burst minus its tokens, so both share one
	// implementation; they differ in how they are described and configured.
	LeakyBucket Algorithm = "leaky_bucket"
	// FixedWindow: at most Rate units per window of length Period; windows are aligned
	// to the Unix epoch and the count resets at each boundary. Rejected requests are
	// not counted.
	FixedWindow Algorithm = "fixed_window"
	// SlidingWindowLog: a log of request timestamps per key. Timestamps at or before
	// now-Period are dropped, the new request's n timestamps are added, and the request is
	// allowed when the log then holds at most Rate entries. A rejected request's
	// timestamps stay in the log (a client that keeps hammering stays blocked) unless
	// Limit.ForgiveRejected is set. Only the newest Rate timestamps can change a
	// decision, so no more are kept.
	SlidingWindowLog Algorithm = "sliding_window_log"
	// SlidingWindowCounter: counts per epoch-aligned window of length Period; the
	// estimate is the current window's count plus the previous window's count times the
	// fraction of the previous window still inside the sliding window. A request is
	// allowed when floor(estimate)+n <= Rate (for n=1: floor(estimate) < Rate), and only
	// then counted.
	SlidingWindowCounter Algorithm = "sliding_window_counter"
)

// Algorithms lists every algorithm, in the order the documentation gives them.
var Algorithms = []Algorithm{TokenBucket, LeakyBucket, FixedWindow, SlidingWindowLog, SlidingWindowCounter}

// AlgorithmNames returns the names of Algorithms, in their order: for help texts and
// error messages.
func AlgorithmNames() []string {
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = string(a)
	}
	return names
}

// Valid reports whether a names a known algorithm: one of Algorithms.
func (a Algorithm) Valid() bool { return slices.Contains(Algorithms, a) }

// FailureMode says what a shared store does for a limit while its backend (Redis) fails.
type FailureMode string

const (
	// FailLocal decides with an in-process memory store and the same limit (the default).
	FailLocal FailureMode = "local"
	// FailOpen allows every request.
	FailOpen FailureMode = "open"
	// FailClosed rejects every request.
	FailClosed FailureMode = "closed"
)

// Limit describes one rate limit. The zero value is not valid; see Validate.
type Limit struct {
	Algorithm Algorithm
	// Rate is the number of units per Period: the limit per window for the window
	// algorithms, the refill rate (token bucket) or outflow rate (leaky bucket).
	Rate int64
	// Period is the window length, or the time over which Rate units refill or drain.
	// Any length of at least one microsecond; it is used to the microsecond.
	Period time.Duration
	// Burst is the bucket size of the token and leaky buckets; 0 means Rate.
	// The window algorithms ignore it.
	Burst int64
	// ForgiveRejected makes the sliding window log forget rejected requests
	// instead of recording them. Other algorithms never record rejected requests.
	ForgiveRejected bool
	// FailureMode applies to stores with a remote backend; empty means FailLocal.
	FailureMode FailureMode
}

// Capacity is the most units a key can be granted at once: Burst for the buckets
// (Rate when Burst is 0), Rate for the window algorithms. It is the Decision's Limit.
func (l Limit) Capacity() int64 {
	if (l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket) && l.Burst > 0 {
		return l.Burst
	}
	return l.Rate
}

// ErrInvalidLimit is wrapped by every error about a malformed Limit or request size.
var ErrInvalidLimit = errors.New("invalid limit")

// Validate reports what is wrong with l, wrapping ErrInvalidLimit.
func (l Limit) Validate() error {
	switch {
	case !l.Algorithm.Valid():
		return fmt.Errorf("%w: unknown algorithm %q", ErrInvalidLimit, l.Algorithm)
	case l.Rate <= 0:
		return fmt.Errorf("%w: rate must be positive, got %d", ErrInvalidLimit, l.Rate)
	case l.Period < time.Microsecond:
		return fmt.Errorf("%w: period must be at least 1µs, got %v", ErrInvalidLimit, l.Period)
	case l.Burst < 0:
		return fmt.Errorf("%w: burst must not be negative, got %d", ErrInvalidLimit, l.Burst)
	case l.Rate >= algo.MaxMicros || l.Burst >= algo.MaxMicros || l.Period.Microseconds() >= algo.MaxMicros:
		return fmt.Errorf("%w: rate, burst or period too large", ErrInvalidLimit)
	}
	if !l.FailureMode.known() {
		return fmt.Errorf("%w: unknown failure mode %q", ErrInvalidLimit, l.FailureMode)
	}
	return nil
}

// ValidateRequest reports what is wrong with a request of n units under l: n below 1,
// or what Validate reports. Stores call it before deciding.
func (l Limit) ValidateRequest(n int64) error {
	if n < 1 {
		return fmt.Errorf("%w: n must be at least 1, got %d", ErrInvalidLimit, n)
	}
	return l.Validate()
}

// known reports whether m is a failure mode or empty.
func (m FailureMode) known() bool {
	switch m {
	case "", FailLocal, FailOpen, FailClosed:
		return true
	}
	return false
}

// Never is the RetryAfter of a request that can never be allowed: n exceeds the capacity.
const Never = time.Duration(math.MaxInt64)

// Decision is the outcome of one check.
type Decision struct {
	// Allowed reports whether the n units were granted (and recorded).
	Allowed bool
	// Limit is the capacity of the limit (see Limit.Capacity).
	Limit int64
	// Remaining is how many units a request could still be granted right after this one.
	Remaining int64
	// RetryAfter is, for a rejected request, how long until the same request would be
	// allowed if nothing else happened; Never when n exceeds the capacity; 0 when allowed.
	// Like ResetAfter, a time of 2^53 µs (about 285 years) or more saturates at the
	// longest Duration, which is Never.
	RetryAfter time.Duration
	// ResetAfter is how long until the key is back to its full quota if nothing else
	// happens. A valid limit may take longer than a Duration holds (1 a day with a
	// burst of 2^20); from 2^53 µs on it is the longest Duration.
	ResetAfter time.Duration
}

// Limiter decides whether n units for key fit within l. Implementations are safe for
// concurrent use. The key must identify one limit: callers prefix it with the rule.
type Limiter interface {
	AllowN(ctx context.Context, key string, l Limit, n int64) (Decision, error)
}
