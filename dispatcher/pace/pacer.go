package pace

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// ErrInvalidOption reports a constructor argument, option or rate that cannot work: a
// rate that is not positive, a negative tolerance, a nil clock.
var ErrInvalidOption = errors.New("pace: invalid option")

// Pacer hands out start times at an even rate: a leaking bucket that holds one event.
//
// Guarantee: for the times Wait and Grant return (read from the pacer's clock at the
// moment it grants), every interval of length Δt > 0 holds at most ceil(rate × Δt) + 1
// of them — whatever the load, however late the goroutine wakes up, and across pauses,
// spreads and rate changes (the rate being the one set at the time).
//
// How. Slots lie on an exact grid: slot k = anchor + k × Period / Count (integer
// arithmetic, no drift). Wait sleeps until the next slot and grants it at the current
// time if it is late by at most the tolerance τ (default half an interval, at most
// DefaultTolerance; always less than one interval). A slot that is later than that is
// not caught up: the grid restarts at now − τ, so a stall costs throughput but never
// causes a burst. With every start at most τ < 1/rate after its slot and slots at least
// 1/rate apart, n + 1 starts span more than (n − 1)/rate, which is the bound above.
// When the rate in force changes (SetRate, or a spread beginning or ending), the grid
// restarts one new interval after the last grant.
//
// Consequences. At most one start per wake-up (two starts in one wake-up would be
// closer than 1/rate − τ apart in the worst case), so a pacer is only as fast as its
// clock's sleeps are precise: SystemClock sleeps within ~0.1 ms, good for a few thousand
// starts per second. A larger tolerance (WithTolerance, may exceed 1/rate) allows
// several starts per wake-up for higher rates at the price of a looser bound:
// floor(rate × (Δt + τ)) + 1.
//
// Waiters are served one at a time in arrival order. Pacer is safe for concurrent use.
type Pacer struct {
	clock  Clock
	turn   chan struct{}
	tolSet time.Duration

	mu            sync.Mutex
	rate          limiter.Rate // as set by New and SetRate
	tol           time.Duration
	count, period uint64 // the grid's rate (period in ns): rate, or a slower spread
	anchor        time.Time
	k             uint64
	started       bool
	last          time.Time
	pausedUntil   time.Time
	spread        limiter.Rate // in force before spreadUntil, when slower than rate
	spreadUntil   time.Time
}

// DefaultTolerance caps the default tolerance (half an interval) of a Pacer. Sleeps of
// SystemClock are late by ~0.1 ms on an idle machine, so this loses no slot there, while
// keeping starts at least 1/rate − 2 ms apart leaves the rest of the interval to absorb
// jitter between the caller and the remote side.
const DefaultTolerance = 2 * time.Millisecond

// Option configures a Pacer.
type Option func(*Pacer)

// WithClock sets the pacer's clock (default SystemClock).
func WithClock(c Clock) Option { return func(p *Pacer) { p.clock = c } }

// WithTolerance sets how late a slot may be granted before the schedule restarts
// (default: half the interval, at most DefaultTolerance). Above the interval the bound
// loosens, see Pacer.
func WithTolerance(d time.Duration) Option { return func(p *Pacer) { p.tolSet = d } }

// New returns a pacer for rate. It fails with ErrInvalidOption for a rate that is not
// positive, a negative tolerance or a nil clock.
func New(rate limiter.Rate, opts ...Option) (*Pacer, error) {
	p := &Pacer{clock: SystemClock{}, turn: make(chan struct{}, 1)}
	for _, o := range opts {
		o(p)
	}
	if p.clock == nil {
		return nil, fmt.Errorf("%w: nil clock", ErrInvalidOption)
	}
	if p.tolSet < 0 {
		return nil, fmt.Errorf("%w: negative tolerance %s", ErrInvalidOption, p.tolSet)
	}
	if err := p.SetRate(rate); err != nil {
		return nil, err
	}
	return p, nil
}

// SetRate changes the rate; the next slot is one new interval after the last grant. It
// fails with ErrInvalidOption, and changes nothing, for a rate that is not positive.
func (p *Pacer) SetRate(rate limiter.Rate) error {
	if !rate.Valid() {
		return fmt.Errorf("%w: pacing rate %d/%s must be positive", ErrInvalidOption, rate.Count, rate.Period)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.rate = rate
	p.tol = p.tolSet
	if p.tol <= 0 {
		// From the set rate, not a spread's: a spread is slower, so τ stays below
		// every interval in force and the bound's argument holds across spreads.
		p.tol = min(rate.Period/time.Duration(rate.Count)/2, DefaultTolerance)
	}
	return nil
}

// Rate returns the rate set by New or SetRate (a spread does not change it).
func (p *Pacer) Rate() limiter.Rate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// slower reports whether a is a slower rate than b (a longer interval).
func slower(a, b limiter.Rate) bool {
	// a.Period/a.Count > b.Period/b.Count, compared exactly in 128 bits.
	ah, al := bits.Mul64(uint64(a.Period), uint64(b.Count))
	bh, bl := bits.Mul64(uint64(b.Period), uint64(a.Count))
	return ah > bh || ah == bh && al > bl
}

// rateAtLocked is the rate in force at now: the set rate, or a slower spread.
func (p *Pacer) rateAtLocked(now time.Time) limiter.Rate {
	if now.Before(p.spreadUntil) && slower(p.spread, p.rate) {
		return p.spread
	}
	return p.rate
}

// offset is k × period / count without overflow (k × period fits in 128 bits).
func (p *Pacer) offset(k uint64) time.Duration {
	hi, lo := bits.Mul64(k, p.period)
	if hi >= p.count {
		return time.Duration(1<<63 - 1)
	}
	q, _ := bits.Div64(hi, lo, p.count)
	if q > 1<<62 {
		return time.Duration(1 << 62)
	}
	return time.Duration(q)
}

// slotLocked returns the next slot as seen at now, restarting the grid after rate
// changes, pauses and slots missed by more than the tolerance.
func (p *Pacer) slotLocked(now time.Time) time.Time {
	if r := p.rateAtLocked(now); uint64(r.Count) != p.count || uint64(r.Period) != p.period {
		p.count, p.period = uint64(r.Count), uint64(r.Period)
		if p.started {
			p.anchor, p.k = p.last.Add(p.offset(1)), 0
		}
	}
	if !p.started {
		p.anchor, p.k, p.started = now, 0, true
	}
	if p.k >= 1<<20 { // keep k small; the anchor moves onto the current slot exactly
		p.anchor, p.k = p.anchor.Add(p.offset(p.k)), 0
	}
	slot := p.anchor.Add(p.offset(p.k))
	if p.pausedUntil.After(slot) {
		p.anchor, p.k = p.pausedUntil, 0
		slot = p.anchor
	}
	if floor := now.Add(-p.tol); slot.Before(floor) {
		p.anchor, p.k = floor, 0
		slot = floor
	}
	return slot
}

// Wait blocks until the caller may start, like x/time/rate's Limiter.Wait with a burst
// of 1. It returns ctx's error if ctx ends first; no slot is used then.
func (p *Pacer) Wait(ctx context.Context) error {
	_, err := p.Grant(ctx)
	return err
}

// Grant is Wait that also returns the start time: the pacer clock's reading when it
// granted, the time the bound holds for.
func (p *Pacer) Grant(ctx context.Context) (time.Time, error) {
	select {
	case p.turn <- struct{}{}:
	case <-ctx.Done():
		return time.Time{}, ctx.Err()
	}
	defer func() { <-p.turn }()
	for {
		if err := ctx.Err(); err != nil {
			return time.Time{}, err
		}
		now := p.clock.Now()
		p.mu.Lock()
		slot := p.slotLocked(now)
		if !slot.After(now) {
			p.k++
			p.last = now
			p.mu.Unlock()
			return now, nil
		}
		// A spread that ends before the slot ends its longer interval with it.
		wake := slot
		if p.spreadUntil.After(now) && p.spreadUntil.Before(wake) {
			wake = p.spreadUntil
		}
		p.mu.Unlock()
		if err := p.clock.Sleep(ctx, wake.Sub(now)); err != nil {
			return time.Time{}, err
		}
	}
}

// Next returns the earliest time the next start can be granted (as things stand: a
// spread ending earlier brings it forward).
func (p *Pacer) Next() time.Time {
	now := p.clock.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.slotLocked(now)
}

// PauseUntil holds every start until t (a later call may extend, never shorten, it).
func (p *Pacer) PauseUntil(t time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if t.After(p.pausedUntil) {
		p.pausedUntil = t
	}
}

// Resume ends a pause at once (an operator resumed the queue).
func (p *Pacer) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pausedUntil = time.Time{}
}

// PausedUntil returns the end of the current pause (zero or past: not paused).
func (p *Pacer) PausedUntil() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.pausedUntil
}

// Spread adapts the pacer to a quota the remote side reports: remaining more starts
// are allowed until the quota resets at reset (on the pacer's clock).
//
//   - remaining ≤ 0: every start waits for reset, as PauseUntil(reset).
//   - remaining > 0, and remaining starts at the pacer's rate would come before reset
//     (remaining < rate × (reset − now)): until reset the pacer runs at
//     remaining / (reset − now), spreading the remaining starts evenly over the time
//     left instead of spending them at once and meeting a 429. The first of them is
//     one such interval after the last grant; at reset the set rate returns.
//   - otherwise, or when reset is not after now: no slowdown.
//
// Each call replaces the spread of the previous one (the latest report is the most
// current); a pause it set is only ever extended, as with PauseUntil. The spread never
// makes the pacer faster than its rate, so the bound holds with the set rate.
func (p *Pacer) Spread(remaining int64, reset time.Time) {
	now := p.clock.Now()
	if remaining <= 0 {
		p.PauseUntil(reset)
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if !reset.After(now) {
		p.spread, p.spreadUntil = limiter.Rate{}, time.Time{}
		return
	}
	p.spread, p.spreadUntil = limiter.Rate{Count: remaining, Period: reset.Sub(now)}, reset
}

// rateAt returns the rate in force at now (the set rate, or a slower spread).
func (p *Pacer) rateAt(now time.Time) limiter.Rate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rateAtLocked(now)
}
