package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// Receipt is what a client is told about a parked request.
type Receipt struct {
	Ticket string
	Queue  string
	// Status is the order's status: StatusQueued for a new order; for a repeat, what the
	// earlier order has reached (done, failed, dead…), or "" when that is no longer
	// known (its record expired).
	Status Status
	// Position estimates the number of queued messages up to and including this one
	// (0 once delivery has started).
	Position uint64
	// EstimatedDelivery estimates when delivery starts, from the position and the
	// queue's outflow rate.
	EstimatedDelivery time.Time
	// Duplicate is true when the request repeated an earlier one (same client scope,
	// idempotency key and payload); Ticket is then the earlier ticket.
	Duplicate bool
	// NotBefore is a scheduled order's due time (Status StatusScheduled; zero
	// otherwise): it joins the queue's outflow then, and EstimatedDelivery is that time.
	NotBefore time.Time
}

// Park stores req in its queue and returns once JetStream has acknowledged it (the
// message is on disk — on every replica of an R3 stream — before Park returns a
// receipt). Errors: ErrUnknownQueue, ErrInvalidRequest, ErrFull (a *FullError with a
// retry delay), ErrUnavailable, ErrKeyStoreFull, ErrTooManyKeys (a *KeyLimitError),
// ErrIdempotencyConflict, ErrTooLarge, ErrHeaderTooLarge (a *HeaderLimitError: headers
// the server can never store; BodyLimit tells it before the body is read),
// ErrNotAcknowledged (an *UnacknowledgedError: no answer came in time, and the order
// may be stored under the ticket it names). After any other error nothing was
// accepted and no key recorded: the same key works again. A repeat
// of an accepted keyed order gets its receipt even while new orders are refused for
// want of room (ErrFull, ErrStorageFull): it stores nothing.
//
// Idempotency (req.IdempotencyKey set). The key K is scoped by req.Client (see idemKey)
// and names the order's ticket T (keyedTicket: an HMAC of queue and K), so that every
// request with K agrees on T before anything is written. While the order waits, its
// message is K's record (it carries T and the payload fingerprint); when the order
// becomes final (done, failed, dead) the dispatcher records K in IdempotencyBucket
// with IdempotencyTTL (Store.keepKey) before the message leaves the queue.
//
//  1. An earlier order with K: T's message in the queue, else K's record in the bucket
//     (or T's ticket record, for a cancelled order). A different payload fingerprint is
//     ErrIdempotencyConflict; the same one gets the earlier ticket and its status.
//     No order is written. The queue and the records are read at once: a keyed order
//     leaves its queue no sooner than leaveGap after it is recorded, so no order is
//     missed between the reads when the queue answered within leaveGap of their start
//     (else the records are read again; see repeat). While it waits, an order is found
//     in its own queue only: K's ticket is derived per queue.
//  2. At once with 1: the bucket is within keyReserve of its byte cap (else
//     ErrKeyStoreFull), and a slot is taken for K in the queue's key stream, on the
//     client's subject, whose per-subject limit is MaxIdempotencyKeys (discard-new:
//     ErrTooManyKeys), with Nats-Msg-Id "k."+K. Slots expire after IdempotencyTTL, so
//     the cap counts the keys accepted within it. When 1 finds an earlier order (or
//     fails), 2's outcome is dropped: a refusal does not concern a repeat, and a slot
//     it stored is deleted. Within the duplicate window a repeat's slot stores nothing
//     (a duplicate of the key's own slot); past it, the repeat holds a second slot of
//     K for the length of its lookup, during which a new key of the same client one
//     below its cap may be refused (ErrTooManyKeys with a retry delay). A repeat whose
//     slot got ahead of its order's own (a request with K racing it, its slot a
//     duplicate of the repeat's) deletes the key's only slot: the client may then be
//     one key past its cap for IdempotencyTTL; the cap is a guard against abuse, no
//     order depends on it.
//  3. The order is published with Nats-Msg-Id "k."+K. Refused (full queue, too
//     large…): the slot is deleted and the error returned. A duplicate PubAck (a
//     concurrent or retried request with K within the duplicate window): the stored
//     message gives the ticket and fingerprint.
//
// Two round trips one after the other: the lookup and the slot, then the order. One
// synced write per new key, its order's, which may share its disk sync with
// concurrent Parks (see "Group commit" in the package documentation); the slot is
// written to memory (see Store.keyStream), on no disk. The slot is
// stored before the order is written, so that an order anybody can see (a repeat, a
// dispatcher) is never withdrawn for its slot; a repeat leaves nothing written.
//
// Crash safety: what a crash (of this process, or of the NATS server) leaves between
// the steps.
//   - During 1 and 2: nothing, or a slot without an order, which counts against its
//     client's cap until its TTL ends (1 writes nothing). The client has no receipt;
//     its retry finds no order, and its slot is a duplicate of the stray one within the
//     duplicate window (same Nats-Msg-Id), so it takes no second place. A repeat that
//     dies before it deletes its slot past the duplicate window leaves the same: a
//     stray slot until its TTL, and no order.
//   - During 3, before the acknowledgement: the order is stored or not (synced before
//     it is acknowledged; an atomic batch stores all of its orders or none). Stored,
//     the client has no receipt and retries: within the duplicate window its publish
//     is a duplicate and the stored message gives it T; after the window, step 1
//     finds T's message while the order waits (T is derived from K, so no record is
//     needed to name it), and once it is final K's record in the bucket, which the
//     dispatcher writes at least leaveGap before it acknowledges the message
//     (Store.keepKey; a dispatcher that dies in between leaves the message in the
//     queue, redelivered, and records K again), and which lasts IdempotencyTTL from
//     then.
//   - After a refused publish, while the slot is deleted: a slot without an order, as
//     in the first case.
//   - A restart of the NATS servers (a crash or a power cut included) loses the slots,
//     which are in memory: their clients' caps count afresh; no order is lost or
//     repeated, since the order and K's record are synced writes, and T is derived from
//     K, so every repeat still finds its order (step 1).
func (s *Store) Park(ctx context.Context, req *Request) (rc Receipt, err error) {
	if s.tracer != nil {
		var span trace.Span
		ctx, span = s.tracer.Start(ctx, "sluice.park")
		defer func() { endPark(span, req.Queue, rc, err) }()
	}
	if err := req.validate(); err != nil {
		return Receipt{}, err
	}
	q, err := s.Queue(req.Queue)
	if err != nil {
		return Receipt{}, err
	}
	cfg := q.Config()
	if req.Callback != "" {
		if _, err := cfg.CheckCallback(req.Callback); err != nil {
			return Receipt{}, fmt.Errorf("%w: %w", ErrInvalidRequest, err)
		}
	}
	m := &Message{Request: *req}
	m.Header = KeptHeader(req.Header, cfg.DropHeaders)
	if m.ReceivedAt.IsZero() {
		m.ReceivedAt = time.Now()
	}
	m.Fingerprint = Fingerprint(&m.Request)
	m.Ticket = newTicket()
	m.Lane = s.laneFor(cfg, req.Priority, req.Tenant)
	m.FlowKey = s.flowKeyFor(cfg, req.Flow)
	m.Tenant, m.Flow = "", "" // only their hashes are kept
	if m.NotBefore, err = dueTime(cfg, m.ReceivedAt, req.NotBefore, time.Now()); err != nil {
		return Receipt{}, err
	}
	m.TraceParent, m.TraceState = telemetry.Format(trace.SpanContextFromContext(ctx))

	if !s.connected() {
		return Receipt{}, fmt.Errorf("%w: not connected to NATS", ErrUnavailable)
	}
	ctx, cancel := context.WithTimeout(ctx, s.opts.publishTimeout)
	defer cancel()
	// Past the high-water mark the rest of the store is for draining: the records of
	// delivered orders must find room, or delivering would wait on them.
	err = s.usage.check(ctx)
	if err == nil {
		err = q.laneRoom(ctx, cfg, m.Lane)
	}
	if err == nil {
		err = q.checkRoom(ctx)
	}
	if err != nil {
		return s.refusedUnlessRepeat(ctx, q, m, err)
	}
	if req.IdempotencyKey != "" {
		return s.parkKeyed(ctx, q, m)
	}
	ack, err := s.publish(ctx, q, m, m.Ticket)
	if err != nil {
		return Receipt{}, err
	}
	return q.receiptOf(ctx, m, ack.Sequence, ack.Duplicate), nil
}

// refusedUnlessRepeat answers m, which Park refuses for want of room (refused: the
// storage, its queue or its lane is full): a repeat of an accepted order stores
// nothing, so it gets that order's receipt, as it would with room to spare; its client
// would otherwise be told to retry an order that is already accepted, for as long as
// the disk or the queue stays full. Anything else is refused.
func (s *Store) refusedUnlessRepeat(ctx context.Context, q *Queue, m *Message, refused error) (Receipt, error) {
	if m.IdempotencyKey == "" {
		return Receipt{}, refused
	}
	key := idemKey(m.Client, m.IdempotencyKey)
	m.Ticket = s.keyedTicket(q.name, key)
	if rc, found, err := s.repeat(ctx, q, key, m); found {
		return rc, err
	}
	return Receipt{}, refused
}

// endPark describes the outcome of a park on its span and ends it.
func endPark(span trace.Span, queue string, rc Receipt, err error) {
	if span.IsRecording() {
		span.SetAttributes(attribute.String("sluice.queue", queue))
		if rc.Ticket != "" {
			span.SetAttributes(attribute.String("sluice.ticket", rc.Ticket), attribute.Bool("sluice.duplicate", rc.Duplicate))
		}
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
	}
	span.End()
}

// dueTime returns when an order received at receivedAt and asking for notBefore (zero:
// nothing asked) may be delivered: the later of notBefore and receivedAt plus the
// queue's Delay, rounded up to a whole second, or zero when that is not after now.
// ErrSchedule (a *ScheduleError) when notBefore is set and the queue takes no client
// schedules or notBefore lies further than its MaxDelay from receivedAt.
func dueTime(cfg queueconfig.Config, receivedAt, notBefore, now time.Time) (time.Time, error) {
	var due time.Time
	if cfg.Delay > 0 {
		due = receivedAt.Add(cfg.Delay)
	}
	if !notBefore.IsZero() {
		asked := notBefore.Sub(receivedAt)
		if cfg.MaxDelay <= 0 || asked > cfg.MaxDelay {
			return time.Time{}, &ScheduleError{Queue: cfg.Name, MaxDelay: cfg.MaxDelay, Asked: asked}
		}
		if notBefore.After(due) {
			due = notBefore
		}
	}
	// JetStream's "@at" schedules are RFC 3339 in whole seconds: rounding up never
	// fires an order before the time it asked for.
	if t := due.Truncate(time.Second); t.Before(due) {
		due = t.Add(time.Second)
	}
	if !due.After(now) {
		return time.Time{}, nil
	}
	return due.UTC(), nil
}

// JetStream message scheduling headers (ADR-51).
const (
	headerSchedule       = "Nats-Schedule"
	headerScheduleTarget = "Nats-Schedule-Target"
)

// publish stores m in q: on its ready subject, or for a scheduled order (NotBefore
// set) as a JetStream schedule message on its schedule subject whose target is the
// ready subject. When it falls due the server stores a copy of it, headers and body,
// on the target (without Nats-Msg-Id and the scheduling headers, which the signature
// does not cover) and purges the schedule message; the dispatch consumer, filtered on
// the ready subjects, only ever sees the copy.

func (s *Store) publish(ctx context.Context, q *Queue, m *Message, msgID string) (*jetstream.PubAck, error) {
	s.sign(m)
	ready := ReadySubject(q.name, m.Lane, m.Ticket)
	if !m.NotBefore.IsZero() {
		// Straight to the stream: a schedule is never part of an atomic batch.
		msg := m.encode(scheduleSubjectFor(q.name, m.Ticket))
		msg.Header.Set(headerSchedule, "@at "+m.NotBefore.UTC().Format(time.RFC3339))
		msg.Header.Set(headerScheduleTarget, ready)
		msg.Header.Set(HeaderMsgID, msgID)
		if err := s.headerFits(msg, 0); err != nil {
			return nil, err
		}
		ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(q.StreamName()))
		if err != nil {
			return nil, s.parkError(ctx, q, m, err)
		}
		s.usage.add(len(msg.Subject) + len(msg.Data) + 64*len(msg.Header))
		if !ack.Duplicate {
			s.metrics.parked.WithLabelValues(q.name).Inc()
		}
		return ack, nil
	}
	msg := m.encode(ready)
	msg.Header.Set(HeaderMsgID, msgID)
	// Checked before the order joins a group commit: the server would refuse it there.
	if err := s.headerFits(msg, 0); err != nil {
		return nil, err
	}
	ack, err := q.orders.Load().publish(ctx, msg)
	if err != nil {
		return nil, s.parkError(ctx, q, m, err)
	}
	s.usage.add(len(msg.Subject) + len(msg.Data) + 64*len(msg.Header))
	if !ack.Duplicate {
		s.metrics.parked.WithLabelValues(q.name).Inc()
	}
	return ack, nil
}

// receiptOf is the receipt of m, stored at seq.
func (q *Queue) receiptOf(ctx context.Context, m *Message, seq uint64, duplicate bool) Receipt {
	if !m.NotBefore.IsZero() && (m.subject == "" || m.subject == scheduleSubjectFor(q.name, m.Ticket)) {
		return Receipt{Ticket: m.Ticket, Queue: q.name, Status: StatusScheduled, NotBefore: m.NotBefore,
			EstimatedDelivery: m.NotBefore, Duplicate: duplicate}
	}
	return q.receipt(ctx, m.Ticket, seq, duplicate)
}

func (q *Queue) receipt(ctx context.Context, ticket string, seq uint64, duplicate bool) Receipt {
	pos := q.position(ctx, seq)
	return Receipt{Ticket: ticket, Queue: q.name, Status: StatusQueued, Position: pos,
		EstimatedDelivery: q.eta(time.Now(), pos), Duplicate: duplicate}
}

// parkError is the error of Park for err, the publish of m: an *UnacknowledgedError
// when no answer came (the order may be stored), else publishError's.
func (s *Store) parkError(ctx context.Context, q *Queue, m *Message, err error) error {
	noAnswer := jsproto.NoAnswer(err)
	if noAnswer || errors.Is(err, context.Canceled) {
		if noAnswer { // a caller that left is no sign of JetStream's
			s.metrics.unacked.WithLabelValues(q.name).Inc()
		}
		return &UnacknowledgedError{Queue: q.name, Ticket: m.Ticket, Keyed: m.IdempotencyKey != "", Err: err}
	}
	return s.publishError(ctx, q, err)
}

func (s *Store) publishError(ctx context.Context, q *Queue, err error) error {
	switch {
	case jsproto.IsFull(err):
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		return fmt.Errorf("%w (%s)", q.fullError(fctx), jsproto.Description(err))
	case jsproto.IsNoResources(err):
		return fmt.Errorf("%w: %w: publish to %q: %s", ErrUnavailable, ErrStorageFull, q.name, jsproto.Description(err))
	case jsproto.IsHeaderTooLarge(err):
		return fmt.Errorf("%w: %s", ErrHeaderTooLarge, jsproto.Description(err))
	case jsproto.IsMsgTooLarge(err):
		return fmt.Errorf("%w: %s", ErrTooLarge, jsproto.Description(err))
	case jsproto.Description(err) != "":
		return fmt.Errorf("%w: publish to %q: %w", ErrUnavailable, q.name, err)
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %w", ErrTooLarge, err)
	}
	return fmt.Errorf("%w: publish to %q failed: %w", ErrUnavailable, q.name, err)
}
