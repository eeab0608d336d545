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

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

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

// keyedTicket is the ticket of an order with the idempotency key key (see idemKey) in
// queue: derived from both with the signing key, so that every request with the key
// names the same ticket before anything is written (see parkKeyed), and nobody without
// the signing key can tell it.
func (s *Store) keyedTicket(queue, key string) string {
	sum := s.mac("keyed-ticket", []byte(queue), []byte(key))
	return strings.ToLower(ticketEncoding.EncodeToString(sum[:16]))
}

// parkKeyed is Park for a request with an idempotency key (steps 1 to 3). Its slot is
// in memory: no acceptance record, losing it in a restart of the servers only resets
// its client's count (see Store.keyStream).
func (s *Store) parkKeyed(ctx context.Context, q *Queue, m *Message) (Receipt, error) {
	key := idemKey(m.Client, m.IdempotencyKey)
	m.Ticket = s.keyedTicket(q.name, key)
	// The slot at once with the lookup: one round trip for both. Before the order: an
	// order that anybody can see (a repeat, a dispatcher) has its slot, so nothing seen
	// is ever withdrawn.
	taken := make(chan slotTaken, 1)
	go func() {
		var t slotTaken
		if t.err = s.keyRoom(ctx); t.err == nil {
			t.seq, t.err = s.takeSlot(ctx, q, m.Client, key)
		}
		taken <- t
	}()
	rc, found, err := s.repeat(ctx, q, key, m)
	slot := <-taken
	if found || err != nil {
		// A repeat, or nothing known: the slot was not needed. Within the duplicate
		// window it stored nothing (slot.seq 0: the key's own slot is the earlier
		// request's); past it, it is a second one of the key, deleted so that it does not
		// count against the cap (a refusal at the cap does not concern a repeat).
		s.freeSlot(ctx, q, slot.seq)
		return rc, err
	}
	if slot.err != nil {
		return Receipt{}, slot.err
	}
	ack, err := s.publish(ctx, q, m, keyMsgID(key))
	if err != nil {
		if !errors.Is(err, ErrNotAcknowledged) { // else the order may be stored, and keeps its slot
			s.freeSlot(ctx, q, slot.seq)
		}
		return Receipt{}, err
	}
	if ack.Duplicate {
		// The slot stays: it is the key's, not this request's. Slots of one key are
		// deduplicated like its orders (the same Nats-Msg-Id and window), so a slot taken
		// here (slot.seq != 0) is the key's only one even when a racing request with the
		// key stored the order first; freeing it would let the client past its cap.
		return s.duplicate(ctx, q, key, m, ack.Sequence)
	}
	return q.receiptOf(ctx, m, ack.Sequence, false), nil
}

// slotTaken is the outcome of taking a key slot: its sequence (0 when none was
// stored) or why it was refused.
type slotTaken struct {
	seq uint64
	err error
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
	if errors.Is(err, jetstream.ErrNoStreamResponse) && q.keys != nil {
		// A single server loses a memory stream when it restarts (see keyStream):
		// declared again, with no slots, it takes this one.
		if _, derr := s.ensureKeyStream(ctx, s.keyStream(cfg)); derr == nil {
			ack, err = w.publish(ctx, msg)
		}
	}
	if jsproto.IsNoResources(err) && q.keys != nil && q.keys.CachedInfo().Config.Storage == jetstream.MemoryStorage {
		if derr := s.slotsToFile(ctx, q); derr == nil {
			ack, err = w.publish(ctx, msg)
		}
	}
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

// slotsToFile makes q's key stream anew on file when the one in memory has refused a
// slot for want of resources: a cluster places a memory stream on servers that then
// have no memory store to write it to (nodes with max_memory_store 0 store one slot
// and refuse the next), which would refuse every keyed order for good. From then on
// every key stream the store makes is on file (see keyStream). The slots go with the
// memory stream: they only count keys, so their clients' caps start afresh. Replicas
// of sluice that meet the refusal at once may each make the stream anew, which costs
// the slots taken in between, nothing else. The deletion is asked again after
// jsproto.LeaderWait without an answer (a stream whose replicas could not store has
// been seen to leave it unanswered), as long as ctx lasts.
func (s *Store) slotsToFile(ctx context.Context, q *Queue) error {
	s.slotsOnFile.Store(true)
	q.slotsMu.Lock()
	defer q.slotsMu.Unlock()
	want := s.keyStream(q.Config())
	info, err := q.keys.Info(ctx) // and the handle's cached info, which takeSlot reads
	switch {
	case err == nil && info.Config.Storage == want.Storage:
		return nil // made anew meanwhile
	case err == nil:
		for {
			actx, cancel := context.WithTimeout(ctx, jsproto.LeaderWait)
			err = s.js.DeleteStream(actx, want.Name)
			cancel()
			if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
				break
			}
			if !jsproto.NoAnswer(err) || ctx.Err() != nil {
				return keyStoreError(err)
			}
		}
	case !errors.Is(err, jetstream.ErrStreamNotFound):
		return keyStoreError(err)
	}
	if _, err := s.ensureSlots(ctx, nil, want); err != nil {
		return keyStoreError(err)
	}
	_, _ = q.keys.Info(ctx) // the handle says file now: a slot refused on file for want of disk moves nothing
	s.log.Warn("the idempotency key slots are on file now: the servers made them in memory and then refused to store them there (give JetStream a memory store)",
		"stream", want.Name)
	return nil
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
