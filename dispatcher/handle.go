package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// prepared is a fetched order that passed its checks and waits for a pacing slot.
type prepared struct {
	l   *queue.Lease
	cfg queueconfig.Config
}

// Reasons of dead letters that were never attempted (the first word of the reason
// stored with the dead letter; also the reason label of sluice_queue_rejected_total).
const (
	reasonForged  = "forged"  // no valid signature: not an order sluice accepted
	reasonInvalid = "invalid" // signed, but cannot be delivered (e.g. a path without a leading '/')
)

// prepare checks one fetched order: it must be signed with the store's key,
// deliverable, and its ticket not final yet. ok is false when the order was settled
// here.
func (r *runner) prepare(ctx context.Context, l *queue.Lease) (p prepared, ok bool) {
	m := l.Message()
	if err := l.Verify(); err != nil {
		r.reject(l, reasonForged, err)
		return p, false
	}
	cfg := r.config()
	r.mu.Lock()
	tgt := r.target
	r.mu.Unlock()
	if err := tgt.check(m); err != nil {
		r.reject(l, reasonInvalid, err)
		return p, false
	}
	switch err := l.Load(context.WithoutCancel(ctx)); {
	case errors.Is(err, queue.ErrFinal):
		r.log.Debug("ticket already final; acknowledging", "ticket", m.Ticket, "err", err)
		return p, false
	case err != nil:
		r.log.Warn("cannot read the ticket record; retrying later", "ticket", m.Ticket, "err", err)
		return p, false
	}
	if rec := l.Record(); rec.Attempts >= cfg.MaxAttempts {
		// A previous dead-lettering did not complete.
		r.deadLetter(l, rec.LastError, rec.LastError, cfg)
		return p, false
	}
	// Age counts from when the message was stored in the queue, so a re-queued dead
	// letter gets a fresh max_age.
	if cfg.MaxAge > 0 && time.Since(m.StoredAt) > cfg.MaxAge {
		why := fmt.Sprintf("expired: waited longer than max_age (%s)", cfg.MaxAge)
		r.deadLetter(l, why, why, cfg)
		return p, false
	}
	return prepared{l: l, cfg: cfg}, true
}

// paceLoop starts the deliveries of prepared orders, each at its pacing slot, in the
// order they were fetched. It returns when ready is closed; what it receives after ctx
// ended goes back to the queue at once.
func (r *runner) paceLoop(ctx context.Context, ready <-chan prepared) {
	for p := range ready {
		if ctx.Err() != nil {
			handBack(p.l)
			continue
		}
		// While the circuit is open one order at a time probes the downstream.
		probe, ok := r.cb.admit(ctx)
		if !ok {
			handBack(p.l)
			continue
		}
		// A pause longer than a pull request's life: give the order back until the
		// pause ends instead of holding it (the server holds the others).
		r.mu.Lock()
		fetchWait := r.fetchWait
		r.mu.Unlock()
		now := time.Now()
		if until := r.pacer.PausedUntil(); until.Sub(now) > fetchWait {
			r.cb.cancel(probe)
			p.l.Release(pauseNakDelay(until.Sub(now)))
			continue
		}
		release, ok := r.flowTurn(ctx, p)
		if !ok {
			r.cb.cancel(probe)
			continue
		}
		start, err := r.pacer.Grant(ctx)
		if err != nil { // shutting down: hand it to another dispatcher at once
			r.cb.cancel(probe)
			release()
			handBack(p.l)
			continue
		}
		r.deliveries.Add(1)
		go func() {
			defer r.deliveries.Done()
			defer release()
			r.deliver(p.l, p.cfg, start, probe)
		}()
	}
}

// flowTurn asks whether p's flow key lets it start (see queueconfig.FlowBy); ok
// false: the order was settled here (handed back until its key's turn, or because
// the dispatcher stops). release ends the key's count of p's delivery.
//
// The key is asked once the queue's own slot is due (it waits for that slot first,
// without taking it; this loop alone takes slots), so that the key's pace is the pace
// of the starts themselves: asked earlier, a key's slot could be granted while the
// queue's next slot was still far and the start after it near, two starts of the key
// closer than its interval. An order whose key has no turn is handed back for the
// key's wait, its attempts untouched, and the next order is fetched: one key's flood
// does not hold up the others' orders beyond the fetches it costs.
func (r *runner) flowTurn(ctx context.Context, p prepared) (release func(), ok bool) {
	f := p.cfg.FlowBy
	if !f.Enabled() {
		return func() {}, true
	}
	// The queue's MaxInFlight is this loop's to keep for such a queue (see
	// FlowPending): the consumer hands out more.
	for r.active.Load() >= int64(p.cfg.MaxInFlight) {
		select {
		case <-r.freed:
		case <-ctx.Done():
			handBack(p.l)
			return nil, false
		}
	}
	clock := r.d.opts.clock
	if wait := r.pacer.Next().Sub(clock.Now()); wait > 0 {
		if err := clock.Sleep(ctx, wait); err != nil {
			handBack(p.l)
			return nil, false
		}
	}
	m := p.l.Message()
	now := clock.Now()
	fc := r.flowControl(m.FlowKey)
	if fc.Paused(now) {
		// Handed back for at most a few seconds, so that a resume is seen soon.
		r.postpone(p.l, r.d.flow.hold(r.q.Name(), m.FlowKey, m.Ticket, pauseNakDelay(fc.PausedUntil.Sub(now)), now))
		return nil, false
	}
	if !fc.Rate.IsZero() {
		f.Rate = fc.Rate
	}
	done, wait, ok, err := r.d.flow.admit(ctx, r.q.Name(), f, m.FlowKey, m.Ticket, now)
	if err != nil {
		r.log.Warn("cannot read the flow key's pace; the order waits", "ticket", m.Ticket, "err", err, "in", wait)
	}
	if ok {
		r.active.Add(1)
		return func() {
			done()
			r.active.Add(-1)
			select {
			case r.freed <- struct{}{}:
			default:
			}
		}, true
	}
	r.postpone(p.l, wait)
	return nil, false
}

// postpone hands an order whose flow key has no turn back for wait.
func (r *runner) postpone(l *queue.Lease, wait time.Duration) {
	r.m.retried("flow").Inc()
	r.deliveries.Add(1)
	go func() { // its record's write must not hold up the orders of other keys
		defer r.deliveries.Done()
		l.Postpone(context.Background(), wait)
	}()
}

// handBack returns an order this dispatcher will not deliver (it is stopping) for
// immediate redelivery to another one.
func handBack(l *queue.Lease) { l.HandBack(context.Background()) }

// Delivery describes the delivery attempt an outgoing request belongs to.
type Delivery struct {
	Ticket string
	Queue  string
	// Attempt is 1 + the failed attempts before this one.
	Attempt int
	// Start is when the pacer let the delivery start (the pacing guarantee is about
	// these times).
	Start time.Time
}

type deliveryKey struct{}

// DeliveryFrom returns the Delivery of a request sent by a Dispatcher, from the
// request's context. Custom transports (WithHTTPClient) can use it for tracing,
// metrics or tests.
func DeliveryFrom(ctx context.Context) (Delivery, bool) {
	d, ok := ctx.Value(deliveryKey{}).(Delivery)
	return d, ok
}

// settleTime is what a delivery needs after its attempt, within the order's ack
// wait: the key's and the final record's writes (5 s each at most), which make a
// redelivery acknowledged unseen.
const settleTime = 10 * time.Second

// deliver runs one delivery attempt and settles the order. probe tells whether the
// attempt probes an open circuit.
func (r *runner) deliver(l *queue.Lease, cfg queueconfig.Config, start time.Time, probe bool) {
	m := l.Message()
	bg := context.Background()
	switch err := l.Start(bg); {
	case errors.Is(err, queue.ErrCancelled):
		r.log.Info("order cancelled before delivery; dropping it", "ticket", m.Ticket)
		r.cb.cancel(probe)
		return
	case err != nil:
		r.log.Debug("ticket record changed; trying later", "ticket", m.Ticket, "err", err)
		r.cb.cancel(probe)
		return
	}
	// The record read, the pacing slot and Start may have taken a good part of the ack
	// wait: an order whose delivery could outlast it would go out twice.
	if !l.Extend(bg, r.d.opts.deliveryTimeout+settleTime) {
		r.cb.cancel(probe)
		r.log.Info("not delivering an order held too near its ack wait; the server hands it out again", "ticket", m.Ticket)
		return
	}
	r.mu.Lock()
	tgt := r.target
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(bg, r.d.opts.deliveryTimeout)
	attempt := l.Record().Attempts + 1
	if r.d.tracer != nil {
		var span trace.Span
		ctx, span = startDelivery(ctx, r.d.tracer, m, attempt)
		defer span.End()
	}
	ctx = context.WithValue(ctx, deliveryKey{}, Delivery{Ticket: m.Ticket, Queue: m.Queue, Attempt: attempt, Start: start})
	if why := r.lostSlot(l, cfg, start); why != "" {
		cancel()
		r.cb.cancel(probe)
		handBack(l)
		r.log.Info("not delivering: "+why+"; the order goes back to the queue", "ticket", m.Ticket)
		return
	}
	out := tgt.deliver(ctx, m)
	cancel()
	describeDelivery(trace.SpanFromContext(ctx), out)
	// Only allow-listed response headers are kept at rest and shown by the monitor.
	out.header = cfg.ResultHeader(out.header)
	telemetry.Observe(ctx, r.m.duration, time.Since(start).Seconds())
	if r.downstreamDown(l, out, probe) {
		return
	}

	switch out.kind {
	case outcomeDone:
		r.done(ctx, l, out, start)
	case outcomeThrottled:
		r.throttled(l, out)
	case outcomeRetry:
		cause := out.describe()
		if out.down == downRefused {
			// Nothing reached the downstream: not the order's failed attempt.
			delay := retryDelay(cfg.Backoff, l.Record().Attempts+1)
			l.Retry(bg, delay, cause)
			r.m.retried("unreachable").Inc()
			r.log.Info("downstream unreachable; retrying", "ticket", m.Ticket, "err", out.detailed(), "in", delay)
			return
		}
		attempts := l.CountAttempt()
		if attempts >= cfg.MaxAttempts {
			r.deadLetter(l, cause, out.detailed(), cfg)
			return
		}
		delay := retryDelay(cfg.Backoff, attempts)
		l.Retry(bg, delay, cause)
		r.m.retried("error").Inc()
		r.log.Info("delivery failed; retrying", "ticket", m.Ticket, "attempt", attempts, "err", out.detailed(), "in", delay)
	case outcomeFailed:
		l.Fail(bg, out.result(), out.describe())
		r.m.failed.Inc()
		r.log.Info("downstream refused the order; failed", "ticket", m.Ticket, "status", out.status)
	}
}

// staleSlot is how long after its pacing slot a delivery may still start: far more
// than the record's write and the ack wait's extension take between the two, far less
// than a pinned TTL.
const staleSlot = time.Second

// lostSlot is the last look before a delivery's request leaves, as late as it can be:
// why the delivery must not start now ("": it may). A dispatcher stopped since the
// slot was granted (SIGSTOP, a paused VM, a long stall) may no longer have the queue
// to itself: once the pin moved (Lease.Held), another dispatcher delivers at the pace
// of its own pacer, and a start here would be one beside its starts; with the pin
// still held, a slot older than staleSlot (or than one interval of a slow queue) would
// start beside the slots this pacer grants after the stall. The pin must hold for one
// more interval, so that this start and the successor's first one are at least an
// interval apart, as two slots of one pacer are.
func (r *runner) lostSlot(l *queue.Lease, cfg queueconfig.Config, start time.Time) string {
	interval := cfg.Outflow.Interval()
	switch {
	case !l.Held(interval):
		return "the queue may have moved to another dispatcher (this one stalled past the pinned TTL)"
	case time.Since(start) > max(staleSlot, interval):
		return "its pacing slot is stale (this dispatcher stalled since)"
	}
	return ""
}

// startDelivery starts the span of a delivery attempt: the root of a trace of its
// own, linked to the trace context parked with the order.
func startDelivery(ctx context.Context, tracer trace.Tracer, m *queue.Message, attempt int) (context.Context, trace.Span) {
	opts := []trace.SpanStartOption{
		trace.WithNewRoot(),
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(
			attribute.String("sluice.queue", m.Queue),
			attribute.String("sluice.ticket", m.Ticket),
			attribute.Int("sluice.attempt", attempt),
		),
	}
	if sc := telemetry.Extract(m.TraceParent, m.TraceState); sc.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sc}))
	}
	return tracer.Start(ctx, "sluice.deliver", opts...)
}

// describeDelivery sets the outcome of a delivery attempt on its span.
func describeDelivery(span trace.Span, out outcome) {
	if !span.IsRecording() {
		return
	}
	if out.status != 0 {
		span.SetAttributes(attribute.Int("http.response.status_code", out.status))
	}
	if out.kind != outcomeDone {
		span.SetStatus(codes.Error, out.detailed())
	}
}

func (r *runner) done(ctx context.Context, l *queue.Lease, out outcome, start time.Time) {
	m := l.Message()
	if err := l.Done(context.Background(), out.result()); err != nil {
		// It comes back after the ack wait and is acknowledged unseen (record is done).
		r.log.Warn("ack failed", "ticket", m.Ticket, "err", err)
	}
	r.m.delivered.Inc()
	if !m.ReceivedAt.IsZero() {
		telemetry.Observe(ctx, r.m.wait, max(start.Sub(m.ReceivedAt), 0).Seconds())
	}
	r.log.Debug("delivered", "ticket", m.Ticket, "status", out.status)
}

func (r *runner) throttled(l *queue.Lease, out outcome) {
	pause := out.retryAfter
	if pause <= 0 {
		pause = r.d.opts.defaultPause
	}
	pause = min(pause, r.d.opts.maxPause)
	until := time.Now().Add(pause)
	r.pause(until, "queue paused by the downstream")
	l.Throttle(context.Background(), until, fmt.Sprintf("%s; queue paused for %s", out.describe(), pause.Round(time.Millisecond)),
		queue.RedeliverIn(pauseNakDelay(pause)))
	r.m.retried("throttled").Inc()
}

// pauseNakDelay is how long an order fetched during a pause is handed back for. The
// consumer's pause on the server holds it for the rest, and an operator's resume
// (queue.Queue.Resume) then finds it available instead of hidden for the whole pause.
func pauseNakDelay(pause time.Duration) time.Duration { return min(pause, 5*time.Second) }

// deadLetter moves an order out of attempts (or expired) to the dead letters, with
// cause as the reason (detail is logged: see outcome.detail); when that fails it is
// retried after the first backoff step.
func (r *runner) deadLetter(l *queue.Lease, cause, detail string, cfg queueconfig.Config) {
	m := l.Message()
	if err := l.Dead(context.Background(), cause, retryDelay(cfg.Backoff, 1)); err != nil {
		r.log.Warn("cannot dead-letter; retrying later", "ticket", m.Ticket, "err", err)
		return
	}
	r.m.dead.Inc()
	r.log.Warn("dead-lettered", "ticket", m.Ticket, "attempts", l.Record().Attempts, "err", detail)
}

// reject dead-letters an order that must never be delivered, with the reason first in
// its dead-letter reason. A forged order touches neither the ticket record nor the
// events (queue.Lease.Dead): its ticket may be a genuine order's, which must not be
// marked dead by it.
func (r *runner) reject(l *queue.Lease, reason string, cause error) {
	m := l.Message()
	why := reason + ": " + cause.Error()
	if err := l.Dead(context.Background(), why, time.Second); err != nil {
		r.log.Warn("cannot dead-letter; retrying later", "ticket", m.Ticket, "err", err)
		return
	}
	r.m.dead.Inc()
	r.m.rejected(reason).Inc()
	r.log.Error("dead-lettered without delivery", "reason", reason, "ticket", m.Ticket, "seq", m.Seq, "err", cause)
}

// downstreamDown feeds the attempt's outcome to the circuit. While the circuit is open
// (this attempt may have opened it) a failed attempt is settled here: the order waits
// for the next probe, its attempts unchanged, and the queue is paused until then. It
// reports whether it settled the order.
func (r *runner) downstreamDown(l *queue.Lease, out outcome, probe bool) bool {
	down := out.down
	if out.kind != outcomeRetry {
		down = downNone // any answer means the downstream is up
	}
	now := time.Now()
	open, until, changed := r.cb.record(down, probe, now)
	switch {
	case changed && open:
		r.m.circuit.Set(1)
		r.log.Warn("downstream down; circuit open: queue paused, one order at a time probes it", "err", out.detailed())
	case changed:
		r.m.circuit.Set(0)
		r.log.Info("downstream answers again; circuit closed")
	}
	if !open {
		return false
	}
	r.pause(until, "")
	l.Throttle(context.Background(), until, out.describe()+"; downstream down, queue paused",
		queue.RedeliverIn(max(until.Sub(now), 10*time.Millisecond)))
	r.m.retried("circuit").Inc()
	r.log.Debug("downstream still down", "ticket", l.Message().Ticket, "probe", probe, "next_probe", until)
	return true
}

// retryDelay is the delay before the next attempt after `attempts` failed ones:
// exponential from b.Initial (doubling), ±50% jitter, capped at b.Max, never zero.
func retryDelay(b queueconfig.Backoff, attempts int) time.Duration {
	eb := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(b.Initial),
		backoff.WithMaxInterval(b.Max),
		backoff.WithMultiplier(2),
		backoff.WithRandomizationFactor(0.5),
		backoff.WithMaxElapsedTime(0),
	)
	d := b.Initial
	for range max(attempts, 1) {
		d = eb.NextBackOff()
	}
	return min(max(d, time.Millisecond), b.Max)
}
