package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// prepared is a fetched message that passed its checks and waits for a pacing slot.
type prepared struct {
	m      *queue.Message
	jm     jetstream.Msg
	rec    *queue.Record
	stored bool // rec was read from the bucket (else it is new)
	cfg    queueconfig.Config
}

// Reasons of dead letters that were never attempted (the first word of the reason
// stored with the dead letter; also the reason label of sluice_queue_rejected_total).
const (
	reasonForged  = "forged"  // no valid signature: not an order sluice accepted
	reasonInvalid = "invalid" // signed, but cannot be delivered (e.g. a path without a leading '/')
)

// prepare checks one fetched message: it must be a parked request, signed with the
// store's key, deliverable, whose ticket is not final yet. ok is false when the message
// was settled here.
func (r *runner) prepare(ctx context.Context, jm jetstream.Msg) (p prepared, ok bool) {
	m, err := queue.Decode(jm)
	if err != nil {
		r.log.Error("terminating a message that is not a parked request", "err", err)
		_ = jm.TermWithReason("not a sluice message")
		return p, false
	}
	if pin := jm.Headers().Get("Nats-Pin-Id"); pin != "" {
		r.mu.Lock()
		r.pinID = pin
		r.mu.Unlock()
	}
	if err := r.store.Verify(m); err != nil {
		r.reject(m, jm, reasonForged, err)
		return p, false
	}
	cfg := r.config()
	r.mu.Lock()
	tgt := r.target
	r.mu.Unlock()
	if err := tgt.check(m); err != nil {
		r.reject(m, jm, reasonInvalid, err)
		return p, false
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	rec, err := r.store.Record(rctx, m.Ticket)
	cancel()
	stored := err == nil
	switch {
	case err == nil && rec.Status.Final():
		r.log.Debug("ticket already final; acknowledging", "ticket", m.Ticket, "status", rec.Status)
		r.keepKey(m)
		_ = jm.Ack()
		return p, false
	case errors.Is(err, queue.ErrNotFound):
		rec = &queue.Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, Status: queue.StatusQueued, ReceivedAt: m.ReceivedAt}
	case err != nil:
		r.log.Warn("cannot read the ticket record; retrying later", "ticket", m.Ticket, "err", err)
		_ = jm.NakWithDelay(time.Second)
		return p, false
	}
	if rec.Attempts >= cfg.MaxAttempts {
		// A previous dead-lettering did not complete.
		r.deadLetter(m, jm, rec, cfg)
		return p, false
	}
	// Age counts from when the message was stored in the queue, so a re-queued dead
	// letter gets a fresh max_age.
	if cfg.MaxAge > 0 && time.Since(m.StoredAt) > cfg.MaxAge {
		rec.LastError = fmt.Sprintf("expired: waited longer than max_age (%s)", cfg.MaxAge)
		r.deadLetter(m, jm, rec, cfg)
		return p, false
	}
	return prepared{m: m, jm: jm, rec: rec, stored: stored, cfg: cfg}, true
}

// paceLoop starts the deliveries of prepared messages, each at its pacing slot, in
// the order they were fetched. It returns when ready is closed; what it receives after
// ctx ended goes back to the queue at once.
func (r *runner) paceLoop(ctx context.Context, ready <-chan prepared) {
	for p := range ready {
		if ctx.Err() != nil {
			handBack(p.jm)
			continue
		}
		// While the circuit is open one order at a time probes the downstream.
		probe, ok := r.cb.admit(ctx)
		if !ok {
			handBack(p.jm)
			continue
		}
		// A pause longer than a pull request's life: give the message back until the
		// pause ends instead of holding it (the server holds the others).
		r.mu.Lock()
		fetchWait := r.fetchWait
		r.mu.Unlock()
		now := time.Now()
		if until := r.pacer.PausedUntil(); until.Sub(now) > fetchWait {
			r.cb.cancel(probe)
			_ = p.jm.NakWithDelay(pauseNakDelay(until.Sub(now)))
			continue
		}
		start, err := r.pacer.Wait(ctx)
		if err != nil { // shutting down: hand it to another dispatcher at once
			r.cb.cancel(probe)
			handBack(p.jm)
			continue
		}
		r.deliveries.Add(1)
		go func() {
			defer r.deliveries.Done()
			r.deliver(p.m, p.jm, p.rec, p.stored, p.cfg, start, probe)
		}()
	}
}

// handBack returns a message this dispatcher will not deliver (it is stopping) for
// immediate redelivery to another one. A nak with a delay, not a plain one: the server
// keeps a plain nak in memory only, so after a restart of the server (the embedded one
// restarts with sluice) the message would wait out its ack wait; a delayed nak is stored
// as the message's new deadline.
func handBack(jm jetstream.Msg) {
	_ = jm.NakWithDelay(time.Millisecond)
}

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

// deliver runs one delivery attempt and settles the message. stored tells whether the
// ticket has a record already; probe whether the attempt probes an open circuit.
func (r *runner) deliver(m *queue.Message, jm jetstream.Msg, rec *queue.Record, stored bool, cfg queueconfig.Config, start time.Time, probe bool) {
	// A ticket without a record reads as delivering once its message has been handed
	// to a dispatcher (queue.Store.Status asks the consumer), which saves a synced write
	// per delivery. A record from an earlier attempt or pause is set to delivering
	// before the delivery, with a compare-and-set that loses against a cancellation
	// (queue.Store.Cancel); a record that cannot be written does not hold up delivery.
	if stored {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := r.store.MarkDelivering(ctx, rec)
		cancel()
		switch {
		case errors.Is(err, queue.ErrCancelled):
			r.log.Info("order cancelled before delivery; dropping it", "ticket", m.Ticket)
			r.cb.cancel(probe)
			_ = jm.TermWithReason("cancelled")
			return
		case err != nil && !errors.Is(err, queue.ErrUnavailable):
			r.log.Debug("ticket record changed; trying later", "ticket", m.Ticket, "err", err)
			r.cb.cancel(probe)
			_ = jm.NakWithDelay(time.Second)
			return
		case err != nil:
			r.log.Debug("cannot mark delivering", "ticket", m.Ticket, "err", err)
		}
	}
	r.mu.Lock()
	tgt := r.target
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), r.d.opts.deliveryTimeout)
	ctx = context.WithValue(ctx, deliveryKey{}, Delivery{Ticket: m.Ticket, Queue: m.Queue, Attempt: rec.Attempts + 1, Start: start})
	out := tgt.deliver(ctx, m)
	cancel()
	// Only allow-listed response headers are kept at rest and shown by the monitor.
	out.header = cfg.ResultHeader(out.header)
	r.m.duration.Observe(time.Since(start).Seconds())
	if r.downstreamDown(m, jm, rec, out, probe) {
		return
	}

	switch out.kind {
	case outcomeDone:
		r.done(m, jm, rec, out, start)
	case outcomeThrottled:
		r.throttled(m, jm, rec, out)
	case outcomeRetry:
		rec.LastError = out.describe()
		if out.down == downRefused {
			// Nothing reached the downstream: not the order's failed attempt.
			delay := retryDelay(cfg.Backoff, rec.Attempts+1)
			rec.Status, rec.NextAttemptAt = queue.StatusQueued, time.Now().Add(delay)
			r.save(rec)
			r.m.retried("unreachable").Inc()
			r.log.Info("downstream unreachable; retrying", "ticket", m.Ticket, "err", rec.LastError, "in", delay)
			_ = jm.NakWithDelay(delay)
			return
		}
		rec.Attempts++
		if rec.Attempts >= cfg.MaxAttempts {
			r.deadLetter(m, jm, rec, cfg)
			return
		}
		delay := retryDelay(cfg.Backoff, rec.Attempts)
		rec.Status, rec.NextAttemptAt = queue.StatusQueued, time.Now().Add(delay)
		r.save(rec)
		r.m.retried("error").Inc()
		r.log.Info("delivery failed; retrying", "ticket", m.Ticket, "attempt", rec.Attempts, "err", rec.LastError, "in", delay)
		_ = jm.NakWithDelay(delay)
	case outcomeFailed:
		rec.Status, rec.LastError, rec.NextAttemptAt = queue.StatusFailed, out.describe(), time.Time{}
		rec.Result = out.result()
		r.keepKey(m)
		r.save(rec)
		r.event(queue.DoneSubject(m.Queue), rec, out.status)
		r.m.failed.Inc()
		r.log.Info("downstream refused the order; failed", "ticket", m.Ticket, "status", out.status)
		_ = jm.TermWithReason(fmt.Sprintf("downstream answered %d", out.status))
	}
}

func (r *runner) done(m *queue.Message, jm jetstream.Msg, rec *queue.Record, out outcome, start time.Time) {
	rec.Status, rec.LastError, rec.NextAttemptAt = queue.StatusDone, "", time.Time{}
	rec.Result = out.result()
	r.keepKey(m)
	// The order is acknowledged whether or not its record could be written: delivering
	// it again because the store had no room for the record would keep the store full.
	r.save(rec)
	r.event(queue.DoneSubject(m.Queue), rec, out.status)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := jm.DoubleAck(ctx); err != nil {
		// It comes back after the ack wait and is acknowledged unseen (record is done).
		r.log.Warn("ack failed", "ticket", m.Ticket, "err", err)
	}
	r.m.delivered.Inc()
	if !m.ReceivedAt.IsZero() {
		r.m.wait.Observe(max(start.Sub(m.ReceivedAt), 0).Seconds())
	}
	r.log.Debug("delivered", "ticket", m.Ticket, "status", out.status)
}

func (r *runner) throttled(m *queue.Message, jm jetstream.Msg, rec *queue.Record, out outcome) {
	pause := out.retryAfter
	if pause <= 0 {
		pause = r.d.opts.defaultPause
	}
	pause = min(pause, r.d.opts.maxPause)
	until := time.Now().Add(pause)
	r.pause(until, "queue paused by the downstream")
	rec.Status, rec.NextAttemptAt = queue.StatusQueued, until
	rec.LastError = fmt.Sprintf("%s; queue paused for %s", out.describe(), pause.Round(time.Millisecond))
	r.save(rec)
	r.m.retried("throttled").Inc()
	_ = jm.NakWithDelay(pauseNakDelay(pause))
}

// pauseNakDelay is how long an order fetched during a pause is handed back for. The
// consumer's pause on the server holds it for the rest, and an operator's resume
// (queue.Queue.Resume) then finds it available instead of hidden for the whole pause.
func pauseNakDelay(pause time.Duration) time.Duration { return min(pause, 5*time.Second) }

func (r *runner) deadLetter(m *queue.Message, jm jetstream.Msg, rec *queue.Record, cfg queueconfig.Config) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.store.DeadLetter(ctx, m, rec.Attempts, rec.LastError); err != nil {
		r.log.Warn("cannot dead-letter; retrying later", "ticket", m.Ticket, "err", err)
		rec.Status = queue.StatusQueued
		r.save(rec)
		_ = jm.NakWithDelay(retryDelay(cfg.Backoff, 1))
		return
	}
	rec.Status, rec.NextAttemptAt = queue.StatusDead, time.Time{}
	r.keepKey(m)
	r.save(rec)
	r.event(queue.DeadSubject(m.Queue), rec, 0)
	r.m.dead.Inc()
	r.log.Warn("dead-lettered", "ticket", m.Ticket, "attempts", rec.Attempts, "err", rec.LastError)
	_ = jm.TermWithReason("dead-lettered: " + rec.LastError)
}

// keepKey gives the idempotency key of a message whose order is final its final
// lifetime (queue.Store.KeepKey), before the final record is written and the message
// acknowledged. A failure is logged: the key then keeps the lifetime it had.
func (r *runner) keepKey(m *queue.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.store.KeepKey(ctx, m); err != nil {
		r.log.Warn("cannot refresh the idempotency key", "ticket", m.Ticket, "err", err)
	}
}

// reject dead-letters a message that must never be delivered, with the reason first in
// its dead-letter reason. A forged message touches neither the ticket record nor the
// events: its ticket may be a genuine order's, which must not be marked dead by it.
func (r *runner) reject(m *queue.Message, jm jetstream.Msg, reason string, cause error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	why := reason + ": " + cause.Error()
	if err := r.store.DeadLetter(ctx, m, 0, why); err != nil {
		r.log.Warn("cannot dead-letter; retrying later", "ticket", m.Ticket, "err", err)
		_ = jm.NakWithDelay(time.Second)
		return
	}
	if reason != reasonForged {
		rec := &queue.Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, Status: queue.StatusDead,
			ReceivedAt: m.ReceivedAt, LastError: why}
		r.keepKey(m)
		r.save(rec)
		r.event(queue.DeadSubject(m.Queue), rec, 0)
	}
	r.m.dead.Inc()
	r.m.rejected(reason).Inc()
	r.log.Error("dead-lettered without delivery", "reason", reason, "ticket", m.Ticket, "seq", m.Seq, "err", cause)
	_ = jm.TermWithReason(why)
}

// downstreamDown feeds the attempt's outcome to the circuit. While the circuit is open
// (this attempt may have opened it) a failed attempt is settled here: the order waits
// for the next probe, its attempts unchanged, and the queue is paused until then. It
// reports whether it settled the message.
func (r *runner) downstreamDown(m *queue.Message, jm jetstream.Msg, rec *queue.Record, out outcome, probe bool) bool {
	down := out.down
	if out.kind != outcomeRetry {
		down = downNone // any answer means the downstream is up
	}
	now := time.Now()
	open, until, changed := r.cb.record(down, probe, now)
	switch {
	case changed && open:
		r.m.circuit.Set(1)
		r.log.Warn("downstream down; circuit open: queue paused, one order at a time probes it", "err", out.describe())
	case changed:
		r.m.circuit.Set(0)
		r.log.Info("downstream answers again; circuit closed")
	}
	if !open {
		return false
	}
	r.pause(until, "")
	rec.Status, rec.NextAttemptAt = queue.StatusQueued, until
	rec.LastError = out.describe() + "; downstream down, queue paused"
	r.save(rec)
	r.m.retried("circuit").Inc()
	r.log.Debug("downstream still down", "ticket", m.Ticket, "probe", probe, "next_probe", until)
	_ = jm.NakWithDelay(max(until.Sub(now), 10*time.Millisecond))
	return true
}

// save writes the record. When JetStream refuses it (store full, NATS unreachable) the
// record is kept in memory and written later (maintain flushes it), so that settling an
// order never waits on its bookkeeping. False: the record is lost (memory bound
// reached); the order is settled all the same.
func (r *runner) save(rec *queue.Record) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	err := r.store.SaveRecord(ctx, rec)
	cancel()
	if err == nil {
		return true
	}
	if kerr := r.store.KeepRecord(rec); kerr != nil {
		r.log.Error("cannot save the ticket record nor keep it for later; its status is lost", "ticket", rec.Ticket, "status", rec.Status, "err", err)
		return false
	}
	r.log.Debug("ticket record kept in memory to be written later", "ticket", rec.Ticket, "err", err)
	return true
}

func (r *runner) event(subject string, rec *queue.Record, status int) {
	ev := queue.Event{
		Ticket: rec.Ticket, Queue: rec.Queue, Rule: rec.Rule, Status: rec.Status,
		DownstreamStatus: status, Attempts: rec.Attempts, Error: rec.LastError, At: time.Now().UTC(),
	}
	if err := r.store.PublishEvent(subject, ev); err != nil {
		r.log.Warn("cannot publish event", "subject", subject, "err", err)
	}
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

// parseRetryAfter reads a Retry-After header: delay-seconds or an HTTP-date. ok is false
// when it is missing or malformed.
func parseRetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	v := h.Get("Retry-After")
	if v == "" {
		return 0, false
	}
	if secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64); err == nil {
		if secs < 0 {
			return 0, false
		}
		return time.Duration(min(secs, 1<<31)) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}
