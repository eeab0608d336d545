package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Status is the state of a ticket.
type Status string

// Ticket states. done, failed, dead and cancelled are final.
const (
	StatusScheduled  Status = "scheduled"  // waiting for its due time (Request.NotBefore, a queue's Delay); then queued
	StatusQueued     Status = "queued"     // waiting in the queue (also between retries and during pauses)
	StatusDelivering Status = "delivering" // a delivery attempt is running
	StatusDone       Status = "done"       // the downstream accepted it (2xx, or the publish was acknowledged)
	StatusFailed     Status = "failed"     // the downstream refused it for good (a 4xx other than 429)
	StatusDead       Status = "dead"       // out of attempts; in the dead-letter stream
	StatusCancelled  Status = "cancelled"  // cancelled by its ticket holder while queued (see Store.Cancel); never delivered
)

// Final reports whether no further delivery happens in this status.
func (s Status) Final() bool {
	return s == StatusDone || s == StatusFailed || s == StatusDead || s == StatusCancelled
}

// MaxResultBody caps the downstream response body kept in a ticket record.
const MaxResultBody = 64 << 10

// Result is the downstream's answer to the final delivery attempt.
type Result struct {
	// StatusCode is the HTTP status. For a NATS downstream it is 0 until the consumer
	// replies (package subscriber; see ResultConsumer), then the reply's status.
	StatusCode int         `json:"status_code,omitempty"`
	Header     http.Header `json:"header,omitempty"`
	// Body holds at most MaxResultBody bytes; Truncated tells whether there was more.
	Body      []byte `json:"body,omitempty"`
	Truncated bool   `json:"truncated,omitempty"`
	// Subject and Sequence describe a NATS delivery (Sequence is 0 without a stream).
	Subject  string `json:"subject,omitempty"`
	Sequence uint64 `json:"sequence,omitempty"`
}

// Record is the status of a ticket, kept in TicketsBucket under the ticket for the
// queue's IdempotencyTTL after its last change. The dispatcher writes it when an attempt
// ends (and when a later attempt starts); a ticket in its first attempt or not picked up
// yet has no record, and Status reads the queue and its consumer instead.
type Record struct {
	Ticket string `json:"ticket"`
	Queue  string `json:"queue"`
	Rule   string `json:"rule,omitempty"`
	Status Status `json:"status"`
	// Attempts counts the delivery attempts tried, the last included: 1 for an order
	// delivered (or refused) at its first attempt, n for one queued again after n
	// failed ones, MaxAttempts for one dead-lettered after its last. Pauses (429/503
	// with Retry-After, an open circuit), attempts that reached no downstream
	// (connection refused) and redeliveries after a crash do not count.
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error,omitempty"`
	// ReceivedAt is when ingress received the request; UpdatedAt the last change.
	ReceivedAt time.Time `json:"received_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	// NextAttemptAt is when a waiting retry (after a failure or a pause) is due.
	NextAttemptAt time.Time `json:"next_attempt_at,omitzero"`
	// Result is set in the final states done and failed.
	Result *Result `json:"result,omitempty"`
	// Fingerprint is the order's payload fingerprint (empty in records of an older
	// sluice): a repeat of the order's idempotency key that finds the record but not
	// the key (a cancelled order, or one whose key could not be recorded) still tells
	// its payload apart.
	Fingerprint string `json:"fingerprint,omitempty"`

	// Computed by Status for non-final tickets (not stored).
	Position uint64 `json:"position,omitempty"`
	// NotBefore is a scheduled order's due time (StatusScheduled).
	NotBefore  time.Time     `json:"not_before,omitzero"`
	RetryAfter time.Duration `json:"-"`

	// rev is the bucket revision the record was read or written at (0: not stored),
	// for the compare-and-set writes of Cancel and markDelivering.
	rev uint64
	// keepUntil: the record is written to last its lifetime past this time too (a
	// cancelled scheduled order's due time: its schedule, if it could not be deleted,
	// fires then, and the record is what has the copy dropped). Not stored.
	keepUntil time.Time
}

// ticketKind names ticket records in their signatures (see Store.seal).
const ticketKind = "ticket"

// Record returns the record of a ticket, or ErrNotFound: the copy held in memory
// (keepRecord) when there is one, as it is newer than the stored one, else the stored
// one. A stored record without this store's signature is not found (the error wraps
// ErrNotFound and ErrForged).
func (s *Store) Record(ctx context.Context, ticket string) (*Record, error) {
	if !ValidTicket(ticket) {
		return nil, ErrNotFound
	}
	if rec := s.kept.get(ticket); rec != nil {
		return rec, nil
	}
	e, err := s.readKey(ctx, s.tickets, ticket)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, ErrNotFound
	}
	if err != nil {
		return nil, unavailable("ticket record", err)
	}
	var rec Record
	if err := s.unseal(ticketKind, ticket, e.Value(), &rec); err != nil {
		if errors.Is(err, ErrForged) {
			// Only sluice writes records: another one is not there as far as
			// sluice is concerned (it is overwritten by the next genuine one).
			s.log.Warn("ignoring a forged ticket record", "ticket", ticket)
			return nil, fmt.Errorf("%w: %w", ErrNotFound, err)
		}
		return nil, err
	}
	rec.rev = e.Revision()
	return &rec, nil
}

// saveRecord writes a ticket record (UpdatedAt is set to now). Its lifetime is the
// IdempotencyTTL of the record's queue (the default 24h for an undeclared queue). A
// copy of an older record of the ticket held by keepRecord is dropped once this one is
// written. With opts (jetstream.WithExpectLastSequencePerSubject) it is a
// compare-and-set that fails with errWrongRevision when the record changed since.
func (s *Store) saveRecord(ctx context.Context, rec *Record, opts ...jetstream.PublishOpt) error {
	if !ValidTicket(rec.Ticket) {
		return fmt.Errorf("%w: bad ticket %q", ErrInvalidRequest, rec.Ticket)
	}
	// Shared with the other direct writes; FlushRecords takes it exclusively, so that it
	// never writes a kept copy over a newer record written here.
	lock := s.kept.writeLock(rec.Ticket)
	lock.RLock()
	defer lock.RUnlock()
	if err := s.writeRecord(ctx, rec, opts...); err != nil {
		return err
	}
	s.kept.drop(rec.Ticket, nil)
	return nil
}

func (s *Store) writeRecord(ctx context.Context, rec *Record, opts ...jetstream.PublishOpt) error {
	ttl := queueconfig.DefaultIdempotencyTTL
	if q, err := s.Queue(rec.Queue); err == nil {
		ttl = q.Config().IdempotencyTTL
	}
	if wait := time.Until(rec.keepUntil); wait > 0 {
		ttl += wait
	}
	rec.UpdatedAt = time.Now().UTC()
	val, err := s.seal(ticketKind, rec.Ticket, rec)
	if err != nil {
		return err
	}
	ack, err := jsproto.KVPut(ctx, s.js, TicketsBucket, rec.Ticket, val, ttl, opts...)
	if err != nil {
		if jsproto.IsWrongLastSequence(err) {
			return errWrongRevision
		}
		return unavailable("save ticket record", err)
	}
	rec.rev = ack.Sequence
	return nil
}

// errWrongRevision: a compare-and-set write of a record lost against another write.
var errWrongRevision = errors.New("queue: ticket record changed")

// Status returns the status of a ticket: its record, or for a ticket still waiting for
// its first delivery, StatusQueued with its position, or StatusScheduled with its due
// time (NotBefore; RetryAfter is the time until then). RetryAfter suggests when to ask
// again while the status is not final. Unknown or expired tickets: ErrNotFound. The
// ticket itself is the capability to read the status: 128 random bits, not guessable.
func (s *Store) Status(ctx context.Context, ticket string) (*Record, error) {
	if !ValidTicket(ticket) {
		return nil, ErrNotFound
	}
	now := time.Now()
	rec, err := s.Record(ctx, ticket)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return nil, err
	}
	return s.statusFrom(ctx, ticket, rec, now, true)
}

// statusFrom is Status once the ticket's record was read (rec nil: none). again: the
// record is read once more when no queue holds the order, as a dispatcher may have
// settled it since the first read: it writes the final record before the message
// leaves the queue, so an order gone from the queues has its record by then. With
// replicated resources that second pass reads the record and the queues from the
// streams' leaders (leaderReads).
func (s *Store) statusFrom(ctx context.Context, ticket string, rec *Record, now time.Time, again bool) (*Record, error) {
	if rec != nil {
		if !rec.Status.Final() {
			rec.RetryAfter = time.Second
			if rec.NextAttemptAt.After(now) {
				rec.RetryAfter = rec.NextAttemptAt.Sub(now)
			}
			if rec.Status == StatusQueued {
				if q, err := s.Queue(rec.Queue); err == nil {
					if raw, _, err := s.parked(ctx, q, ticket); err == nil {
						rec.Position = q.position(ctx, raw.Sequence)
					}
				}
			}
		}
		return rec, nil
	}
	for _, q := range s.Queues() {
		raw, m, err := s.waiting(ctx, q, ticket)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		rec := &Record{
			Ticket:      ticket,
			Queue:       q.name,
			Rule:        m.Rule,
			Status:      StatusQueued,
			ReceivedAt:  m.ReceivedAt,
			Fingerprint: m.Fingerprint,
			UpdatedAt:   raw.Time,
			RetryAfter:  time.Second,
		}
		if raw.Subject == scheduleSubjectFor(q.name, ticket) {
			rec.Status, rec.NotBefore = StatusScheduled, m.NotBefore
			rec.RetryAfter = max(m.NotBefore.Sub(now), time.Second)
			return rec, nil
		}
		// The dispatcher writes no record for a first attempt: a message already handed
		// to a dispatcher (at or below the consumer's delivered sequence) is delivering.
		if ci, err := q.servingConsumer(ctx, raw.Subject); err == nil && raw.Sequence <= ci.CachedInfo().Delivered.Stream {
			rec.Status = StatusDelivering
			return rec, nil
		}
		rec.Position = q.position(ctx, raw.Sequence)
		rec.RetryAfter = max(q.eta(now, rec.Position).Sub(now), time.Second)
		return rec, nil
	}
	if !again {
		return nil, ErrNotFound
	}
	replicated := s.opts.replicas > 1
	if replicated {
		// The misses may come from followers behind the leader: the second pass
		// reads from the leaders, so a ticket parked a moment ago is never unknown.
		ctx = leaderReads(ctx)
	}
	rec, err := s.Record(ctx, ticket)
	if errors.Is(err, ErrNotFound) && replicated {
		return s.statusFrom(ctx, ticket, nil, now, false)
	}
	if err != nil {
		return nil, err // ErrNotFound: unknown or expired
	}
	return s.statusFrom(ctx, ticket, rec, now, false)
}

// maxForgedCopies bounds how many messages on a ticket's subject parked finds wrong
// before it gives up: forgeries published there cost a lookup each.
const maxForgedCopies = 16

// parked returns the order sluice parked in q under ticket, skipping messages on its
// subject that do not verify (forgeries published on it): the last one first, then
// from the oldest. jetstream.ErrMsgNotFound when there is none.
func (s *Store) parked(ctx context.Context, q *Queue, ticket string) (*jetstream.RawStreamMsg, *Message, error) {
	raw, m, err := s.parkedOn(ctx, q, q.subject(ticket))
	if errors.Is(err, jetstream.ErrMsgNotFound) && q.mayHaveLanes.Load() {
		// In a lane (ReadySubject): a queue that has or had priorities or fair_by. Only
		// then: a direct get by this wildcard subject walks every ticket of an unlaned
		// queue (milliseconds at 100,000 orders, for any unknown ticket asked about).
		return s.parkedOn(ctx, q, ReadySubject(q.name, "*", ticket))
	}
	return raw, m, err
}

// scheduled returns the schedule message of an order of q that waits for its due time,
// as parked does for a ready one; jetstream.ErrMsgNotFound when there is none (also in
// a queue without schedules).
func (s *Store) scheduled(ctx context.Context, q *Queue, ticket string) (*jetstream.RawStreamMsg, *Message, error) {
	if !q.schedules.Load() {
		return nil, nil, jetstream.ErrMsgNotFound
	}
	return s.parkedOn(ctx, q, scheduleSubjectFor(q.name, ticket))
}

// waiting returns the order of q under ticket that is not delivered yet: the ready
// message, else the schedule message (raw.Subject tells which). The schedule may fire
// between the two reads: without a schedule message the ready subject is read again.
func (s *Store) waiting(ctx context.Context, q *Queue, ticket string) (*jetstream.RawStreamMsg, *Message, error) {
	raw, m, err := s.parked(ctx, q, ticket)
	if !errors.Is(err, jetstream.ErrMsgNotFound) || !q.schedules.Load() {
		return raw, m, err
	}
	raw, m, err = s.scheduled(ctx, q, ticket)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return s.parked(ctx, q, ticket)
	}
	return raw, m, err
}

// parkedOn is parked for one subject (literal, or with a wildcard lane).
func (s *Store) parkedOn(ctx context.Context, q *Queue, subject string) (*jetstream.RawStreamMsg, *Message, error) {
	var (
		raw *jetstream.RawStreamMsg
		err error
	)
	if strings.Contains(subject, "*") {
		// A direct get of the last message cannot name a wildcard (the subject is part
		// of the request's): the first one then, as a lane holds one order per ticket.
		raw, err = s.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: 1, Next: subject})
	} else {
		raw, err = s.readMsg(ctx, q.stream, jsproto.MsgQuery{Last: subject})
	}
	for seq, tries := uint64(1), 0; ; tries++ {
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil, nil, err
		}
		if err != nil {
			return nil, nil, unavailable("message lookup", err)
		}
		if m, derr := decodeRaw(raw); derr == nil && s.Verify(m) == nil {
			return raw, m, nil
		}
		if tries == maxForgedCopies {
			return nil, nil, fmt.Errorf("%w: more than %d forged messages on %s", jetstream.ErrMsgNotFound, maxForgedCopies, subject)
		}
		if tries > 0 {
			seq = raw.Sequence + 1
		}
		raw, err = s.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: seq, Next: subject})
	}
}

// Event is published (JSON) on DoneSubject when an order reached done or failed, and on
// DeadSubject when it was dead-lettered.
type Event struct {
	Ticket string `json:"ticket"`
	Queue  string `json:"queue"`
	Rule   string `json:"rule,omitempty"`
	Status Status `json:"status"`
	// DownstreamStatus is the HTTP status of the final attempt (0: none or NATS).
	DownstreamStatus int `json:"downstream_status,omitempty"`
	// Attempts is the order's Record.Attempts: the delivery attempts tried, the last
	// included (1: delivered at the first).
	Attempts int       `json:"attempts"`
	Error    string    `json:"error,omitempty"`
	At       time.Time `json:"at"`
}

// publishEvent publishes ev on subject (core NATS, at most once; a stream capturing
// sluice.done.> or sluice.dead.> makes the events durable).
func (s *Store) publishEvent(subject string, ev Event) error {
	b, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	return s.nc.Publish(subject, b)
}
