package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// Errors of the Lease methods that callers branch on.
var (
	// ErrFinal: the ticket is final already; Lease.Load acknowledged its message.
	ErrFinal = errors.New("queue: the ticket is final already")
	// ErrNotLoaded: a Lease was settled before Load read its record; nothing was done.
	ErrNotLoaded = errors.New("queue: lease settled before Load")
)

// Lease is an order fetched by a dispatcher, held until it settles it. Its methods
// own the ticket's state machine: each settlement writes the ticket record (kept in
// memory when JetStream refuses it: settling never waits on bookkeeping), gives the
// idempotency key of a final order its final lifetime, publishes the events on
// DoneSubject and DeadSubject, and acknowledges, hands back or terminates the message.
//
// The life of a lease: Verify (a forged order is only ever Dead), Load (the ticket's
// record), Start (the delivery starts), then one of Done, Fail, Retry, Throttle or
// Dead; Release hands an order back untouched. Load and Start settle the lease when
// they return an error; Done, Fail, Retry and Throttle need Load first (else they do
// nothing and return ErrNotLoaded). A Lease is used by one goroutine at a time.
//
// Until it is settled, or left as it is (Extend), its consumer hands out no other
// lease of its ticket (see Consumer.hold); each settlement ends that hold once the
// writes that make a redelivery acknowledged unseen are done, before its
// acknowledgement, termination or nak is sent.
type Lease struct {
	c    *Consumer
	s    *Store
	jm   jetstream.Msg
	m    *Message
	verr error

	rec    *Record // nil until Load
	stored bool    // rec was read from the bucket (else it is new)

	// stale is when the server may have handed the order to another dispatcher: its
	// ack wait has run out (zero: never known; see nak). Extend moves it.
	stale   time.Time
	ackWait time.Duration
	fetched time.Time // when the consumer handed it out
}

// let ends the lease's hold on its ticket in its consumer (see Consumer.hold): a
// redelivery is handed out from then on. Every settlement calls it before it sends
// anything (a nak's redelivery must be handed out), and after the writes that make
// a redelivery acknowledged unseen (the final record: Load).
func (l *Lease) let() { l.c.let(l) }

// staleAt is when a lease fetched at fetched from a consumer with ackWait goes stale:
// a little before its ack wait runs out as counted from fetched, since the server
// counts it from the delivery, which came first.
func staleAt(fetched time.Time, ackWait time.Duration) time.Time {
	if ackWait <= 0 {
		return time.Time{}
	}
	return fetched.Add(ackWait - min(ackWait/10, time.Second))
}

// Message returns the parked order.
func (l *Lease) Message() *Message { return l.m }

// Held reports whether the dispatcher that fetched l still has the queue to itself for
// at least margin from now: no other dispatcher of the queue can have been handed an
// order since. The server moves a queue's pin to another dispatcher only once the
// pinned one has sent no pull request for the pinned TTL, and counts that from each
// request's arrival; so the pin holds until a pinned TTL after the sending of the
// latest pull request of this handle that brought an order, by this process's clock
// (for a laned queue: a pinned TTL after the sending of the latest renewal of its
// lead, see leadLocked). A dispatcher that was stopped for longer than that (SIGSTOP,
// a paused VM, a stall) finds Held false when it resumes, and must not start the
// delivery: another dispatcher may be delivering the queue's orders at its own pace.
// Before Ensure (no pinned TTL known) Held is true.
func (l *Lease) Held(margin time.Duration) bool {
	until := l.c.heldUntil()
	return until.IsZero() || time.Now().Add(margin).Before(until)
}

// Verify returns the order's signature check (see Store.Verify): an error wrapping
// ErrForged for an order sluice did not park.
func (l *Lease) Verify() error { return l.verr }

// Record returns a copy of the ticket record as the lease holds it (zero before Load).
func (l *Lease) Record() Record {
	if l.rec == nil {
		return Record{}
	}
	return *l.rec
}

// Load reads the ticket's record. Errors (the lease is then settled): ErrFinal (the
// order is done, failed, dead or cancelled already: a redelivery after a crash between
// the final record and the acknowledgement, or a republished duplicate; the message is
// acknowledged unseen), ErrUnavailable (the record cannot be read; handed back for a
// second).
func (l *Lease) Load(ctx context.Context) error {
	m := l.m
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rec, err := l.s.Record(rctx, m.Ticket)
	cancel()
	switch {
	case err == nil && rec.Status.Final():
		read := time.Now()
		l.keepKey(ctx)
		l.leaveAfter(read)
		l.let()
		_ = l.jm.Ack()
		return fmt.Errorf("%w: ticket %s is %s", ErrFinal, m.Ticket, rec.Status)
	case err == nil:
		l.rec, l.stored = rec, true
	case errors.Is(err, ErrNotFound):
		l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, Status: StatusQueued, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
	default:
		l.nak(ctx, time.Second)
		return unavailable("ticket record", err)
	}
	return nil
}

// Start marks the delivery attempt as started. A ticket without a record reads as
// delivering once its message was handed out (Store.Status asks the consumer), which
// saves a synced write per delivery; a record from an earlier attempt or pause is set
// to delivering with a compare-and-set that loses against a cancellation (Store.Cancel).
// A record that cannot be written does not hold up the delivery (nil). Errors (the
// lease is then settled): ErrCancelled (terminated: never delivered); any other error
// means the record changed under us (handed back for a second).
func (l *Lease) Start(ctx context.Context) error {
	if !l.stored {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := l.s.markDelivering(mctx, l.rec)
	cancel()
	switch {
	case errors.Is(err, ErrCancelled):
		l.leaveAfter(time.Now()) // the cancelled record was read
		l.let()
		_ = l.jm.TermWithReason("cancelled")
		return err
	case err != nil && !errors.Is(err, ErrUnavailable):
		l.nak(ctx, time.Second)
		return err
	case err != nil:
		l.c.log.Debug("cannot mark delivering", "ticket", l.m.Ticket, "err", err)
	}
	return nil
}

// CountAttempt counts a failed delivery attempt in the lease's record (written by the
// settlement that follows) and returns the failed attempts so far (0 before Load:
// nothing to count in). JetStream's delivery count does not serve: it also counts
// pauses and crash redeliveries.
func (l *Lease) CountAttempt() int {
	if l.rec == nil {
		return 0
	}
	l.rec.Attempts++
	return l.rec.Attempts
}

// Done settles a delivered order: status done with the downstream's result, the
// completion event, then the acknowledgement, which it waits for. The order is
// acknowledged whether or not its record could be written: delivering it again because
// the store had no room for the record would keep the store full. An error is the
// failed acknowledgement: the message comes back after the ack wait and is
// acknowledged unseen (its record is done). A keyed order is acknowledged no sooner
// than leaveGap after its key is recorded (see Store.repeat), as Fail and Dead
// terminate it.
func (l *Lease) Done(ctx context.Context, res *Result) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.LastError, rec.NextAttemptAt, rec.Result = StatusDone, "", time.Time{}, res
	rec.Attempts++ // the attempt that delivered it
	l.settle(ctx, DoneSubject(rec.Queue), statusCode(res))
	l.let()
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return l.jm.DoubleAck(actx)
}

// Fail settles an order the downstream refused for good: status failed with cause as
// the last error and the downstream's result, the completion event, and the message is
// terminated.
func (l *Lease) Fail(ctx context.Context, res *Result, cause string) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.LastError, rec.NextAttemptAt, rec.Result = StatusFailed, cause, time.Time{}, res
	rec.Attempts++ // the attempt the downstream refused
	l.settle(ctx, DoneSubject(rec.Queue), statusCode(res))
	l.let()
	_ = l.jm.TermWithReason(fmt.Sprintf("downstream answered %d", statusCode(res)))
	return nil
}

func statusCode(res *Result) int {
	if res == nil {
		return 0
	}
	return res.StatusCode
}

// Retry settles the lease for another attempt after `after`: status queued, cause as
// the last error, and the message is handed back for redelivery then. A failed
// attempt is counted with CountAttempt first; without it the attempt does not count.
func (l *Lease) Retry(ctx context.Context, after time.Duration, cause string) error {
	return l.requeue(ctx, time.Now().Add(after), cause, after)
}

// ThrottleOption configures Lease.Throttle.
type ThrottleOption func(*throttleOptions)

type throttleOptions struct{ redeliverIn time.Duration }

// RedeliverIn hands the message back for d instead of until the end of the pause. A
// paused consumer holds it for the rest, and an operator's Queue.Resume then finds it
// available instead of hidden for the whole pause.
func RedeliverIn(d time.Duration) ThrottleOption {
	return func(o *throttleOptions) { o.redeliverIn = d }
}

// Throttle settles the lease for another attempt once the queue's pause ends at until
// (a downstream's Retry-After, or an open circuit): status queued, next attempt at
// until, cause as the last error; the attempt does not count. The message is handed
// back until then (at least 10ms), or for RedeliverIn.
func (l *Lease) Throttle(ctx context.Context, until time.Time, cause string, opts ...ThrottleOption) error {
	o := throttleOptions{redeliverIn: max(time.Until(until), 10*time.Millisecond)}
	for _, opt := range opts {
		opt(&o)
	}
	return l.requeue(ctx, until, cause, o.redeliverIn)
}

func (l *Lease) requeue(ctx context.Context, next time.Time, cause string, redeliverIn time.Duration) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.NextAttemptAt, rec.LastError = StatusQueued, next, cause
	l.save(ctx)
	l.nak(ctx, redeliverIn)
	return nil
}

// Release hands the message back for redelivery after `after`, its record untouched:
// for an order this dispatcher will not start now (it is stopping, or the queue is
// paused). See nak.
func (l *Lease) Release(after time.Duration) {
	l.nak(context.Background(), after)
}

// HandBack returns an order this consumer will not deliver (its dispatcher is
// stopping) for immediate redelivery to another one (see nak). A genuine order whose
// ticket has no record yet gets a queued one first: its status would otherwise be
// read as delivering, the consumer having handed it out.
func (l *Lease) HandBack(ctx context.Context) { l.Postpone(ctx, time.Millisecond) }

// Postpone hands the message back for redelivery after `after`, without counting an
// attempt: for an order whose turn has not come (its flow key has no slot free; see
// queueconfig.FlowBy). Like HandBack, it gives a ticket without a record a queued
// one first, so that its status does not read as delivering while it waits.
func (l *Lease) Postpone(ctx context.Context, after time.Duration) {
	if !l.stored && l.verr == nil {
		m := l.m
		if l.rec == nil {
			l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
		}
		l.rec.Status = StatusQueued
		l.save(ctx)
	}
	l.nak(ctx, after)
}

// Extend makes sure the lease has at least need left before its ack wait runs out,
// so that a delivery about to start (need: its timeout and its settlement's writes)
// ends before the server may hand the order to another dispatcher, however long the
// steps before it took (the record read, the pacing slot, each bounded by seconds).
// With less left, it restarts the ack wait on the server (JetStream's "in progress")
// and waits for the server to take it (see ask); an ack wait shorter than need then
// leaves only the ack wait (a redelivery meanwhile is not handed out by this
// consumer: see Consumer.hold). false: the order must not be delivered here, and
// the lease must be left as it is (its hold on the ticket ends): the server
// redelivers the order. Either the lease is stale already (the server may have handed
// the order out again: nothing is sent), or it had too little left and the server did
// not answer (whether the ack wait restarted is not known).
func (l *Lease) Extend(ctx context.Context, need time.Duration) bool {
	if l.stale.IsZero() {
		return true // the ack wait is not known: nothing to keep
	}
	now := time.Now()
	switch {
	case now.After(l.stale):
		l.let()
		return false
	case l.stale.Sub(now) >= need:
		return true
	}
	if err := l.ask(ctx, jsproto.InProgress); err != nil {
		l.c.log.Debug("cannot restart an order's ack wait", "ticket", l.m.Ticket, "err", err)
		l.let()
		return false
	}
	l.stale = staleAt(now, l.ackWait)
	return true
}

// nakWait bounds how long nak waits for the server to take a nak.
const nakWait = 2 * time.Second

// nak hands the message back for redelivery after delay, and is how every settlement
// of a Lease does. Three things it guards against:
//
//   - A lease past its ack wait (stale) sends nothing. The server may have handed the
//     order to another dispatcher meanwhile, and JetStream applies a nak to whichever
//     delivery of the message is current: the nak would cut that delivery short and the
//     order would go out a third time beside it. The server redelivers a stale lease's
//     order by itself.
//   - A nak with a delay, never a plain one: the server keeps a plain nak in memory
//     only, so after a restart of the server (the embedded one restarts with sluice)
//     the message would wait out its ack wait; a delayed nak is stored as the message's
//     new deadline.
//   - It waits until the server has taken the nak: a settlement may come just before
//     the connection or an embedded server stops (a dispatcher stopping), and a nak
//     still on its way, or queued for the consumer inside the server, when the server
//     stops is lost, its order waiting out the ack wait. JetStream answers an
//     acknowledgement of any kind that asks for one once its consumer has processed
//     it (the payload is JetStream's nak with a delay; the client's synchronous form
//     exists for Ack only); a replicated consumer answers once its leader has applied
//     the nak and proposed it, not once the followers have it. The wait is bounded by
//     nakWait and ctx; a ctx already done sends the nak without waiting. Without an
//     answer (time out, or no responders: the consumer has no leader, or is gone) it is
//     not sent again: applied and redelivered meanwhile, a second nak would cut short
//     another dispatcher's delivery, as above; the ack wait is the backstop. While the
//     connection is down the nak is lost (sluice's connections keep no reconnect
//     buffer).
func (l *Lease) nak(ctx context.Context, delay time.Duration) {
	l.let()
	if !l.stale.IsZero() && time.Now().After(l.stale) {
		l.c.log.Debug("not handing back an order held past its ack wait: the server redelivers it",
			"ticket", l.m.Ticket, "stale_for", time.Since(l.stale).Round(time.Millisecond))
		return
	}
	delay = max(delay, time.Millisecond)
	if !l.s.nc.IsConnected() || ctx.Err() != nil {
		_ = l.jm.NakWithDelay(delay)
		return
	}
	_ = l.ask(ctx, func(ctx context.Context, nc *nats.Conn, m jetstream.Msg) error {
		return jsproto.NakWithDelay(ctx, nc, m, delay)
	})
}

// ask sends an acknowledgement of the lease's message that waits for the server to
// have processed it (see nak), at most nakWait.
func (l *Lease) ask(ctx context.Context, ack func(context.Context, *nats.Conn, jetstream.Msg) error) error {
	wctx, cancel := context.WithTimeout(ctx, nakWait)
	defer cancel()
	return ack(wctx, l.s.nc, l.jm)
}

// Dead moves the order to the dead-letter stream with cause as its reason, then
// records it dead, publishes the event on DeadSubject, and terminates the message. A
// lease not loaded yet (Load) is an order never attempted: its record is written new
// (its ticket may be a genuine order's only if the order verifies, so a forged order
// leaves the record and the events alone). When the dead letter cannot be written the
// order is handed back for retryIn (its record queued) and the error is returned.
func (l *Lease) Dead(ctx context.Context, cause string, retryIn time.Duration) error {
	m := l.m
	if l.rec != nil {
		l.rec.LastError = cause
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := l.s.deadLetter(dctx, m, l.Record().Attempts, cause)
	cancel()
	if err != nil {
		if l.rec != nil {
			l.rec.Status = StatusQueued
			l.save(ctx)
		}
		l.nak(ctx, retryIn)
		return err
	}
	reason := "dead-lettered: " + cause
	if l.rec == nil {
		if l.verr != nil {
			l.let()
			_ = l.jm.TermWithReason(cause)
			return nil
		}
		reason = cause
		l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
	}
	rec := l.rec
	rec.Status, rec.NextAttemptAt, rec.LastError = StatusDead, time.Time{}, cause
	l.settle(ctx, DeadSubject(m.Queue), 0)
	l.let()
	_ = l.jm.TermWithReason(reason)
	return nil
}

// settle writes what tells a final order once it has left its queue: its key's final
// lifetime (keepKey), its final record and event; then it waits until the order may
// leave (leaveAfter), which the caller's acknowledgement does.
func (l *Lease) settle(ctx context.Context, subject string, status int) {
	var visible time.Time
	if l.keepKey(ctx) {
		visible = time.Now()
	}
	l.save(ctx)
	if visible.IsZero() {
		visible = time.Now()
	}
	l.event(ctx, subject, status)
	l.leaveAfter(visible)
}

// leaveAfter waits, for a keyed order, until its message may leave the queue: leaveGap
// after visible, a time by which a record that a repeat's lookup reads was stored (see
// Store.repeat).
func (l *Lease) leaveAfter(visible time.Time) {
	if l.m.IdempotencyKey != "" {
		leaveAfter(visible)
	}
}

// keepKey gives the idempotency key of an order that is final its final lifetime
// (Store.keepKey), before the final record is written and the message acknowledged. A
// failure is logged (false): the key then keeps the lifetime it had.
func (l *Lease) keepKey(ctx context.Context) bool {
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := l.s.keepKey(kctx, l.m); err != nil {
		l.c.log.Warn("cannot refresh the idempotency key", "ticket", l.m.Ticket, "err", err)
		return false
	}
	return true
}

// save writes the lease's record. When JetStream refuses it (store full, NATS
// unreachable) the record is kept in memory (Store.keepRecord) and written later
// (FlushRecords), so that settling an order never waits on its bookkeeping. When even
// that fails the record is lost; the order is settled all the same.
func (l *Lease) save(ctx context.Context) {
	rec := l.rec
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := l.s.saveRecord(sctx, rec)
	cancel()
	if err == nil {
		return
	}
	if kerr := l.s.keepRecord(rec); kerr != nil {
		l.c.log.Error("cannot save the ticket record nor keep it for later; its status is lost", "ticket", rec.Ticket, "status", rec.Status, "err", err)
		return
	}
	l.c.log.Debug("ticket record kept in memory to be written later", "ticket", rec.Ticket, "err", err)
}

// event publishes the order's final state on subject and, when the order asked for
// one, stores its completion callback.
func (l *Lease) event(ctx context.Context, subject string, status int) {
	rec := l.rec
	ev := Event{
		Ticket: rec.Ticket, Queue: rec.Queue, Rule: rec.Rule, Status: rec.Status,
		DownstreamStatus: status, Attempts: rec.Attempts, Error: rec.LastError, At: time.Now().UTC(),
	}
	if err := l.s.publishEvent(subject, ev); err != nil {
		l.c.log.Warn("cannot publish event", "subject", subject, "err", err)
	}
	l.s.enqueueCallback(ctx, l.m, ev)
}
