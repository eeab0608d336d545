package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
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

// idemRecord is the value of an idempotency key in IdempotencyBucket.
type idemRecord struct {
	Ticket      string    `json:"ticket"`
	Fingerprint string    `json:"fingerprint"`
	Queue       string    `json:"queue"`
	CreatedAt   time.Time `json:"created_at"`
}

// idemKind names idempotency records in their signatures (see Store.seal).
const idemKind = "idempotency"

// scopeToken is a client scope as one subject token: hex of sha256(client)[:16].
func scopeToken(client string) string {
	c := sha256.Sum256([]byte(client))
	return hex.EncodeToString(c[:16])
}

// idemKey is the bucket key of a client's idempotency key: {scopeToken(client)}.
// {sha256(key)}, both hex. Neither the client scope nor the key itself appear in NATS.
func idemKey(client, key string) string {
	k := sha256.Sum256([]byte(key))
	return scopeToken(client) + "." + hex.EncodeToString(k[:])
}

// keyMsgID is the Nats-Msg-Id of an order with an idempotency key (and of its key
// slot): the stream's duplicate window then stores one order per key, however many
// requests race or retry.
func keyMsgID(key string) string { return "k." + key }

// keyReserve is the share of the idempotency bucket's bytes past which Park refuses
// new keys; the rest is kept for the keys of orders already waiting, which the
// dispatchers record when the orders become final (see Lease).
const keyReserve = 0.9

// Park stores req in its queue and returns once JetStream has acknowledged it (the
// message is on disk — on every replica of an R3 stream — before Park returns a
// receipt). Errors: ErrUnknownQueue, ErrInvalidRequest, ErrFull (a *FullError with a
// retry delay), ErrUnavailable, ErrKeyStoreFull, ErrTooManyKeys (a *KeyLimitError),
// ErrIdempotencyConflict, ErrTooLarge, ErrHeaderTooLarge (a *HeaderLimitError: headers
// the server can never store; BodyLimit tells it before the body is read). After an
// error nothing was accepted and no key recorded: the same key works again.
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
//     missed between the reads when both came back within leaveGap (else the records
//     are read again; see repeat). While it waits, an order is found in its own queue
//     only: K's ticket is derived per queue.
//  2. The bucket is within keyReserve of its byte cap (else ErrKeyStoreFull), and a
//     slot is taken for K in the queue's key stream, on the client's subject, whose
//     per-subject limit is MaxIdempotencyKeys (discard-new: ErrTooManyKeys), with
//     Nats-Msg-Id "k."+K. Slots expire after IdempotencyTTL, so the cap counts the
//     keys accepted within it.
//  3. The order is published with Nats-Msg-Id "k."+K. Refused (full queue, too
//     large…): the slot is deleted and the error returned. A duplicate PubAck (a
//     concurrent or retried request with K within the duplicate window): the stored
//     message gives the ticket and fingerprint.
//
// One synced write per new key, its order's, which may share its disk sync with
// concurrent Parks (see "Group commit" in the package documentation); on a single
// server the slot's write is not synced (see Store.ensureKeyStream). The slot is
// stored before the order is written, so that an order anybody can see (a repeat, a
// dispatcher) is never withdrawn for its slot; a repeat writes nothing.
//
// Crash safety: what a crash (of this process, or of the NATS server) leaves between
// the steps.
//   - During 1: nothing (1 writes nothing). During 2: nothing, or a slot without an
//     order, which counts against its client's cap until its TTL ends. The client has
//     no receipt; its retry finds no order, and its slot is a duplicate of the stray
//     one within the duplicate window (same Nats-Msg-Id), so it takes no second place.
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
//   - A NATS server crash may lose unsynced slots (a single server's key stream): their
//     clients may get past the cap until the TTL; no order is lost or repeated, since
//     the order and K's record are synced writes.
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
	if err := s.usage.check(ctx); err != nil {
		return Receipt{}, err
	}
	if err := q.laneRoom(ctx, cfg, m.Lane); err != nil {
		return Receipt{}, err
	}
	if err := q.checkRoom(ctx); err != nil {
		return Receipt{}, err
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

// Repeat answers req as Park answers a repeat, and parks nothing: found, the receipt
// of the order that req's IdempotencyKey names in its queue (its status, Duplicate
// set), or ErrIdempotencyConflict when that order's payload differs; not found when
// the key names no order there (or req has no key), and then nothing is written. It
// is for a request the front door would proxy: one whose key an accepted order holds
// must not reach the downstream a second time. Errors as Park's (ErrUnavailable: it
// could not be told).
func (s *Store) Repeat(ctx context.Context, req *Request) (rc Receipt, found bool, err error) {
	if req.IdempotencyKey == "" {
		return Receipt{}, false, nil
	}
	if err := req.validate(); err != nil {
		return Receipt{}, false, err
	}
	q, err := s.Queue(req.Queue)
	if err != nil {
		return Receipt{}, false, err
	}
	if !s.connected() {
		return Receipt{}, false, fmt.Errorf("%w: not connected to NATS", ErrUnavailable)
	}
	m := &Message{Request: *req}
	m.Header = KeptHeader(req.Header, q.Config().DropHeaders)
	m.Fingerprint = Fingerprint(&m.Request) // as Park has it
	m.Lane, m.Tenant = s.laneFor(q.Config(), req.Priority, req.Tenant), ""
	m.FlowKey, m.Flow = s.flowKeyFor(q.Config(), req.Flow), ""
	key := idemKey(m.Client, m.IdempotencyKey)
	m.Ticket = s.keyedTicket(q.name, key)
	ctx, cancel := context.WithTimeout(ctx, s.opts.publishTimeout)
	defer cancel()
	return s.repeat(ctx, q, key, m)
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
			return nil, s.publishError(ctx, q, err)
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
		return nil, s.publishError(ctx, q, err)
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

// keyedTicket is the ticket of an order with the idempotency key key (see idemKey) in
// queue: derived from both with the signing key, so that every request with the key
// names the same ticket before anything is written (see parkKeyed), and nobody without
// the signing key can tell it.
func (s *Store) keyedTicket(queue, key string) string {
	sum := s.mac("keyed-ticket", []byte(queue), []byte(key))
	return strings.ToLower(ticketEncoding.EncodeToString(sum[:16]))
}

// parkKeyed is Park for a request with an idempotency key (steps 1 to 3).
func (s *Store) parkKeyed(ctx context.Context, q *Queue, m *Message) (Receipt, error) {
	key := idemKey(m.Client, m.IdempotencyKey)
	m.Ticket = s.keyedTicket(q.name, key)
	if rc, ok, err := s.repeat(ctx, q, key, m); ok || err != nil {
		return rc, err
	}
	if err := s.keyRoom(ctx); err != nil {
		return Receipt{}, err
	}
	// The slot after the lookup: a repeat takes none, so it never counts against its
	// client's cap, even for a moment beside a new key. (Taken during the lookup, a
	// repeat past the duplicate window refused a racing new key one below the cap,
	// and on the embedded server the overlap saved nothing measurable.) And before the
	// order: an order that anybody can see (a repeat, a dispatcher) has its slot, so
	// nothing seen is ever withdrawn.
	slot, err := s.takeSlot(ctx, q, m.Client, key)
	if err != nil {
		return Receipt{}, err
	}
	ack, err := s.publish(ctx, q, m, keyMsgID(key))
	if err != nil {
		s.freeSlot(ctx, q, slot)
		return Receipt{}, err
	}
	if ack.Duplicate {
		// The slot stays: it is the key's, not this request's. Slots of one key are
		// deduplicated like its orders (the same Nats-Msg-Id and window), so a slot taken
		// here (slot != 0) is the key's only one even when a racing request with the
		// key stored the order first; freeing it would let the client past its cap.
		return s.duplicate(ctx, q, key, m, ack.Sequence)
	}
	return q.receiptOf(ctx, m, ack.Sequence, false), nil
}

// repeat implements step 1 for m, whose Ticket is its key's: found is true when the key
// belongs to an earlier order (then rc or err is the answer). It reads the queue and the records (K's in
// the bucket, T's ticket record) at once. A miss in both is trusted only when both
// answers came within leaveGap of the reads' start: an order leaves its queue no
// sooner than leaveGap after one of those records is stored (see leaveAfter), so an
// order the queue read missed because it had left was recorded before the records
// were read. When the reads took longer, the records are read once more, after the
// queue's answer.
func (s *Store) repeat(ctx context.Context, q *Queue, key string, m *Message) (rc Receipt, found bool, err error) {
	return s.repeatFrom(ctx, q, key, m, time.Now(), s.readRecords(ctx, key, m.Ticket))
}

// repeatFrom is repeat once the records' reads started, at start (records waits for
// them).
func (s *Store) repeatFrom(ctx context.Context, q *Queue, key string, m *Message, start time.Time, records func() records) (rc Receipt, found bool, err error) {
	_, parked, err := s.waitingAs(ctx, q, m)
	r := records()
	switch {
	case err == nil:
		rc, err := s.repeatOf(ctx, q, idemRecord{Ticket: parked.Ticket, Fingerprint: parked.Fingerprint, Queue: q.name}, m.Fingerprint)
		return rc, true, err
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return Receipt{}, false, err
	}
	if time.Since(start) >= leaveGap {
		r = s.readRecords(ctx, key, m.Ticket)()
	}
	switch {
	case r.keyErr != nil:
		return Receipt{}, false, r.keyErr
	case r.found: // final (recorded after it was stored), or parked by an earlier sluice, which recorded keys at once
		rc, err := s.repeatOf(ctx, q, r.prev, m.Fingerprint)
		return rc, true, err
	case r.recErr == nil:
		// A ticket record but no key: a cancelled order (a key is recorded when its
		// order is delivered or dead-lettered), or one whose key has just expired.
		if r.rec.Fingerprint != "" && r.rec.Fingerprint != m.Fingerprint {
			return Receipt{}, true, ErrIdempotencyConflict
		}
		return Receipt{Ticket: r.rec.Ticket, Queue: r.rec.Queue, Status: r.rec.Status, EstimatedDelivery: time.Now(), Duplicate: true}, true, nil
	case !errors.Is(r.recErr, ErrNotFound):
		return Receipt{}, false, r.recErr
	}
	return Receipt{}, false, nil
}

// records is what readRecords read of a key and its ticket.
type records struct {
	prev   idemRecord
	found  bool
	keyErr error
	rec    *Record
	recErr error
}

// readRecords starts reading key's record and ticket's, both at once; the function
// it returns waits for them.
func (s *Store) readRecords(ctx context.Context, key, ticket string) func() records {
	var r records
	done := make(chan struct{}, 2)
	go func() {
		r.rec, r.recErr = s.Record(ctx, ticket)
		done <- struct{}{}
	}()
	go func() {
		r.prev, r.found, r.keyErr = s.getKey(ctx, key)
		done <- struct{}{}
	}()
	return func() records {
		<-done
		<-done
		return r
	}
}

// leaveGap is how long after a record that a repeat's lookup reads (a key's record, a
// final or cancelled ticket record) is stored its keyed order may leave the queue at
// the earliest (see repeat).
const leaveGap = 2 * time.Millisecond

// leaveAfter returns once leaveGap has passed since visible, a time after a record
// that repeat reads was stored, for an order about to leave its queue.
func leaveAfter(visible time.Time) {
	if d := leaveGap - time.Since(visible); d > 0 {
		time.Sleep(d)
	}
}

// repeatOf answers a request whose key is recorded as prev.
func (s *Store) repeatOf(ctx context.Context, q *Queue, prev idemRecord, fingerprint string) (Receipt, error) {
	if prev.Fingerprint != fingerprint {
		return Receipt{}, ErrIdempotencyConflict
	}
	now := time.Now()
	rc := Receipt{Ticket: prev.Ticket, Queue: prev.Queue, EstimatedDelivery: now, Duplicate: true}
	rec, err := s.Record(ctx, prev.Ticket)
	switch {
	case err == nil && rec.Status != StatusQueued:
		rc.Status = rec.Status
		return rc, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return Receipt{}, err
	}
	if pq, err := s.Queue(prev.Queue); err == nil {
		q = pq
	}
	raw, m, err := s.waiting(ctx, q, prev.Ticket)
	switch {
	case err == nil:
		return q.receiptOf(ctx, m, raw.Sequence, true), nil
	case errors.Is(err, jetstream.ErrMsgNotFound):
		if rec != nil {
			rc.Status = rec.Status
		}
		return rc, nil // final long ago: its record expired before the key
	default:
		return Receipt{}, err
	}
}

// waitingAs returns the waiting order of m's ticket: as a schedule message (before it
// falls due), on the ready subject of m's lane, and only then, when the queue may have
// lanes, on any ready subject of the ticket. The literal subjects first: a direct get by
// the lane wildcard walks every ticket of an unlaned queue.
func (s *Store) waitingAs(ctx context.Context, q *Queue, m *Message) (*jetstream.RawStreamMsg, *Message, error) {
	raw, parked, err := s.scheduled(ctx, q, m.Ticket)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		raw, parked, err = s.parkedOn(ctx, q, ReadySubject(q.name, m.Lane, m.Ticket))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) && (m.Lane != "" || q.mayHaveLanes.Load()) {
		// Another lane (the repeat's priority or tenant differs, or the lanes changed).
		return s.parked(ctx, q, m.Ticket)
	}
	return raw, parked, err
}

// duplicate answers m, whose publish was a duplicate of the message at seq (a racing
// or retried request with its key, within the duplicate window).
func (s *Store) duplicate(ctx context.Context, q *Queue, key string, m *Message, seq uint64) (Receipt, error) {
	raw, err := s.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: seq})
	if err == nil && raw.Header.Get(HeaderMsgID) == keyMsgID(key) {
		stored, derr := decodeRaw(raw)
		if derr == nil {
			derr = s.Verify(stored) // a forged message cannot lend its ticket
		}
		if derr != nil {
			return Receipt{}, fmt.Errorf("%w: %w", ErrUnavailable, derr)
		}
		if stored.Fingerprint != m.Fingerprint {
			return Receipt{}, ErrIdempotencyConflict
		}
		return q.receiptOf(ctx, stored, seq, true), nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return Receipt{}, unavailable("message lookup", err)
	}
	// Delivered and acknowledged meanwhile: the dispatcher recorded the key first.
	if rc, ok, err := s.repeat(ctx, q, key, m); ok || err != nil {
		return rc, err
	}
	return Receipt{}, fmt.Errorf("%w: the order with this idempotency key is being settled; retry", ErrUnavailable)
}

func (s *Store) getKey(ctx context.Context, key string) (idemRecord, bool, error) {
	entry, err := s.readKey(ctx, s.idem, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return idemRecord{}, false, nil
	}
	if err != nil {
		return idemRecord{}, false, unavailable("idempotency key", err)
	}
	var rec idemRecord
	err = s.unseal(idemKind, key, entry.Value(), &rec)
	if errors.Is(err, ErrForged) {
		// Not written by sluice: it decides nothing. Remove it (unless it changed
		// meanwhile) so that the key can be recorded for a real order.
		s.log.Warn("removing a forged idempotency record", "key", key)
		if err := s.idem.Delete(ctx, key, jetstream.LastRevision(entry.Revision())); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return idemRecord{}, false, unavailable("idempotency key", err)
		}
		return idemRecord{}, false, nil
	}
	if err != nil || !ValidTicket(rec.Ticket) {
		return idemRecord{}, false, fmt.Errorf("%w: corrupt idempotency record", ErrUnavailable)
	}
	return rec, true, nil
}

// keyStoreError maps a failed write to the bucket or a key stream.
func keyStoreError(err error) error {
	if jsproto.IsFull(err) {
		return fmt.Errorf("%w (%s)", ErrKeyStoreFull, jsproto.Description(err))
	}
	return unavailable("idempotency key", err)
}

// keyRoom fails with ErrKeyStoreFull when the idempotency bucket holds more than
// keyReserve of its byte cap (stream info at most a second old).
func (s *Store) keyRoom(ctx context.Context) error {
	if s.opts.idemMaxBytes <= 0 {
		return nil
	}
	info, err := s.idemInfo.streamInfo(ctx, time.Second)
	if err != nil {
		return err
	}
	if float64(info.State.Bytes) >= keyReserve*float64(s.opts.idemMaxBytes) {
		return fmt.Errorf("%w: %d of %d bytes used", ErrKeyStoreFull, info.State.Bytes, s.opts.idemMaxBytes)
	}
	return nil
}

// takeSlot implements step 2's slot: it returns the slot's sequence in the queue's key
// stream (0 when the publish was a duplicate: a racing request with the key holds it).
func (s *Store) takeSlot(ctx context.Context, q *Queue, client, key string) (uint64, error) {
	cfg := q.Config()
	msg := nats.NewMsg(keySubjectFor(q.name, scopeToken(client)))
	msg.Header.Set(HeaderMsgID, keyMsgID(key))
	msg.Header.Set(jetstream.MsgTTLHeader, cfg.IdempotencyTTL.String())
	w := q.slots.Load()
	if w == nil { // an orphan: no key stream known
		w = newGroupCommit(nil, s.js, KeyStreamName(q.name), s.opts.publishTimeout, 0)
	}
	ack, err := w.publish(ctx, msg)
	if err != nil {
		if jsproto.IsPerSubjectLimit(err) {
			return 0, q.keyLimitError(ctx, msg.Subject)
		}
		return 0, keyStoreError(err)
	}
	if ack.Duplicate {
		return 0, nil
	}
	return ack.Sequence, nil
}

// keyLimitError says when the client's oldest key slot expires.
func (q *Queue) keyLimitError(ctx context.Context, subject string) error {
	cfg := q.Config()
	e := &KeyLimitError{Queue: q.name, Limit: cfg.MaxIdempotencyKeys, RetryAfter: time.Second}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if raw, err := q.store.readMsg(fctx, q.keys, jsproto.MsgQuery{Seq: 1, Next: subject}); err == nil {
		e.RetryAfter = max(time.Until(raw.Time.Add(cfg.IdempotencyTTL)).Round(time.Second), time.Second)
	}
	return e
}

// freeSlot deletes the key slot (0: none) of a request whose order was refused. It
// runs even when ctx has ended.
func (s *Store) freeSlot(ctx context.Context, q *Queue, slot uint64) {
	if slot == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := q.keys.DeleteMsg(ctx, slot); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		s.log.Warn("cannot free an idempotency key slot; it expires with its TTL", "queue", q.name, "err", err)
	}
}

// keepKey gives the idempotency key of m, whose order has become final (done, failed or
// dead), its final lifetime: the queue's IdempotencyTTL from now. A key recorded for
// another ticket is left alone; a missing one (ingress died before recording it) is
// created. The dispatcher calls it before it writes the final record and acknowledges
// the message, so a key is never gone while its order is still queued.
func (s *Store) keepKey(ctx context.Context, m *Message) error {
	if m.IdempotencyKey == "" {
		return nil
	}
	ttl := queueconfig.DefaultIdempotencyTTL
	if q, err := s.Queue(m.Queue); err == nil {
		ttl = q.Config().IdempotencyTTL
	}
	key := idemKey(m.Client, m.IdempotencyKey)
	entry, err := s.readKey(ctx, s.idem, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		val, err := s.seal(idemKind, key, idemRecord{Ticket: m.Ticket, Fingerprint: m.Fingerprint, Queue: m.Queue, CreatedAt: time.Now().UTC()})
		if err != nil {
			return err
		}
		if _, err := s.idem.Create(ctx, key, val, jetstream.KeyTTL(ttl)); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return keyStoreError(err)
		}
		return nil
	case err != nil:
		return unavailable("idempotency key", err)
	}
	var rec idemRecord
	if err := s.unseal(idemKind, key, entry.Value(), &rec); err != nil || rec.Ticket != m.Ticket {
		return nil
	}
	if _, err := jsproto.KVPut(ctx, s.js, IdempotencyBucket, key, entry.Value(), ttl,
		jetstream.WithExpectLastSequencePerSubject(entry.Revision())); err != nil {
		return keyStoreError(err)
	}
	return nil
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
	return fmt.Errorf("%w: publish to %q not acknowledged: %w", ErrUnavailable, q.name, err)
}
