package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// JetStream layout. Every name is fixed so that separately started ingress and
// dispatcher processes find the same resources.
const (
	// StreamPrefix + queue name is a queue's stream (work-queue retention) with the
	// subjects sluice.q.{queue}.{ticket}.
	StreamPrefix = "SLUICE_Q_"
	// DeadStream holds every queue's dead letters on sluice.dlq.{queue}.{ticket}
	// (limits retention, so they can be listed, re-queued and purged).
	DeadStream = "SLUICE_DEAD"
	// ConsumerName is the durable pull consumer every dispatcher replica of a queue shares.
	ConsumerName = "dispatch"
	// PriorityGroup is the consumer's pinned priority group.
	PriorityGroup = "sluice"
	// TicketsBucket is the key-value bucket of ticket records (status and results).
	TicketsBucket = "sluice_tickets"
	// IdempotencyBucket is the key-value bucket of idempotency keys.
	IdempotencyBucket = "sluice_idempotency"
)

// SlotStreamPrefix + queue name is a queue's key stream: one slot per idempotency key
// accepted within IdempotencyTTL, on sluice.keys.{queue}.slot.{client scope}, at most
// MaxIdempotencyKeys per subject (discard-new per subject), each slot with a TTL; in
// memory (see Store.keyStream).
const SlotStreamPrefix = "SLUICE_SLOTS_"

// KeyStreamPrefix + queue name is the key stream of a queue as sluice declared it
// before SlotStreamPrefix: on file, on sluice.keys.{queue}.{client scope}. This sluice
// neither reads nor writes it; Retire deletes it (see Store.keyStream).
const KeyStreamPrefix = "SLUICE_KEYS_"

// KeyStreamName returns the name of a queue's key stream (SlotStreamPrefix).
func KeyStreamName(queue string) string { return SlotStreamPrefix + queue }

// fileKeyStreamName returns the name of a queue's key stream of an earlier sluice.
func fileKeyStreamName(queue string) string { return KeyStreamPrefix + queue }

// keySubjectFor is the subject of a client scope's slots. One token more than the
// file key stream's subjects, so that both streams can exist at once (a rolling
// upgrade), and still within sluice.keys.>, which the NATS permissions sluice ships
// grant.
func keySubjectFor(queue, scope string) string { return "sluice.keys." + queue + ".slot." + scope }

// DefaultIdempotencyMaxBytes is the default byte cap of the idempotency bucket (and,
// counted in slots, of each queue's key stream: see keySlots).
const DefaultIdempotencyMaxBytes = 256 << 20

// keySlotBytes is about what one key slot takes of a server's memory: 620 bytes
// measured on nats-server 2.15.2 (its subject and headers, 260 bytes as the stream
// counts them, its Nats-Msg-Id in the duplicate window, its TTL, the subject index).
const keySlotBytes = 640

// keySlots is the most slots a queue's key stream holds for a byte cap of the key
// stores (-1: no cap).
func keySlots(maxBytes int64) int64 {
	if maxBytes <= 0 {
		return -1
	}
	return max(maxBytes/keySlotBytes, 1)
}

// StreamName returns the stream name of a queue.
func StreamName(queue string) string { return StreamPrefix + queue }

// DoneSubject is where a completion event (Event) is published for each order that
// reached a final status after delivery (done, or failed on a 4xx).
func DoneSubject(queue string) string { return "sluice.done." + queue }

// DeadSubject is where an Event is published for each dead-lettered order.
func DeadSubject(queue string) string { return "sluice.dead." + queue }

func deadSubjectFor(queue, ticket string) string { return "sluice.dlq." + queue + "." + ticket }

// idemStoreShare: each key store's byte cap is at most 1/idemStoreShare of a store of
// known size (see Open).
const idemStoreShare = 16

// Store parks requests in JetStream queues and keeps their tickets. It is safe for
// concurrent use. One Store per process and NATS connection is the intended use; the
// connection belongs to the caller. Its methods fall in three groups:
//
//   - park, for the front door: Park, Repeat and BodyLimit take an order; Status,
//     Record, WatchRecords and Cancel follow its ticket.
//   - dispatch, for the dispatchers: Queue and Queues give each declared queue, whose
//     Queue.Consumer hands orders out as Leases (a Lease is the only way to settle an
//     order); Verify, DeliveryKey and Forward check and pass an order on;
//     ResultConsumer and CallbackConsumer drain the replies and callbacks;
//     FlushRecords and KeptRecords write what a Lease could not; SampleOutflow measures.
//   - operate, for sluice's own setup and tools: Declare, AdoptOrphans, Retire and
//     CheckQueue keep the queues; DeadLetters, Requeue and PurgeDeadLetters handle the
//     dead letters; StorageUsage and FlowKeyFor report.
//
// For the fast failure the ingress needs (503 instead of a hanging request), connect
// with nats.ReconnectBufSize(-1): a publish while disconnected then fails at once
// instead of being buffered (and perhaps stored after the client was told 503).
type Store struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	log     *slog.Logger
	opts    options
	tickets jetstream.KeyValue
	idem    jetstream.KeyValue
	dead    jetstream.Stream
	metrics *storeMetrics
	tracer  trace.Tracer // nil: no spans
	kept    *keptRecords
	usage   storeUsage

	// idemInfo serves the idempotency bucket's cached stream info (Park's byte check).
	idemInfo *Queue

	// batches: the server takes atomic batches and the async persist mode (2.12 and
	// later), so the streams ask for them; an older one would drop the settings, and
	// every declaration would then find its streams changed and update them again.
	batches bool
	// slotsOnFile: a memory key stream was refused its slots (see slotsToFile), so the
	// store makes key streams on file.
	slotsOnFile atomic.Bool

	mu     sync.RWMutex
	queues map[string]*Queue
}

// Open prepares the shared resources (dead-letter stream and key-value buckets),
// creating or updating them, and returns a Store without queues; add them with Declare.
// A signing key (WithSigningKey) is required. A server older than MinServerVersion
// fails it with a *ServerVersionError (ErrServerVersion and ErrUnavailable).
func Open(ctx context.Context, nc *nats.Conn, opts ...Option) (*Store, error) {
	o := options{replicas: 1, publishTimeout: 5 * time.Second, idemMaxBytes: DefaultIdempotencyMaxBytes, keptBytes: DefaultKeptRecordsBytes}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if err := checkKey(o.signingKey); err != nil {
		return nil, err
	}
	if err := checkServerVersion(nc, MinServerVersion, "sluice's queues (per-message TTLs, pinned priority groups, consumer pause)"); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	s := &Store{nc: nc, js: js, log: o.logger, opts: o, queues: map[string]*Queue{}, kept: newKeptRecords(o.keptBytes),
		tracer: telemetry.Tracer(o.tracerProvider), batches: checkServerVersion(nc, minBatchServerVersion, "") == nil}
	if s.dead, err = s.ensureDeadStream(ctx); err != nil {
		return nil, err
	}
	s.usage.init(ctx, js, o.storeLimit, o.diskFree, o.logger)
	if err := s.ensureBuckets(ctx); err != nil {
		return nil, err
	}
	s.metrics = newStoreMetrics(s)
	if o.registerer != nil {
		if err := s.metrics.register(o.registerer); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// ensureDeadStream creates the dead-letter stream of every queue, or updates it.
func (s *Store) ensureDeadStream(ctx context.Context) (jetstream.Stream, error) {
	st, err := s.ensureStream(ctx, jetstream.StreamConfig{
		Name:        DeadStream,
		Description: "sluice dead letters of every queue",
		Subjects:    []string{"sluice.dlq.>"},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardOld,
		Replicas:    s.opts.replicas,
		Duplicates:  2 * time.Minute,
		AllowDirect: true,
		// Each dead letter carries its queue's dead_letter_max_age as a TTL. A stream
		// made by an older sluice is updated to allow it; its dead letters, written
		// without a TTL, stay until re-queued or purged.
		AllowMsgTTL: true,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: dead-letter stream: %w", ErrUnavailable, err)
	}
	return st, nil
}

// ensureBuckets sets up the tickets and idempotency buckets. A stream's byte cap is
// reserved from the store when the stream is made: the key stores (the idempotency
// bucket and every queue's key stream) take a share of a store of known size (the
// usage's limit), never more than it holds.
func (s *Store) ensureBuckets(ctx context.Context) error {
	if lim := s.usage.limit / idemStoreShare; lim > 0 && (s.opts.idemMaxBytes <= 0 || s.opts.idemMaxBytes > lim) {
		s.opts.idemMaxBytes = lim
	}
	var err error
	if s.tickets, err = s.ensureBucket(ctx, TicketsBucket, "sluice ticket status and results", 0); err != nil {
		return err
	}
	if s.idem, err = s.ensureBucket(ctx, IdempotencyBucket, "sluice idempotency keys", max(s.opts.idemMaxBytes, -1)); err != nil {
		return err
	}
	idemStream, err := s.js.Stream(ctx, jsproto.KVStream(IdempotencyBucket))
	if err != nil {
		return fmt.Errorf("%w: key-value bucket %s: %w", ErrUnavailable, IdempotencyBucket, err)
	}
	s.idemInfo = &Queue{store: s, name: IdempotencyBucket, stream: idemStream}
	return nil
}

// ensureBucket returns the key-value bucket name, created or updated to hold entries
// with per-key TTLs in maxBytes (0: no cap). A bucket as wanted is used as it is: an
// update rewrites its configuration on disk, which fails on a full disk, and a sluice
// that cannot start cannot drain the queues that would free it.
func (s *Store) ensureBucket(ctx context.Context, name, desc string, maxBytes int64) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:      name,
		Description: desc,
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(s.opts.replicas, 1),
		MaxBytes:    maxBytes,
		// Enables per-key TTLs (every entry is written with one).
		LimitMarkerTTL: time.Minute,
	}
	st, err := s.js.Stream(ctx, jsproto.KVStream(name))
	exists := err == nil
	if exists && sameBucket(st.CachedInfo().Config, cfg, true) {
		if kv, err := s.js.KeyValue(ctx, name); err == nil {
			return kv, nil
		}
	}
	var kv jetstream.KeyValue
	if !exists { // as ensureFrom does for a stream
		kv, err = s.js.CreateKeyValue(ctx, cfg)
	}
	if exists || errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = s.js.CreateOrUpdateKeyValue(ctx, cfg)
	}
	if err != nil && exists && sameBucket(st.CachedInfo().Config, cfg, false) {
		// Only its byte cap differs (the cap follows the store's size) and it cannot
		// be changed: no room to reserve a larger one, or no room on the disk for
		// the new configuration. The bucket as it is serves.
		if kv, gerr := s.js.KeyValue(ctx, name); gerr == nil {
			s.log.Warn("key-value bucket kept at its byte cap: it cannot be changed now", "bucket", name,
				"asked", maxBytes, "err", err)
			return kv, nil
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: key-value bucket %s: %w", ErrUnavailable, name, err)
	}
	return kv, nil
}

// Queue returns a declared (or adopted orphaned) queue.
func (s *Store) Queue(name string) (*Queue, error) {
	s.mu.RLock()
	q := s.queues[name]
	s.mu.RUnlock()
	if q == nil {
		return nil, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	return q, nil
}

// Queues returns the declared queues and the adopted orphaned ones.
func (s *Store) Queues() []*Queue {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]*Queue, 0, len(s.queues))
	for _, q := range s.queues {
		out = append(out, q)
	}
	return out
}

func (s *Store) connected() bool { return s.nc.Status() == nats.CONNECTED }

func unavailable(what string, err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}
