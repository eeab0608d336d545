package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// cancelSettleWait bounds how long Cancel waits for a dispatcher that took the order
// in the instant of the cancellation to settle it.
const cancelSettleWait = 5 * time.Second

// Cancel cancels a queued order: its record says cancelled and its message is removed
// from the queue, so it is never delivered. The ticket is the capability (as for
// Status). Errors: ErrNotFound (unknown or expired ticket), ErrNotCancellable (the
// order is delivering or final; the error names the status), ErrCancelUndecided (see
// there; asking again is safe), ErrUnavailable. Cancelling a cancelled ticket succeeds.
//
// Why nothing cancelled is delivered: the cancellation is a compare-and-set write of
// the ticket record. A dispatcher reads the record after it fetched the order and skips
// cancelled ones; for an order with a record it also marks it delivering with a
// compare-and-set write before delivering (Lease.Start), so exactly one of the two
// writes wins. An order without a record (first attempt) is cancelled only when the
// consumer had not handed it out after the cancellation was written: a later fetch
// then reads the cancelled record. When the consumer handed it out meanwhile, Cancel
// waits (briefly) for that dispatcher's verdict.
func (s *Store) Cancel(ctx context.Context, ticket string) error {
	if !ValidTicket(ticket) {
		return ErrNotFound
	}
	for range 3 {
		err := s.cancel(ctx, ticket)
		if !errors.Is(err, errWrongRevision) {
			return err
		}
	}
	return fmt.Errorf("%w: the ticket record keeps changing", ErrUnavailable)
}

func (s *Store) cancel(ctx context.Context, ticket string) error {
	rec, err := s.Record(ctx, ticket)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if rec != nil {
		switch rec.Status {
		case StatusCancelled:
			q, raw, err := s.findMessage(ctx, ticket, rec.Queue)
			if err != nil || raw == nil {
				return err
			}
			return s.settleCancel(ctx, q, raw, rec)
		case StatusQueued:
		default:
			return fmt.Errorf("%w: it is %s", ErrNotCancellable, rec.Status)
		}
		q, raw, err := s.findMessage(ctx, ticket, rec.Queue)
		if err != nil {
			return err
		}
		if raw == nil {
			// Queued by its record, but the message left the queue: a dispatcher is
			// settling it right now.
			return fmt.Errorf("%w: it is being settled", ErrNotCancellable)
		}
		rec.Status, rec.LastError, rec.NextAttemptAt = StatusCancelled, "cancelled by the ticket holder", time.Time{}
		if err := s.saveRecord(ctx, rec, jetstream.WithExpectLastSequencePerSubject(rec.rev)); err != nil {
			return err
		}
		// Every dispatcher marks such an order delivering with a compare-and-set
		// against the revision it read, which this write has changed: none delivers it.
		return s.removeCancelled(ctx, q, raw, rec)
	}
	q, raw, err := s.findMessage(ctx, ticket, "")
	if err != nil {
		return err
	}
	if raw == nil {
		return s.cancelScheduled(ctx, ticket)
	}
	if handedOut, err := q.handedOut(ctx, raw); err != nil {
		return err
	} else if handedOut {
		return fmt.Errorf("%w: it is %s", ErrNotCancellable, StatusDelivering)
	}
	m, err := decodeRaw(raw)
	if err != nil {
		return err
	}
	rec = &Record{Ticket: ticket, Queue: q.name, Rule: m.Rule, Status: StatusCancelled,
		LastError: "cancelled by the ticket holder", ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
	if err := s.saveRecord(ctx, rec, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return err
	}
	return s.settleCancel(ctx, q, raw, rec)
}

// cancelScheduled cancels an order without a record that waits for its due time: the
// cancelled record is written first (compare-and-set against no record), so that a
// dispatcher fetching the order after it drops it, then the schedule message is
// deleted. The schedule may have fired meanwhile: its ready copy is then settled as any
// queued order (settleCancel); when that copy is gone too, a dispatcher took it, and the
// record says what came of it (a delivery writes its final record before the message
// leaves the queue). ErrNotFound when the ticket has no scheduled order either.
func (s *Store) cancelScheduled(ctx context.Context, ticket string) error {
	var q *Queue
	var raw *jetstream.RawStreamMsg
	var m *Message
	for _, cand := range s.Queues() {
		r, msg, err := s.scheduled(ctx, cand, ticket)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		q, raw, m = cand, r, msg
		break
	}
	if raw == nil {
		// Fired between the caller's look at the ready subjects and ours?
		_, ready, err := s.findMessage(ctx, ticket, "")
		switch {
		case err != nil:
			return err
		case ready != nil:
			return errWrongRevision // look again from the start
		}
		// Settled by a dispatcher since the caller read no record: the final record is
		// written before the message leaves the queue, so it is there now.
		switch _, err := s.Record(ctx, ticket); {
		case err == nil:
			return errWrongRevision // look again from the start: the record decides
		case !errors.Is(err, ErrNotFound):
			return err
		}
		return ErrNotFound
	}
	rec := &Record{Ticket: ticket, Queue: q.name, Rule: m.Rule, Status: StatusCancelled,
		LastError: "cancelled by the ticket holder", ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint,
		keepUntil: m.NotBefore}
	if err := s.saveRecord(ctx, rec, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		return err
	}
	leaveAfter(time.Now()) // a repeat's lookup may still have to find the order (see Store.repeat)
	delErr := q.stream.DeleteMsg(ctx, raw.Sequence)
	if delErr != nil && !errors.Is(delErr, jetstream.ErrMsgNotFound) {
		// The record says cancelled: a fired copy is dropped by the dispatcher that
		// fetches it.
		s.log.Warn("cancelled scheduled order keeps its schedule until it fires and a dispatcher drops it",
			"queue", q.name, "ticket", ticket, "err", delErr)
	}
	ready, _, err := s.parked(ctx, q, ticket)
	switch {
	case err == nil:
		return s.settleCancel(ctx, q, ready, rec)
	case !errors.Is(err, jetstream.ErrMsgNotFound):
		return err
	case delErr == nil:
		// Deleted before it fired (or fired just now, after the record was written:
		// then a dispatcher drops the copy).
		s.cancelled(rec)
		return nil
	}
	cur, err := s.Record(ctx, ticket)
	switch {
	case err != nil:
		return err
	case cur.Status == StatusCancelled:
		s.cancelled(rec)
		return nil
	case cur.Status == StatusQueued:
		return errWrongRevision // a failed first attempt: queued again, try once more
	}
	return fmt.Errorf("%w: it is %s", ErrNotCancellable, cur.Status)
}

// settleCancel finishes the cancellation of an order without an earlier record once
// the cancelled record is written.
func (s *Store) settleCancel(ctx context.Context, q *Queue, raw *jetstream.RawStreamMsg, rec *Record) error {
	handedOut, err := q.handedOut(ctx, raw)
	if err != nil {
		return err
	}
	if !handedOut {
		// Any later fetch reads the cancelled record first.
		return s.removeCancelled(ctx, q, raw, rec)
	}
	// Handed out around the cancellation: the dispatcher either read the record before
	// it was cancelled (it delivers, and its own record replaces ours) or after (it
	// drops the order unseen). Wait for whichever it is.
	wctx, cancel := context.WithTimeout(ctx, cancelSettleWait)
	defer cancel()
	for {
		cur, err := s.Record(wctx, rec.Ticket)
		switch {
		case err == nil && cur.Status == StatusQueued:
			return errWrongRevision // a failed attempt: queued again, try once more
		case err == nil && cur.Status != StatusCancelled:
			return fmt.Errorf("%w: it is %s", ErrNotCancellable, cur.Status)
		case err != nil && !errors.Is(err, ErrNotFound) && wctx.Err() == nil:
			return err
		}
		_, err = s.readMsg(wctx, q.stream, jsproto.MsgQuery{Seq: raw.Sequence})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			s.cancelled(rec)
			return nil
		}
		select {
		case <-wctx.Done():
			return ErrCancelUndecided
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (s *Store) removeCancelled(ctx context.Context, q *Queue, raw *jetstream.RawStreamMsg, rec *Record) error {
	leaveAfter(time.Now()) // its cancelled record is stored: see Store.repeat
	if err := q.stream.DeleteMsg(ctx, raw.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		// The record says cancelled, so no dispatcher delivers it; it is acknowledged
		// unseen when fetched.
		s.log.Warn("cancelled order stays in the queue until a dispatcher drops it", "queue", q.name, "ticket", rec.Ticket, "err", err)
	}
	s.cancelled(rec)
	return nil
}

func (s *Store) cancelled(rec *Record) {
	s.log.Info("order cancelled by its ticket holder", "queue", rec.Queue, "ticket", rec.Ticket)
	_ = s.publishEvent(DoneSubject(rec.Queue), Event{Ticket: rec.Ticket, Queue: rec.Queue, Rule: rec.Rule,
		Status: StatusCancelled, Attempts: rec.Attempts, At: time.Now().UTC()})
}

// findMessage returns the queued message of a ticket: in the named queue, or in any
// queue of the store when name is "". raw is nil when there is none.
func (s *Store) findMessage(ctx context.Context, ticket, name string) (*Queue, *jetstream.RawStreamMsg, error) {
	qs := s.Queues()
	if name != "" {
		q, err := s.Queue(name)
		if err != nil {
			return nil, nil, nil
		}
		qs = []*Queue{q}
	}
	for _, q := range qs {
		raw, _, err := s.parked(ctx, q, ticket)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		return q, raw, nil
	}
	return nil, nil, nil
}

// handedOut reports whether the consumer serving raw (see servingConsumer) has handed
// it to a dispatcher (Status calls such an order without a record delivering).
func (q *Queue) handedOut(ctx context.Context, raw *jetstream.RawStreamMsg) (bool, error) {
	seq := raw.Sequence
	cons, err := q.servingConsumer(ctx, raw.Subject)
	if errors.Is(err, jetstream.ErrConsumerNotFound) {
		return false, nil
	}
	if err != nil {
		return false, unavailable("consumer of "+q.name, err)
	}
	return seq <= cons.CachedInfo().Delivered.Stream, nil
}

// markDelivering records that a delivery attempt of a ticket with a stored record
// starts: a compare-and-set against the revision rec was read at, so that it and a
// concurrent Cancel cannot both succeed. rec must come from Record. Errors:
// ErrCancelled (the order was cancelled: do not deliver it); ErrUnavailable (the
// record could not be written; whether to deliver anyway is the caller's choice, no
// cancellation can have been written either); any other error means the record
// changed under us in another way (for example it became final): do not deliver now.
func (s *Store) markDelivering(ctx context.Context, rec *Record) error {
	d := *rec
	d.Status, d.NextAttemptAt = StatusDelivering, time.Time{}
	for range 3 {
		err := s.saveRecord(ctx, &d, jetstream.WithExpectLastSequencePerSubject(d.rev))
		if !errors.Is(err, errWrongRevision) {
			if err == nil {
				rec.rev = d.rev
			}
			return err
		}
		cur, err := s.Record(ctx, rec.Ticket)
		switch {
		case err != nil:
			return err
		case cur.Status == StatusCancelled:
			return ErrCancelled
		case cur.Status.Final():
			return fmt.Errorf("queue: ticket %s is already %s", rec.Ticket, cur.Status)
		}
		d.rev = cur.rev // a write of our own (an earlier attempt) came in between
	}
	return fmt.Errorf("queue: the record of ticket %s keeps changing", rec.Ticket)
}
