package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// DeadLetter is a message that ran out of delivery attempts.
type DeadLetter struct {
	// Seq is its sequence in the dead-letter stream.
	Seq      uint64
	Message  *Message
	Reason   string
	Attempts int
	DeadAt   time.Time
}

// deadLetter copies m to the dead-letter stream and waits for the acknowledgement. The
// dispatcher calls it before it terminates the message in the queue; a repeat for the
// same queued message (after a crash in between) is dropped by the duplicate window.
// The dead letter expires after its queue's DeadLetterMaxAge (the default when the
// queue is not declared on s).
func (s *Store) deadLetter(ctx context.Context, m *Message, attempts int, reason string) error {
	ttl := queueconfig.DefaultDeadLetterMaxAge
	if q, err := s.Queue(m.Queue); err == nil {
		ttl = q.Config().DeadLetterMaxAge
	}
	msg := m.encode(deadSubjectFor(m.Queue, m.Ticket))
	msg.Header.Set(HeaderMsgID, "dead."+m.Ticket+"."+strconv.FormatUint(m.Seq, 10))
	msg.Header.Set(HeaderDeadReason, oneLine(reason))
	msg.Header.Set(HeaderDeadAttempts, strconv.Itoa(attempts))
	msg.Header.Set(HeaderDeadAt, time.Now().UTC().Format(time.RFC3339Nano))
	msg.Header.Set(HeaderDeadSeq, strconv.FormatUint(m.Seq, 10))
	if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(DeadStream), jetstream.WithMsgTTL(ttl)); err != nil {
		return unavailable("dead letter", err)
	}
	return nil
}

// DeadLetters lists up to limit (0: all) dead letters of a queue, oldest first.
func (s *Store) DeadLetters(ctx context.Context, queue string, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := s.eachDead(ctx, queue, func(dl DeadLetter) bool {
		out = append(out, dl)
		return limit <= 0 || len(out) < limit
	})
	return out, err
}

func (s *Store) eachDead(ctx context.Context, queue string, fn func(DeadLetter) bool) error {
	if !queueconfig.ValidName(queue) {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	filter := "sluice.dlq." + queue + ".*"
	for seq := uint64(1); ; seq++ {
		raw, err := s.readMsg(ctx, s.dead, jsproto.MsgQuery{Seq: seq, Next: filter})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil
		}
		if err != nil {
			return unavailable("dead letters", err)
		}
		seq = raw.Sequence
		m, err := decodeRaw(raw)
		if err != nil {
			s.log.Warn("skipping undecodable dead letter", "queue", queue, "seq", raw.Sequence, "err", err)
			continue
		}
		dl := DeadLetter{Seq: raw.Sequence, Message: m, Reason: raw.Header.Get(HeaderDeadReason)}
		dl.Attempts, _ = strconv.Atoi(raw.Header.Get(HeaderDeadAttempts))
		dl.DeadAt, _ = time.Parse(time.RFC3339Nano, raw.Header.Get(HeaderDeadAt))
		if orig, err := strconv.ParseUint(raw.Header.Get(HeaderDeadSeq), 10, 64); err == nil {
			m.Seq = orig
		}
		if !fn(dl) {
			return nil
		}
	}
}

// Requeue moves dead letters of a declared queue back into it: the given tickets, or
// all when none are given. Each keeps its ticket; its record goes back to queued with
// zero attempts. It returns how many were moved; on a full queue it stops with ErrFull.
//
// Order per message: the record is reset first (a record still saying dead would make
// the dispatcher skip the message), then the message is published (Nats-Msg-Id
// requeue.{ticket}.{dead-letter seq}, so a repeated requeue after a crash is a
// duplicate), then the dead letter is deleted.
//
// Signatures are kept: a genuine order verifies again, a forged one (see Verify) stays
// forged, and its ticket's record is left alone.
//
// The queue need not be declared on this store (a tool such as `sluice dlq` knows no
// rules): its stream must exist, and records then get the default lifetime.
func (s *Store) Requeue(ctx context.Context, queue string, tickets ...string) (int, error) {
	q, err := s.Queue(queue)
	if err != nil {
		if !queueconfig.ValidName(queue) {
			return 0, err
		}
		if _, serr := s.js.Stream(ctx, StreamName(queue)); errors.Is(serr, jetstream.ErrStreamNotFound) {
			return 0, err
		} else if serr != nil {
			return 0, unavailable("stream of "+queue, serr)
		}
		q = nil
	}
	var todo []DeadLetter
	if err := s.eachDead(ctx, queue, func(dl DeadLetter) bool {
		if len(tickets) == 0 || slices.Contains(tickets, dl.Message.Ticket) {
			todo = append(todo, dl)
		}
		return true
	}); err != nil {
		return 0, err
	}
	if len(tickets) > 0 && len(todo) == 0 {
		return 0, fmt.Errorf("%w: no dead letter with those tickets in %q", ErrNotFound, queue)
	}
	moved := 0
	for _, dl := range todo {
		m := dl.Message
		rec := &Record{
			Ticket:      m.Ticket,
			Queue:       queue,
			Rule:        m.Rule,
			Status:      StatusQueued,
			ReceivedAt:  m.ReceivedAt,
			Fingerprint: m.Fingerprint,
		}
		// A forged one goes back as it is (and is dead-lettered again), without
		// touching the record of the ticket it names, which may be a genuine order's.
		forged := s.Verify(m) != nil
		if !forged {
			if err := s.saveRecord(ctx, rec); err != nil {
				return moved, err
			}
		}
		m.Queue = queue
		msg := m.encode(ReadySubject(queue, m.Lane, m.Ticket))
		msg.Header.Set(HeaderMsgID, "requeue."+m.Ticket+"."+strconv.FormatUint(dl.Seq, 10))
		if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(StreamName(queue))); err != nil {
			// The message is still a dead letter: say so again (best effort; the
			// context may be what failed).
			if !forged {
				rec.Status, rec.Attempts, rec.LastError = StatusDead, dl.Attempts, dl.Reason
				restoreCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				_ = s.saveRecord(restoreCtx, rec)
				cancel()
			}
			if q == nil {
				if jsproto.IsFull(err) {
					return moved, &FullError{Queue: queue, RetryAfter: time.Second}
				}
				return moved, unavailable("requeue to "+queue, err)
			}
			return moved, s.publishError(ctx, q, err)
		}
		if err := s.dead.DeleteMsg(ctx, dl.Seq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
			return moved, unavailable("delete dead letter", err)
		}
		moved++
	}
	return moved, nil
}

// PurgeDeadLetters deletes dead letters of a queue for good: the given tickets, or all
// when none are given. It returns how many it deleted; tickets that have no dead letter
// in the queue make it return ErrNotFound (after deleting the others).
func (s *Store) PurgeDeadLetters(ctx context.Context, queue string, tickets ...string) (int, error) {
	if len(tickets) == 0 {
		n := 0
		if err := s.eachDead(ctx, queue, func(DeadLetter) bool { n++; return true }); err != nil {
			return 0, err
		}
		if err := s.dead.Purge(ctx, jetstream.WithPurgeSubject("sluice.dlq."+queue+".*")); err != nil {
			return 0, unavailable("purge dead letters", err)
		}
		return n, nil
	}
	if !queueconfig.ValidName(queue) {
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, queue)
	}
	n := 0
	var missing []string
	for _, t := range tickets {
		if !ValidTicket(t) {
			missing = append(missing, t)
			continue
		}
		// One subject per ticket (sluice.dlq.{queue}.{ticket}): purging it deletes
		// that dead letter and every repeat of it.
		subject := deadSubjectFor(queue, t)
		if _, err := s.readMsg(ctx, s.dead, jsproto.MsgQuery{Last: subject}); errors.Is(err, jetstream.ErrMsgNotFound) {
			missing = append(missing, t)
			continue
		} else if err != nil {
			return n, unavailable("dead letters", err)
		}
		if err := s.dead.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
			return n, unavailable("purge dead letter", err)
		}
		n++
	}
	if len(missing) > 0 {
		return n, fmt.Errorf("%w: no dead letter in %q with ticket %s", ErrNotFound, queue, strings.Join(missing, ", "))
	}
	return n, nil
}

func oneLine(s string) string {
	b := []byte(s)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	if len(b) > 512 {
		b = b[:512]
	}
	return string(b)
}
