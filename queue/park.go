package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Receipt is what a client is told about a parked request.
type Receipt struct {
	Ticket string
	Queue  string
	// Position estimates the number of queued messages up to and including this one
	// (0 once delivery has started).
	Position uint64
	// EstimatedDelivery estimates when delivery starts, from the position and the
	// queue's outflow rate.
	EstimatedDelivery time.Time
	// Duplicate is true when the request repeated an earlier one (same client,
	// idempotency key and payload); Ticket is then the earlier ticket.
	Duplicate bool
}

// idemRecord is the value of an idempotency key in IdempotencyBucket.
type idemRecord struct {
	Ticket      string    `json:"ticket"`
	Fingerprint string    `json:"fingerprint"`
	Queue       string    `json:"queue"`
	CreatedAt   time.Time `json:"created_at"`
}

// idemKey is the bucket key of a client's idempotency key:
// {sha256(client)[:16 bytes]}.{sha256(key)}, both hex. Neither the client identity nor
// the key itself appear in NATS.
func idemKey(client, key string) string {
	c := sha256.Sum256([]byte(client))
	k := sha256.Sum256([]byte(key))
	return hex.EncodeToString(c[:16]) + "." + hex.EncodeToString(k[:])
}

// Park stores req in its queue and returns once JetStream has acknowledged it (the
// message is on disk — on every replica of an R3 stream — before Park returns a
// receipt). Errors: ErrUnknownQueue, ErrInvalidRequest, ErrFull (a *FullError with a
// retry delay), ErrUnavailable, ErrIdempotencyConflict, ErrTooLarge.
//
// Idempotency (req.IdempotencyKey set). The key is scoped by req.Client and kept for the
// queue's IdempotencyTTL. The order of writes makes every crash safe:
//
//  1. create-if-absent of the key in IdempotencyBucket with a fresh ticket and the
//     payload fingerprint. If the key exists: a different fingerprint is
//     ErrIdempotencyConflict; the same fingerprint reuses the stored ticket.
//  2. for a reused ticket, is the message known? The ticket record exists with a status
//     past queued (the dispatcher writes it before it acknowledges the message), or the
//     message is still in the queue's stream. Then the earlier ticket is returned and
//     nothing is published.
//  3. otherwise publish with Nats-Msg-Id = ticket and wait for the PubAck.
//
// A crash between 1 and 3 leaves a key whose message does not exist. The client got no
// receipt; its retry finds the key, sees no message at step 2 and publishes it with the
// stored ticket. Two concurrent requests with one key both publish with the same
// Nats-Msg-Id; the stream's duplicate window keeps one message and both get the same
// ticket. A message that expired by max_age is published again on a retry.
func (s *Store) Park(ctx context.Context, req *Request) (Receipt, error) {
	if err := req.validate(); err != nil {
		return Receipt{}, err
	}
	q, err := s.Queue(req.Queue)
	if err != nil {
		return Receipt{}, err
	}
	cfg := q.Config()
	m := &Message{Request: *req}
	m.Header = KeptHeader(req.Header, cfg.SensitiveHeaders)
	if m.ReceivedAt.IsZero() {
		m.ReceivedAt = time.Now()
	}
	m.Fingerprint = Fingerprint(&m.Request)

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

	duplicate := false
	if req.IdempotencyKey == "" {
		m.Ticket = NewTicket()
	} else {
		ticket, existing, err := s.claimKey(ctx, q, m)
		if err != nil {
			return Receipt{}, err
		}
		m.Ticket = ticket
		if existing {
			rc, ok, err := s.knownReceipt(ctx, q, ticket)
			if err != nil {
				return Receipt{}, err
			}
			if ok {
				return rc, nil
			}
			duplicate = true // known key, message missing: publish it (see above)
		}
	}

	msg := m.encode(q.subject(m.Ticket))
	ack, err := s.js.PublishMsg(ctx, msg, jetstream.WithExpectStream(q.StreamName()))
	if err != nil {
		return Receipt{}, s.publishError(ctx, q, err)
	}
	s.usage.add(len(msg.Subject) + len(msg.Data) + 64*len(msg.Header))
	if !ack.Duplicate {
		s.metrics.parked.WithLabelValues(q.name).Inc()
	}
	now := time.Now()
	pos := q.position(ctx, ack.Sequence)
	return Receipt{
		Ticket:            m.Ticket,
		Queue:             q.name,
		Position:          pos,
		EstimatedDelivery: q.eta(now, pos),
		Duplicate:         duplicate || ack.Duplicate,
	}, nil
}

// claimKey implements step 1 of Park's idempotency: it returns the ticket for the key
// and whether the key existed before.
func (s *Store) claimKey(ctx context.Context, q *Queue, m *Message) (string, bool, error) {
	key := idemKey(m.Client, m.IdempotencyKey)
	cfg := q.Config()
	for range 3 {
		rec := idemRecord{Ticket: NewTicket(), Fingerprint: m.Fingerprint, Queue: q.name, CreatedAt: time.Now().UTC()}
		val, _ := json.Marshal(rec)
		_, err := s.idem.Create(ctx, key, val, jetstream.KeyTTL(cfg.IdempotencyTTL))
		if err == nil {
			return rec.Ticket, false, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return "", false, unavailable("idempotency key", err)
		}
		entry, err := s.idem.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // expired or removed between the two calls
		}
		if err != nil {
			return "", false, unavailable("idempotency key", err)
		}
		var prev idemRecord
		if err := json.Unmarshal(entry.Value(), &prev); err != nil || !ValidTicket(prev.Ticket) {
			return "", false, fmt.Errorf("%w: corrupt idempotency record", ErrUnavailable)
		}
		if prev.Fingerprint != m.Fingerprint {
			return "", false, ErrIdempotencyConflict
		}
		return prev.Ticket, true, nil
	}
	return "", false, fmt.Errorf("%w: idempotency key keeps changing", ErrUnavailable)
}

// knownReceipt implements step 2 of Park's idempotency.
func (s *Store) knownReceipt(ctx context.Context, q *Queue, ticket string) (Receipt, bool, error) {
	now := time.Now()
	rec, err := s.Record(ctx, ticket)
	switch {
	case err == nil && rec.Status != StatusQueued:
		return Receipt{Ticket: ticket, Queue: rec.Queue, EstimatedDelivery: now, Duplicate: true}, true, nil
	case err != nil && !errors.Is(err, ErrNotFound):
		return Receipt{}, false, err
	}
	raw, err := q.stream.GetLastMsgForSubject(ctx, q.subject(ticket))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return Receipt{}, false, nil
	}
	if err != nil {
		return Receipt{}, false, unavailable("message lookup", err)
	}
	pos := q.position(ctx, raw.Sequence)
	return Receipt{Ticket: ticket, Queue: q.name, Position: pos, EstimatedDelivery: q.eta(now, pos), Duplicate: true}, true, nil
}

// JetStream API error codes Park tells apart.
const (
	errCodeStoreFailed   = 10077 // "maximum messages exceeded", "maximum bytes exceeded", …
	errCodeMsgTooLarge   = 10054
	errCodeStreamMissing = 10059
	errCodeNoResources   = 10023 // "insufficient resources": the server's store is full
)

func (s *Store) publishError(ctx context.Context, q *Queue, err error) error {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch {
		case isFull(apiErr):
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			return fmt.Errorf("%w (%s)", q.fullError(fctx), apiErr.Description)
		case apiErr.ErrorCode == errCodeNoResources:
			return fmt.Errorf("%w: %w: publish to %q: %s", ErrUnavailable, ErrStorageFull, q.name, apiErr.Description)
		case apiErr.ErrorCode == errCodeMsgTooLarge || strings.Contains(apiErr.Description, "message size exceeds"):
			return fmt.Errorf("%w: %s", ErrTooLarge, apiErr.Description)
		}
		return fmt.Errorf("%w: publish to %q: %v", ErrUnavailable, q.name, err)
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("%w: %v", ErrTooLarge, err)
	}
	return fmt.Errorf("%w: publish to %q not acknowledged: %v", ErrUnavailable, q.name, err)
}

// isFull tells a discard-new refusal ("maximum messages exceeded", "maximum bytes
// exceeded") from other store failures.
func isFull(apiErr *jetstream.APIError) bool {
	d := apiErr.Description
	return apiErr.ErrorCode == errCodeStoreFailed && strings.Contains(d, "maximum") &&
		strings.Contains(d, "exceeded") && !strings.Contains(d, "size")
}
