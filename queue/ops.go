package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Info is a snapshot of a queue for operators.
type Info struct {
	Name     string
	Orphaned bool
	Config   queueconfig.Config
	// Depth and Bytes are the stream's messages and stored bytes.
	Depth uint64
	Bytes uint64
	// Oldest is when the oldest queued order was stored (zero when empty).
	Oldest time.Time
	// InFlight is the number of orders handed to dispatchers and not settled yet
	// (including those waiting for a retry).
	InFlight int
	// PausedUntil is the end of the pause of the queue's consumer (zero: not paused),
	// whether an operator (Pause) or a downstream's Retry-After set it.
	PausedUntil time.Time
	// Achieved is the number of orders per second that left the queue (delivered,
	// failed, dead-lettered or cancelled) over AchievedOver, up to the last minute,
	// across every replica: the stream's last sequence minus its messages, sampled
	// by this process. AchievedOver is 0 until two samples 5 s apart exist.
	Achieved     float64
	AchievedOver time.Duration
}

// Info returns a fresh snapshot of the queue.
func (q *Queue) Info(ctx context.Context) (Info, error) {
	si, err := q.streamInfo(ctx, 0)
	if err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) || isStreamGone(err) {
			if q.Orphaned() { // retired elsewhere
				q.store.forget(q)
			}
			return Info{}, fmt.Errorf("%w: %q (its stream is gone)", ErrUnknownQueue, q.name)
		}
		return Info{}, err
	}
	in := Info{Name: q.name, Orphaned: q.Orphaned(), Config: q.Config(), Depth: si.State.Msgs, Bytes: si.State.Bytes}
	if si.State.Msgs > 0 {
		in.Oldest = si.State.FirstTime
	}
	in.Achieved, in.AchievedOver = q.samples.rate()
	cons, err := jsproto.AskAgain(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return q.stream.Consumer(ctx, ConsumerName) })
	switch {
	case err == nil:
		ci := cons.CachedInfo()
		in.InFlight = ci.NumAckPending
		if ci.Paused && ci.PauseRemaining > 0 && ci.Config.PauseUntil != nil {
			in.PausedUntil = ci.Config.PauseUntil.UTC()
		}
	case !errors.Is(err, jetstream.ErrConsumerNotFound):
		return Info{}, unavailable("consumer of "+q.name, err)
	}
	if in.Config.Laned() {
		// The lanes' handed-out orders too (see Priorities and fairness).
		lanes, err := jsproto.AskAgain(ctx, func(ctx context.Context) (int, error) {
			pending := 0
			list := q.stream.ListConsumers(ctx)
			for ci := range list.Info() {
				if ci.Name != ConsumerName && q.consumerOf(ReadySubject(q.name, strings.TrimPrefix(ci.Name, ConsumerName+"_"), "x")) == ci.Name {
					pending += ci.NumAckPending
				}
			}
			return pending, list.Err()
		})
		if err != nil {
			return Info{}, unavailable("lanes of "+q.name, err)
		}
		in.InFlight += lanes
	}
	return in, nil
}

func isStreamGone(err error) bool { return errors.Is(err, jetstream.ErrStreamNotFound) }

// Pause stops the delivery of the queue on every dispatcher replica until until,
// through the consumer's pause on the server (the mechanism the dispatchers use for a
// downstream's Retry-After). A later Pause or Resume replaces it.
func (q *Queue) Pause(ctx context.Context, until time.Time) error {
	if _, err := q.stream.PauseConsumer(ctx, ConsumerName, until); err != nil {
		return q.consumerError("pause", err)
	}
	q.store.log.Info("queue paused", "queue", q.name, "until", until.UTC().Format(time.RFC3339))
	return nil
}

// Resume ends a pause of the queue, whoever set it (Pause, or a dispatcher after a
// downstream's 429/503 Retry-After).
func (q *Queue) Resume(ctx context.Context) error {
	if _, err := q.stream.ResumeConsumer(ctx, ConsumerName); err != nil {
		return q.consumerError("resume", err)
	}
	q.store.log.Info("queue resumed", "queue", q.name)
	return nil
}

func (q *Queue) consumerError(what string, err error) error {
	if errors.Is(err, jetstream.ErrConsumerNotFound) { // an *APIError of its code matches too
		return fmt.Errorf("%w: %q", ErrNoDispatcher, q.name)
	}
	return unavailable(what+" "+q.name, err)
}

// outflowSamples keeps (time, orders removed from the stream) pairs of the last
// minute or so, at least 5 s apart, for Info's achieved outflow.
type outflowSamples struct {
	mu sync.Mutex
	s  []outflowSample
}

type outflowSample struct {
	at      time.Time
	removed uint64
}

const (
	outflowWindow  = time.Minute
	outflowSpacing = 5 * time.Second
)

func (o *outflowSamples) add(now time.Time, st jetstream.StreamState) {
	// Work-queue retention: every order that left the stream (acknowledged, terminated
	// or deleted) is a sequence below LastSeq that is no longer a message.
	removed := st.LastSeq - min(st.Msgs, st.LastSeq)
	o.mu.Lock()
	defer o.mu.Unlock()
	if n := len(o.s); n > 0 && removed < o.s[n-1].removed {
		o.s = o.s[:0] // the stream was re-created
	}
	if n := len(o.s); n > 1 && now.Sub(o.s[n-2].at) < outflowSpacing {
		o.s[n-1] = outflowSample{now, removed} // keep the newest, spaced from the one before
	} else {
		o.s = append(o.s, outflowSample{now, removed})
	}
	// Drop what is older than the window, keeping one sample at or beyond it.
	i := 0
	for i+1 < len(o.s) && now.Sub(o.s[i+1].at) >= outflowWindow {
		i++
	}
	o.s = o.s[i:]
}

func (o *outflowSamples) rate() (float64, time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.s) < 2 {
		return 0, 0
	}
	first, last := o.s[0], o.s[len(o.s)-1]
	over := last.at.Sub(first.at)
	if over < outflowSpacing {
		return 0, 0
	}
	return float64(last.removed-first.removed) / over.Seconds(), over.Round(time.Second)
}

// SampleOutflow refreshes every queue's stream state each interval until ctx ends, so
// that Info's achieved outflow is measured even when nobody asks in between.
func (s *Store) SampleOutflow(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, q := range s.Queues() {
			ictx, cancel := context.WithTimeout(ctx, every)
			_, _ = q.streamInfo(ictx, 0)
			cancel()
		}
	}
}

// Retired reports whether the queue left the rules and its stream was deleted
// (Store.Retire): nothing is left to drain.
func (q *Queue) Retired(ctx context.Context) bool {
	if !q.Orphaned() {
		return false
	}
	return errors.Is(q.store.CheckQueue(ctx, q.name), ErrUnknownQueue)
}

// CheckQueue reports whether a queue's stream exists on the server, whether or not this
// store declared the queue (a tool such as `sluice dlq` knows no rules; dead letters of
// a retired queue stay reachable while its stream exists). Errors: ErrUnknownQueue (no
// such stream, or not a queue name), ErrUnavailable.
func (s *Store) CheckQueue(ctx context.Context, name string) error {
	if !queueconfig.ValidName(name) {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	_, err := s.js.Stream(ctx, StreamName(name))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: there is no queue %q on this NATS (no stream %s)", ErrUnknownQueue, name, StreamName(name))
	}
	return unavailable("stream of "+name, err)
}
