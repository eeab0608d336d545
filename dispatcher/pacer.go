package dispatcher

import (
	"context"
	"math/bits"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Pacer hands out start times at an even rate: a leaking bucket that holds one event.
//
// Guarantee: for the times Wait returns (read from the pacer's clock at the moment it
// grants), every interval of length Δt > 0 holds at most ceil(rate × Δt) + 1 of them —
// whatever the load, however late the goroutine wakes up, and across pauses and rate
// changes.
//
// How. Slots lie on an exact grid: slot k = anchor + k × Period / Count (integer
// arithmetic, no drift). Wait sleeps until the next slot and grants it at the current
// time if it is late by at most the tolerance τ (default half an interval, at most
// DefaultTolerance; always less than one interval). A slot that is later than that is not caught up: the grid restarts at
// now − τ, so a stall costs throughput but never causes a burst. With every start at
// most τ < 1/rate after its slot and slots at least 1/rate apart, n + 1 starts span more
// than (n − 1)/rate, which is the bound above.
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

	mu          sync.Mutex
	count       uint64
	period      uint64 // ns
	tol         time.Duration
	anchor      time.Time
	k           uint64
	started     bool
	pausedUntil time.Time
	last        time.Time
}

// DefaultTolerance caps the default tolerance (half an interval) of a Pacer. Sleeps of
// SystemClock are late by ~0.1 ms on an idle machine, so this loses no slot there, while
// keeping starts at least 1/rate − 2 ms apart leaves the rest of the interval to absorb
// jitter between the dispatcher and the downstream.
const DefaultTolerance = 2 * time.Millisecond

// PacerOption configures a Pacer.
type PacerOption func(*Pacer)

// WithClock sets the pacer's clock (default SystemClock).
func WithClock(c Clock) PacerOption { return func(p *Pacer) { p.clock = c } }

// WithTolerance sets how late a slot may be granted before the schedule restarts
// (default: half the interval, at most DefaultTolerance). Above the interval the bound
// loosens, see Pacer.
func WithTolerance(d time.Duration) PacerOption { return func(p *Pacer) { p.tolSet = d } }

// NewPacer returns a pacer for rate, which must be valid (Count and Period > 0).
func NewPacer(rate limiter.Rate, opts ...PacerOption) *Pacer {
	p := &Pacer{clock: SystemClock{}, turn: make(chan struct{}, 1)}
	for _, o := range opts {
		o(p)
	}
	p.setRateLocked(rate)
	return p
}

func (p *Pacer) setRateLocked(rate limiter.Rate) {
	if !rate.Valid() {
		panic("dispatcher: pacer rate must be positive")
	}
	p.count, p.period = uint64(rate.Count), uint64(rate.Period)
	p.tol = p.tolSet
	if p.tol <= 0 {
		p.tol = min(time.Duration(p.period/p.count/2), DefaultTolerance)
	}
}

// SetRate changes the rate; the next slot is one new interval after the last grant.
func (p *Pacer) SetRate(rate limiter.Rate) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.count == uint64(rate.Count) && p.period == uint64(rate.Period) {
		return
	}
	p.setRateLocked(rate)
	if p.started {
		p.anchor, p.k = p.last.Add(p.offset(1)), 0
	}
}

// Rate returns the current rate.
func (p *Pacer) Rate() limiter.Rate {
	p.mu.Lock()
	defer p.mu.Unlock()
	return limiter.Rate{Count: int64(p.count), Period: time.Duration(p.period)}
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

// slotLocked returns the next slot as seen at now, restarting the grid after pauses and
// after slots missed by more than the tolerance.
func (p *Pacer) slotLocked(now time.Time) time.Time {
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

// Wait blocks until the caller may start and returns the start time (the pacer clock's
// reading when it granted). It returns ctx's error if ctx ends first; no slot is used.
func (p *Pacer) Wait(ctx context.Context) (time.Time, error) {
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
		p.mu.Unlock()
		if err := p.clock.Sleep(ctx, slot.Sub(now)); err != nil {
			return time.Time{}, err
		}
	}
}

// Next returns the earliest time the next start can be granted.
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
