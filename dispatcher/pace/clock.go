package pace

import (
	"context"
	"time"
)

// Clock is the time source of a Pacer. Tests inject a simulated one.
type Clock interface {
	Now() time.Time
	// Sleep returns after d has passed on this clock, or early with ctx's error.
	Sleep(ctx context.Context, d time.Duration) error
}

// SystemClock is the real clock with precise sleeps.
//
// Go timers fire with about one millisecond of granularity on Linux (the runtime's
// poller waits in whole milliseconds), which is as long as the gap between two
// deliveries at 1000/s. SystemClock therefore sleeps on a Go timer until about two
// milliseconds before the deadline (cancellable) and sleeps the rest in a nanosleep
// system call on the calling goroutine's thread, which wakes within ~0.1 ms.
type SystemClock struct{}

// Now returns time.Now().
func (SystemClock) Now() time.Time { return time.Now() }

// coarseMargin is how long before a deadline the cancellable Go timer hands over to
// the precise sleep.
const coarseMargin = 2 * time.Millisecond

// Sleep sleeps for d (see SystemClock).
func (SystemClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	deadline := time.Now().Add(d)
	if d > coarseMargin {
		t := time.NewTimer(d - coarseMargin)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
	if rest := time.Until(deadline); rest > 0 {
		preciseSleep(rest)
	}
	return ctx.Err()
}
