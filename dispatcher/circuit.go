package dispatcher

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluicehq/sluice/queue"
)

// downKind tells how a failed attempt says the downstream is down rather than the
// order being at fault.
type downKind int

const (
	downNone    downKind = iota
	downRefused          // no connection (refused, unreachable, DNS, no NATS responder): nothing reached the downstream
	downTimeout          // no answer in time
)

// transportFailure classifies an error of the HTTP client.
func transportFailure(err error) downKind {
	var op *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &op) && op.Op == "dial", errors.As(err, &dns):
		return downRefused
	case timedOut(err):
		return downTimeout
	}
	return downNone
}

// timedOut reports whether err of the HTTP client is a timeout: the delivery's
// deadline, or a network timeout.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
}

// publishFailure classifies an error of queue.Store.Forward.
func publishFailure(err error) downKind {
	switch {
	case errors.Is(err, queue.ErrUnavailable):
		return downRefused
	case errors.Is(err, context.DeadlineExceeded):
		return downTimeout
	}
	return downNone
}

// circuit pauses a queue whose downstream is down. Consecutive attempts that found it
// down (threshold of them) open it: the queue pauses, then one order at a time probes
// it on an exponential backoff; the first attempt that reaches the downstream (any
// answer) closes it. Attempts while it is open are not counted against the orders.
type circuit struct {
	threshold int

	mu        sync.Mutex
	streak    int
	open      bool
	until     time.Time // end of the current pause while open
	bo        *backoff.ExponentialBackOff
	probeDone chan struct{} // non-nil while a probe runs; closed when it ends
}

func newCircuit(threshold int, maxInterval time.Duration) *circuit {
	bo := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(min(time.Second, maxInterval)),
		backoff.WithMaxInterval(maxInterval),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.2),
		backoff.WithMaxElapsedTime(0),
	)
	return &circuit{threshold: threshold, bo: bo}
}

// admit lets a delivery start. While the circuit is open only one delivery (the probe)
// runs at a time: admit waits for the running one to end. ok is false when ctx ended.
func (c *circuit) admit(ctx context.Context) (probe, ok bool) {
	for {
		c.mu.Lock()
		if !c.open {
			c.mu.Unlock()
			return false, true
		}
		if c.probeDone == nil {
			c.probeDone = make(chan struct{})
			c.mu.Unlock()
			return true, true
		}
		done := c.probeDone
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return false, false
		case <-done:
		}
	}
}

// cancel ends a probe that was admitted but not started.
func (c *circuit) cancel(probe bool) {
	if !probe {
		return
	}
	c.mu.Lock()
	c.endProbe()
	c.mu.Unlock()
}

func (c *circuit) endProbe() {
	if c.probeDone != nil {
		close(c.probeDone)
		c.probeDone = nil
	}
}

// record takes the outcome of an attempt. open tells whether the circuit is open after
// it (the attempt is then not counted and the order waits until until); changed
// whether this attempt opened or closed it.
func (c *circuit) record(down downKind, probe bool, now time.Time) (open bool, until time.Time, changed bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if probe {
		c.endProbe()
	}
	if down == downNone {
		c.streak = 0
		if c.open {
			c.open, c.until = false, time.Time{}
			return false, time.Time{}, true
		}
		return false, time.Time{}, false
	}
	c.streak++
	switch {
	case c.open && probe:
		c.until = now.Add(c.bo.NextBackOff())
	case c.open:
		// A delivery started before the circuit opened: it waits for the next probe.
	case c.streak >= c.threshold:
		c.open, changed = true, true
		c.bo.Reset()
		c.until = now.Add(c.bo.NextBackOff())
	default:
		return false, time.Time{}, false
	}
	return true, c.until, changed
}

func (c *circuit) isOpen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.open
}
