// Package queuetest settles parked orders the way a dispatcher does, for the tests of
// the packages that read what a dispatcher leaves behind (ticket records, events,
// dead letters) without running one: an order is settled only through its
// queue.Lease.
package queuetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// consumerConfig is the consumer Settle sets up: it holds every order it skips
// until it has found those it settles.
var consumerConfig = queue.ConsumerConfig{AckWait: time.Minute, PinnedTTL: 10 * time.Second, MaxInFlight: 100_000}

// Settle fetches the orders of tickets from q through the queue's consumer (set up
// if need be), loads and starts each, and hands its lease to settle (for example
// (*queue.Lease).Done, or CountAttempt then Retry). Orders of other tickets fetched
// meanwhile are handed back untouched (queue.Lease.Release). The handle's pin is
// released before Settle returns, so that a dispatcher started next takes the queue
// at once. It fails when ctx ends before every ticket was found, or with the first
// error of a lease.
func Settle(ctx context.Context, q *queue.Queue, settle func(*queue.Lease) error, tickets ...string) error {
	c := q.Consumer()
	if err := c.Ensure(ctx, consumerConfig); err != nil {
		return err
	}
	defer func() { _ = c.Unpin(context.WithoutCancel(ctx)) }()
	left := slices.Clone(tickets)
	for len(left) > 0 {
		nctx, cancel := context.WithTimeout(ctx, time.Second)
		l, err := c.Next(nctx)
		cancel()
		switch {
		case errors.Is(err, queue.ErrNoMessages) && ctx.Err() == nil:
			continue
		case err != nil:
			return fmt.Errorf("queuetest: %d of %d tickets not fetched (%v): %w", len(left), len(tickets), left, err)
		}
		i := slices.Index(left, l.Message().Ticket)
		if i < 0 {
			l.Release(0)
			continue
		}
		left = slices.Delete(left, i, i+1)
		if err := l.Load(ctx); err != nil {
			return err
		}
		if err := l.Start(ctx); err != nil {
			return err
		}
		if err := settle(l); err != nil {
			return err
		}
	}
	return nil
}

// Done is a settle function of Settle: the order was delivered with res.
func Done(ctx context.Context, res *queue.Result) func(*queue.Lease) error {
	return func(l *queue.Lease) error { return l.Done(ctx, res) }
}

// Failed is a settle function of Settle: one failed attempt for cause, then the
// order goes back to the queue for redelivery after after.
func Failed(ctx context.Context, after time.Duration, cause string) func(*queue.Lease) error {
	return func(l *queue.Lease) error {
		l.CountAttempt()
		return l.Retry(ctx, after, cause)
	}
}
