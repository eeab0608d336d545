package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

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

// repeat implements step 1 for m, whose Ticket is its key's: found is true when the key
// belongs to an earlier order (then rc or err is the answer). It reads the queue and the records (K's in
// the bucket, T's ticket record) at once. A miss in both is trusted only when the
// queue's answer came within leaveGap of the reads' start: an order leaves its queue
// no sooner than leaveGap after one of those records is stored (see leaveAfter), so an
// order the queue read missed because it had left was recorded more than leaveGap
// before that answer, before the start, and the records, read after the start
// however late they answer, hold it. When the queue answered later, the records are
// read once more, after its answer.
func (s *Store) repeat(ctx context.Context, q *Queue, key string, m *Message) (rc Receipt, found bool, err error) {
	return s.repeatFrom(ctx, q, key, m, time.Now(), s.readRecords(ctx, key, m.Ticket))
}

// repeatFrom is repeat once the records' reads started, at start (records waits for
// them).
func (s *Store) repeatFrom(ctx context.Context, q *Queue, key string, m *Message, start time.Time, records func() records) (rc Receipt, found bool, err error) {
	_, parked, err := s.waitingAs(ctx, q, m)
	answered := time.Since(start)
	r := records()
	switch {
	case err == nil:
		rc, err := s.repeatOf(ctx, q, idemRecord{Ticket: parked.Ticket, Fingerprint: parked.Fingerprint, Queue: q.name}, m.Fingerprint)
		return rc, true, err
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return Receipt{}, false, err
	}
	if answered >= leaveGap {
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
