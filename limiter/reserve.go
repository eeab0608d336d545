package limiter

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Pace is the leaking bucket of a rule that holds requests over its limit (rules'
// on_limit: wait): one slot every Interval, and a request waits at most MaxWait for
// its slot.
type Pace struct {
	// Interval is the time between two slots: the rule's Period divided by its Rate.
	// At least one microsecond; it is used to the microsecond.
	Interval time.Duration
	// MaxWait is the longest a reservation may wait for its slot; 0 reserves only a
	// slot that starts now.
	MaxWait time.Duration
	// FailureMode applies to stores with a remote backend; empty means FailLocal.
	FailureMode FailureMode
}

// Validate reports what is wrong with p, wrapping ErrInvalidLimit.
func (p Pace) Validate() error {
	switch {
	case p.Interval < time.Microsecond || p.Interval.Microseconds() >= algo.MaxMicros:
		return fmt.Errorf("%w: pace interval must be at least 1µs, got %v", ErrInvalidLimit, p.Interval)
	case p.MaxWait < 0 || p.MaxWait.Microseconds() >= algo.MaxMicros:
		return fmt.Errorf("%w: max wait must not be negative, got %v", ErrInvalidLimit, p.MaxWait)
	case !p.FailureMode.known():
		return fmt.Errorf("%w: unknown failure mode %q", ErrInvalidLimit, p.FailureMode)
	}
	return nil
}

// PaceOf is the pace of l's rate: one slot every l.Period / l.Rate (at least 1µs).
func PaceOf(l Limit, maxWait time.Duration) Pace {
	return Pace{Interval: max(l.Period/time.Duration(max(l.Rate, 1)), time.Microsecond), MaxWait: maxWait, FailureMode: l.FailureMode}
}

// Reservation is the outcome of Reserver.Reserve.
type Reservation struct {
	// OK reports that a slot was reserved: the request may go at Wait from now.
	OK bool
	// Wait is the time from now until the slot starts (0: now). When !OK it is the
	// wait the request would have had, more than MaxWait; it is then less by MaxWait
	// until a reservation would succeed.
	Wait time.Duration
	// Remaining is how many reservations would still succeed right after this one.
	Remaining int64
	// ResetAfter is how long until every reserved slot has started.
	ResetAfter time.Duration
	// Slot names the reservation for Cancel (µs; store-specific).
	Slot int64
}

// RetryAfter is how long a refused request should wait before asking again: until a
// reservation would be within p.MaxWait; 0 for a reserved one.
func (r Reservation) RetryAfter(p Pace) time.Duration {
	if r.OK {
		return 0
	}
	return max(r.Wait-p.MaxWait, 0)
}

// Reserver reserves paced slots: a leaking bucket per key, slots p.Interval apart,
// each reservation taking the next free one (GCRA's theoretical arrival time), or
// refused when that slot would start later than p.MaxWait from now. Stores that
// implement Limiter (Memory, redisstore.Store) implement it; keys are the callers'
// and must not be shared with Limiter.AllowN.
type Reserver interface {
	Reserve(ctx context.Context, key string, p Pace) (Reservation, error)
	// Cancel gives back reservation r of key (one whose holder will not use its
	// slot: a client that went away). When no reservation of the key was made after
	// r, its slot goes to the next caller; otherwise the slot stays taken and is
	// skipped (the outflow has a gap of one Interval), so that no slot is ever given
	// twice. Cancelling a refused reservation does nothing.
	Cancel(ctx context.Context, key string, p Pace, r Reservation) error
}

// reserveParams sets p to pace's numbers for the Reserve algorithm (cancel: the
// slot to give back, 0 to reserve).
func reserveParams(p *algo.Params, pace Pace, cancel int64) error {
	if err := pace.Validate(); err != nil {
		return err
	}
	*p = algo.Params{Algorithm: algo.Reserve, Rate: 1, Period: pace.Interval.Microseconds(),
		Capacity: pace.MaxWait.Microseconds(), Cancel: cancel}
	return nil
}

// Reserve implements Reserver. It returns an error only for an invalid pace.
func (m *Memory) Reserve(_ context.Context, key string, pace Pace) (Reservation, error) {
	var p algo.Params
	if err := reserveParams(&p, pace, 0); err != nil {
		return Reservation{}, err
	}
	return reservationOf(m.decide(key, &p, 1), &p), nil
}

// Cancel implements Reserver.
func (m *Memory) Cancel(_ context.Context, key string, pace Pace, r Reservation) error {
	if !r.OK || r.Slot == 0 {
		return nil
	}
	var p algo.Params
	if err := reserveParams(&p, pace, r.Slot); err != nil {
		return err
	}
	m.decide(key, &p, 1)
	return nil
}

// reservationOf is the Reservation of a Reserve outcome of p (see algo's reserve).
func reservationOf(o algo.Outcome, p *algo.Params) Reservation {
	return Reservation{OK: o.Allowed, Wait: algo.Duration(o.RetryAfter),
		Remaining:  algo.ReserveRemaining(o.ResetAfter, p.Period, p.Capacity),
		ResetAfter: algo.Duration(o.ResetAfter), Slot: o.Remaining}
}
