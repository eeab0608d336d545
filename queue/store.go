package queue

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
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

// KeyStreamPrefix + queue name is a queue's key stream: one slot per idempotency key
// accepted within IdempotencyTTL, on sluice.keys.{queue}.{client scope}, at most
// MaxIdempotencyKeys per subject (discard-new per subject), each slot with a TTL.
const KeyStreamPrefix = "SLUICE_KEYS_"

// KeyStreamName returns the key stream name of a queue.
func KeyStreamName(queue string) string { return KeyStreamPrefix + queue }

func keySubjectFor(queue, scope string) string { return "sluice.keys." + queue + "." + scope }

// DefaultIdempotencyMaxBytes is the default byte cap of the idempotency bucket (and,
// counted in slots, of each queue's key stream: see keySlots).
const DefaultIdempotencyMaxBytes = 256 << 20

// keySlotBytes is about what one key slot takes in a key stream (subject, headers,
// per-message overhead).
const keySlotBytes = 256

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

// Option configures a Store.
type Option func(*options)

type options struct {
	replicas       int
	logger         *slog.Logger
	registerer     prometheus.Registerer
	publishTimeout time.Duration
	idemMaxBytes   int64
	signingKey     []byte
	keptBytes      int64
	storeLimit     int64
	diskFree       func() (uint64, error)
	tracerProvider trace.TracerProvider
}

// WithReplicas sets the replica count of the shared resources: the dead-letter stream
// and the key-value buckets (default 1; 3 on a JetStream cluster).
func WithReplicas(n int) Option { return func(o *options) { o.replicas = n } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer registers the queue metrics (sluice_queue_parked_total,
// sluice_queue_depth) on r. Without it no metrics are registered anywhere.
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }

// WithPublishTimeout bounds how long Park waits for JetStream to acknowledge
// (default 5s). Past it Park fails with ErrUnavailable.
func WithPublishTimeout(d time.Duration) Option { return func(o *options) { o.publishTimeout = d } }

// WithIdempotencyMaxBytes caps the bytes of the idempotency bucket, and of each queue's
// key stream (default DefaultIdempotencyMaxBytes; 0 or negative: no cap). New keys are
// refused (ErrKeyStoreFull) once the bucket holds 90% of it: the rest is kept for the
// dispatchers' refreshes of existing keys. Every process opening the store should
// pass the same value: the last one to open sets it.
func WithIdempotencyMaxBytes(n int64) Option { return func(o *options) { o.idemMaxBytes = n } }

// WithKeptRecordsBytes bounds the ticket records held in memory when JetStream refuses
// them (see Lease; default DefaultKeptRecordsBytes).
func WithKeptRecordsBytes(n int64) Option { return func(o *options) { o.keptBytes = n } }

// WithStoreLimit tells the Store how many bytes of JetStream file storage its account
// may use: the embedded server's max store, or a cluster's per-account limit when the
// account has none of its own (an account limit is read from the server at Open and the
// smaller one is used). Park refuses new orders with ErrStorageFull once the account
// uses HighWater of it, so that the rest stays free for what draining the queues
// writes (ticket records, dead letters). 0: only an account limit counts; without one
// Park fails only when JetStream itself refuses.
func WithStoreLimit(n int64) Option { return func(o *options) { o.storeLimit = n } }

// WithDiskFree tells the Store how to read the bytes free on the disk that holds its
// JetStream store (embedded.Server.DiskFree for the embedded server). Park refuses new
// orders with ErrStorageFull while fewer than DiskReserve(limit) are free, whatever the
// store limit: a server whose disk fills up (other files grow) answers no write
// (nats-server 2.15 leaves JetStream unanswering until it restarts, even once space is
// freed), and the dispatchers' records and removals need the room the reserve keeps.
func WithDiskFree(free func() (uint64, error)) Option { return func(o *options) { o.diskFree = free } }

// DiskReserve is the free disk Park leaves (see WithDiskFree) for a store limit of
// limit bytes (0: unknown): what the high-water mark keeps of the limit, and at least
// 16 MiB.
func DiskReserve(limit int64) uint64 {
	return max(uint64(float64(max(limit, 0))*(1-HighWater)), 16<<20)
}

// WithTracerProvider sets where Park's spans go (default otel.GetTracerProvider(),
// which records nothing until the program sets a provider; noop.NewTracerProvider()
// turns them off). Park's span "sluice.park", a child of the span in Park's context,
// has the attributes sluice.queue and sluice.ticket, and its context is kept with the
// parked order (Message.TraceParent) for the delivery span to link to.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// HighWater is the share of the store limit (WithStoreLimit) past which Park refuses
// new orders.
const HighWater = 0.85

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
	kv, err := s.js.CreateOrUpdateKeyValue(ctx, cfg)
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

// Declare creates the queue's stream, or updates it to cfg, and adds the queue to the
// store (replacing an earlier declaration of the same name: rules reloads call Declare
// again). The configuration is kept with the stream (its metadata), so that a queue
// that later leaves the rules still drains as declared: see AdoptOrphans.
func (s *Store) Declare(ctx context.Context, cfg queueconfig.Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if cfg.Scheduled() {
		if err := checkServerVersion(s.nc, MinScheduleServerVersion, "scheduled delivery (delay, max_delay)"); err != nil {
			return nil, fmt.Errorf("%w: queue %q: %w", ErrInvalidConfig, cfg.Name, err)
		}
	}
	if err := s.checkDownstreamStream(ctx, cfg); err != nil {
		return nil, err
	}
	cfg.DropHeaders = append([]string(nil), cfg.DropHeaders...)
	cfg.ResultHeaders = append([]string(nil), cfg.ResultHeaders...)
	maxMsgs := cfg.MaxDepth
	if maxMsgs < 0 {
		maxMsgs = -1
	}
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	qs := jetstream.StreamConfig{
		Name:        StreamName(cfg.Name),
		Description: "sluice queue " + cfg.Name,
		// Unlaned orders on sluice.q.{queue}.{ticket}, laned ones one token deeper
		// (ReadySubject); a stream of an older sluice is widened by this update.
		Subjects:  []string{"sluice.q." + cfg.Name + ".*", "sluice.q." + cfg.Name + ".*.*"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Discard:   jetstream.DiscardNew,
		MaxMsgs:   maxMsgs,
		MaxBytes:  maxBytes,
		// No MaxAge on the stream: JetStream would delete an expired order silently.
		// The dispatcher dead-letters orders older than cfg.MaxAge when it reaches
		// them, so every accepted order ends delivered, failed or dead, and visible.
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
		AllowDirect: true,
		// Park writes concurrent orders as one atomic batch (see groupCommit).
		AllowAtomicPublish: s.batches,
		Metadata:           configMetadata(cfg),
	}
	// JetStream cannot turn message schedules off again: a stream that once had them
	// keeps them, whatever the queue's configuration says now.
	if cfg.Scheduled() || s.allowsSchedules(ctx, qs.Name) {
		scheduledStream(&qs, cfg.Name)
	}
	stream, err := s.ensureStream(ctx, qs)
	if err != nil {
		return nil, fmt.Errorf("%w: stream of queue %q: %w", ErrUnavailable, cfg.Name, err)
	}
	keys, err := s.ensureKeyStream(ctx, jetstream.StreamConfig{
		Name:                 KeyStreamName(cfg.Name),
		Description:          "sluice idempotency key slots of queue " + cfg.Name,
		Subjects:             []string{keySubjectFor(cfg.Name, "*")},
		Retention:            jetstream.LimitsPolicy,
		Storage:              jetstream.FileStorage,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    int64(cfg.MaxIdempotencyKeys),
		// A count, not a byte cap: JetStream reserves a byte cap from the store for
		// every stream that has one, and there is a key stream per queue.
		MaxMsgs:            keySlots(s.opts.idemMaxBytes),
		AllowMsgTTL:        true,
		Duplicates:         cfg.DuplicateWindow,
		Replicas:           cfg.Replicas,
		AllowDirect:        true,
		AllowAtomicPublish: s.batches, // on a replicated stream; see ensureKeyStream
	})
	if err != nil {
		return nil, fmt.Errorf("%w: key stream of queue %q: %w", ErrUnavailable, cfg.Name, err)
	}
	// Callback jobs are written when an order ends, by whichever process settles it:
	// their stream must exist from the moment such a queue takes orders.
	if len(cfg.CallbackHosts) > 0 {
		if _, err := s.ensureCallbackStream(ctx); err != nil {
			return nil, err
		}
	}
	q := s.add(cfg, stream, keys, false)
	q.noteLanes(ctx)
	return q, nil
}

// ensureStream creates the stream, or updates it when the settings sluice chooses
// differ from those it has. A stream that matches is left alone: every replica declares
// every stream at start (queues also on each reload), and a needless update rewrites
// the stream's configuration while other replicas, or this one's dispatchers, create
// consumers on it, which nats-server does not serialise (the race detector saw it when
// two dispatchers of a laned queue started together, and when a queue's declaration
// met the callback sender's consumer on the callback stream).
func (s *Store) ensureStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := s.js.Stream(ctx, want.Name)
	if err != nil {
		st = nil // absent, or not known: creating or updating it says more
	}
	return s.ensureFrom(ctx, st, want)
}

// ensureFrom is ensureStream for the stream have as just looked up (nil: none).
func (s *Store) ensureFrom(ctx context.Context, have jetstream.Stream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	if have != nil && sameStream(have.CachedInfo().Config, want) {
		return have, nil
	}
	return s.js.CreateOrUpdateStream(ctx, want)
}

// ensureKeyStream is ensureStream for a queue's key stream. A slot only counts a key
// against its client's cap (the order itself is the key's record, and is synced), so a
// single-replica key stream is written without waiting for the disk (nats-server's
// async persist mode, which takes no atomic batches): a keyed park then waits for one
// synced write, its order's. The server acknowledges such a write before it reaches
// the disk and syncs the stream every sync interval, so a crash of the server or its
// host may lose the slots (and the deletions of freed slots) of that long: their
// clients get past the cap, or are held to it by slots already freed, until the slots'
// TTL ends; nothing of an order is lost or repeated.
//
// JetStream cannot change a stream's persist mode. A synced key stream made by an
// earlier sluice stays synced; an async one that must become replicated is made anew,
// and its clients' caps start afresh. (An earlier sluice cannot declare an async key
// stream: to go back to one, delete the key streams first.)
func (s *Store) ensureKeyStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	if want.Replicas <= 1 && s.batches {
		want.PersistMode, want.AllowAtomicPublish = jetstream.AsyncPersistMode, false
	}
	st, err := s.js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st = nil
	case err != nil:
		return nil, err
	default:
		switch have := st.CachedInfo().Config; {
		case have.PersistMode == want.PersistMode:
		case want.PersistMode == jetstream.AsyncPersistMode:
			want.PersistMode, want.AllowAtomicPublish = have.PersistMode, true
		default:
			s.log.Warn("making the key stream anew: a replicated stream cannot skip disk syncs, and JetStream cannot change that on a stream",
				"stream", want.Name, "replicas", want.Replicas)
			if err := s.js.DeleteStream(ctx, want.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, err
			}
			st = nil
		}
	}
	st, err = s.ensureFrom(ctx, st, want)
	if err != nil {
		// Another process declaring the queue may have made it meanwhile.
		if again, aerr := s.js.Stream(ctx, want.Name); aerr == nil && sameStream(again.CachedInfo().Config, want) {
			return again, nil
		}
	}
	return st, err
}

// sameStream reports whether have holds every setting sluice chooses in want (the
// server fills in the rest, and adds metadata of its own).
func sameStream(have, want jetstream.StreamConfig) bool {
	for k, v := range want.Metadata {
		if have.Metadata[k] != v {
			return false
		}
	}
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Storage == want.Storage && have.Discard == want.Discard &&
		have.DiscardNewPerSubject == want.DiscardNewPerSubject && limit(have.MaxMsgs) == limit(want.MaxMsgs) &&
		limit(have.MaxBytes) == limit(want.MaxBytes) && limit(have.MaxMsgsPerSubject) == limit(want.MaxMsgsPerSubject) &&
		have.MaxAge == want.MaxAge && have.Duplicates == want.Duplicates && have.Replicas == want.Replicas &&
		have.AllowDirect == want.AllowDirect && have.AllowAtomicPublish == want.AllowAtomicPublish &&
		have.AllowMsgSchedules == want.AllowMsgSchedules && have.AllowRollup == want.AllowRollup &&
		have.AllowMsgTTL == want.AllowMsgTTL && have.SubjectDeleteMarkerTTL == want.SubjectDeleteMarkerTTL &&
		limit(have.MaxMsgSize) == limit(want.MaxMsgSize) && have.PersistMode == want.PersistMode
}

// sameBucket reports whether the stream of a key-value bucket, have, holds every
// setting of want that sluice chooses (the byte cap only when withCap).
func sameBucket(have jetstream.StreamConfig, want jetstream.KeyValueConfig, withCap bool) bool {
	return have.Description == want.Description && have.MaxMsgsPerSubject == int64(want.History) &&
		have.Storage == want.Storage && have.Replicas == want.Replicas &&
		(!withCap || limit(have.MaxBytes) == limit(want.MaxBytes)) &&
		have.SubjectDeleteMarkerTTL == want.LimitMarkerTTL && have.AllowMsgTTL
}

// limit is a stream limit as the server keeps it: none (0 when asked for) is -1.
func limit[T int32 | int64](v T) T {
	if v <= 0 {
		return -1
	}
	return v
}

// scheduledStream turns a queue's stream config into one that holds scheduled orders:
// JetStream message schedules on the schedule subjects, which fire onto the ready
// subjects of the same stream. JetStream refuses schedules on a discard-new stream (a
// due order could find no room and be lost), so the stream has no MaxMsgs or MaxBytes
// of its own: Park keeps the queue's caps itself (see Queue.checkRoom), and an order
// once accepted always finds room when it falls due. Roll-ups, which schedules need,
// are allowed: whoever may publish on the stream's subjects may therefore purge them
// too, which NATS permissions guard as they guard deletes.
func scheduledStream(c *jetstream.StreamConfig, queue string) {
	c.Subjects = append(c.Subjects, scheduleFilter(queue))
	c.Discard = jetstream.DiscardOld
	c.MaxMsgs, c.MaxBytes = -1, -1
	c.AllowMsgSchedules = true
	c.AllowRollup = true
}

// allowsSchedules reports whether the named stream exists and has message schedules
// on (a lookup failure counts as no: creating or updating the stream then says more).
func (s *Store) allowsSchedules(ctx context.Context, name string) bool {
	st, err := s.js.Stream(ctx, name)
	return err == nil && st.CachedInfo().Config.AllowMsgSchedules
}

// add adds (or updates) a queue of the store. keys is nil for an orphaned queue: the
// rules no longer name it, so nothing is parked in it.
func (s *Store) add(cfg queueconfig.Config, stream, keys jetstream.Stream, orphaned bool) *Queue {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[cfg.Name]
	if q == nil {
		q = &Queue{store: s, name: cfg.Name}
		s.queues[cfg.Name] = q
	}
	// A stream handle names its stream: the first one serves for good, so readers
	// never race a re-declaration. A key stream is added when an orphan (which has
	// none) is declared again, before rules that park in it go live.
	if q.stream == nil {
		q.stream = stream
	}
	if q.keys == nil && keys != nil {
		q.keys = keys
	}
	if keys != nil {
		q.slots.Store(s.writer(q.slots.Load(), KeyStreamName(cfg.Name), keys))
	}
	q.orders.Store(s.writer(q.orders.Load(), StreamName(cfg.Name), stream))
	q.cfg.Store(&cfg)
	q.orphaned.Store(orphaned)
	if info := stream.CachedInfo(); info != nil {
		q.schedules.Store(info.Config.AllowMsgSchedules)
	}
	return q
}

// noteLanes keeps mayHaveLanes. A stream's laned orders are looked for once, at the
// first declaration, in case an earlier configuration laned the queue. Another process
// that parks in lanes later (a configuration rolling out) is seen when this one's
// configuration lanes the queue too.
func (q *Queue) noteLanes(ctx context.Context) {
	if q.Config().Laned() {
		q.mayHaveLanes.Store(true)
		return
	}
	if q.lanesChecked.Swap(true) {
		return
	}
	// A laned order, or a schedule message (whose target lane shows only when it fires).
	subjects := []string{ReadySubject(q.name, "*", "*")}
	if q.schedules.Load() {
		subjects = append(subjects, scheduleFilter(q.name))
	}
	for _, subject := range subjects {
		_, err := q.store.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: 1, Next: subject})
		if !errors.Is(err, jetstream.ErrMsgNotFound) { // found, or not known: look in lanes
			q.mayHaveLanes.Store(true)
			return
		}
	}
}

// writer returns w, Park's writer of the named stream, or a new one when w is nil or
// batches otherwise than the stream's settings (as just declared) call for: a queue
// that became replicated, or a key stream made anew (see ensureKeyStream). Writes
// under way finish on the writer they started with.
func (s *Store) writer(w *groupCommit, name string, stream jetstream.Stream) *groupCommit {
	if d := directWrites(stream); w == nil || w.direct != d {
		return newGroupCommit(s.nc, s.js, name, s.opts.publishTimeout, d)
	}
	return w
}

// fileDirectWrites is directWrites for a single-replica file stream. nats-server
// stages each atomic batch of such a stream in a file store of its own, made and
// removed for the batch: measured on 2.15.2 (sluice-bench parking on a shared disk),
// 15–30ms a batch against 1–4ms a synced publish, so a batch pays only for more
// waiting writes than this; at 16 concurrent Parks batches and plain publishes came
// out even, at 64 batches won.
const fileDirectWrites = 16

// directWrites returns how many of Park's writes to stream go out as plain publishes
// at once before the others wait for an atomic batch (see groupCommit): 0 when the
// stream takes no atomic batches (a server older than 2.12 drops AllowAtomicPublish),
// 1 when the server stages a batch in memory (a replicated stream, or one in memory),
// fileDirectWrites else.
func directWrites(stream jetstream.Stream) int {
	info := stream.CachedInfo()
	switch {
	case info == nil || !info.Config.AllowAtomicPublish:
		return 0
	case info.Config.Replicas > 1 || info.Config.Storage == jetstream.MemoryStorage:
		return 1
	}
	return fileDirectWrites
}

// checkDownstreamStream makes sure the subject of an at-least-once nats: downstream is
// captured by a stream. Checked at every declaration (start, reload); a stream deleted
// later makes deliveries fail as a downstream that is down.
func (s *Store) checkDownstreamStream(ctx context.Context, cfg queueconfig.Config) error {
	subj := cfg.NATSSubject()
	if subj == "" || cfg.Delivery == queueconfig.AtMostOnce {
		return nil
	}
	_, err := s.js.StreamNameBySubject(ctx, subj)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: queue %q, subject %q: create a stream for it (for example nats stream add --subjects %s), or give the queue delivery: at_most_once", ErrNoStream, cfg.Name, subj, subj)
	}
	return fmt.Errorf("%w: queue %q: looking up the stream of subject %q: %w", ErrUnavailable, cfg.Name, subj, err)
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

// Queue is a declared queue, or an orphaned one (see AdoptOrphans).
type Queue struct {
	store    *Store
	name     string
	cfg      atomic.Pointer[queueconfig.Config]
	stream   jetstream.Stream
	keys     jetstream.Stream            // key slots (KeyStreamName); nil for an orphan
	orders   atomic.Pointer[groupCommit] // Park's writes to stream
	slots    atomic.Pointer[groupCommit] // Park's writes to keys; nil with keys
	orphaned atomic.Bool
	// schedules: the stream holds scheduled orders (see scheduledStream); Park then
	// enforces MaxDepth and MaxBytes itself.
	schedules atomic.Bool

	samples outflowSamples

	// mayHaveLanes is true when a ticket's order may wait in a lane (see parked): the
	// queue is laned, was when this store declared it before, or its stream held a
	// laned order when this store first declared it (lanesChecked).
	mayHaveLanes atomic.Bool
	lanesChecked atomic.Bool

	infoMu   sync.Mutex
	info     *jetstream.StreamInfo
	infoAt   time.Time
	infoLock sync.Mutex // held while one caller refreshes
	// firstReady is, in a queue that takes schedules, the sequence of its first ready
	// order (see position), looked up at firstReadyAt along with a refresh of info.
	firstReady   uint64
	firstReadyAt time.Time
}

// Name returns the queue name.
func (q *Queue) Name() string { return q.name }

// Config returns the queue's configuration (with defaults applied).
func (q *Queue) Config() queueconfig.Config { return *q.cfg.Load() }

// StreamName returns the name of the queue's stream.
func (q *Queue) StreamName() string { return StreamName(q.name) }

// Store returns the store the queue belongs to.
func (q *Queue) Store() *Store { return q.store }

// subject is the subject of a ticket's order without a lane (see ReadySubject).
func (q *Queue) subject(ticket string) string { return ReadySubject(q.name, "", ticket) }

// Depth returns the number of queued messages (fresh from the server).
func (q *Queue) Depth(ctx context.Context) (uint64, error) {
	info, err := q.streamInfo(ctx, 0)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// streamInfo returns stream info at most maxAge old (maxAge 0: fresh). When a refresh
// is due and another caller is already refreshing, the older value is returned rather
// than waiting; a failed refresh also falls back to it.
func (q *Queue) streamInfo(ctx context.Context, maxAge time.Duration) (*jetstream.StreamInfo, error) {
	q.infoMu.Lock()
	cached, at, readyAt := q.info, q.infoAt, q.firstReadyAt
	q.infoMu.Unlock()
	useCached := cached != nil && maxAge > 0
	switch {
	case useCached && time.Since(at) < maxAge:
		return cached, nil
	case useCached:
		if !q.infoLock.TryLock() {
			return cached, nil
		}
	default:
		q.infoLock.Lock()
	}
	defer q.infoLock.Unlock()
	fresh, err := q.stream.Info(ctx)
	if err != nil {
		if useCached {
			return cached, nil
		}
		return nil, fmt.Errorf("%w: stream info of %q: %w", ErrUnavailable, q.name, err)
	}
	now := time.Now()
	// At most one lookup a second: a failed one keeps the older sequence, which is
	// lower than the true one (the first ready order only moves on), until then.
	lookUp := q.schedules.Load() && now.Sub(readyAt) >= time.Second
	var first uint64
	if lookUp {
		first = q.lookUpFirstReady(ctx, fresh)
	}
	q.infoMu.Lock()
	q.info, q.infoAt = fresh, now
	if lookUp {
		q.firstReadyAt = now
		if first != 0 {
			q.firstReady = first
		}
	}
	q.infoMu.Unlock()
	q.samples.add(now, fresh.State)
	return fresh, nil
}

// lookUpFirstReady returns the sequence of the queue's first ready order, in any lane
// (the stream's first sequence may be a schedule message waiting for a distant time):
// with none, the sequence the next message gets (as of info, just fetched); 0 when the
// lookup fails.
func (q *Queue) lookUpFirstReady(ctx context.Context, info *jetstream.StreamInfo) uint64 {
	raw, err := q.store.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: 1, Next: readyFilter(q.name)})
	switch {
	case err == nil:
		return raw.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return info.State.LastSeq + 1
	}
	q.store.log.Debug("cannot look up the first ready order", "queue", q.name, "err", err)
	return 0
}

// position estimates how many queued messages are ahead of seq, plus one: the
// sequences from the first waiting order to seq, from stream information up to a
// second old. In a queue that takes schedules the first waiting order is its first
// ready one (looked up at a refresh of that information, at most once a second, so up
// to about two seconds old), not the stream's first message, which may be a schedule
// waiting for a distant time. The estimate still counts everything in between that is
// not waiting ahead of seq: schedule messages parked in between, orders already gone
// out of turn (cancelled, or delivered from another lane), and what was delivered
// since the lookup.
func (q *Queue) position(ctx context.Context, seq uint64) uint64 {
	info, err := q.streamInfo(ctx, time.Second)
	if err != nil {
		return 1
	}
	first := info.State.FirstSeq
	if q.schedules.Load() {
		q.infoMu.Lock()
		first = max(first, q.firstReady)
		q.infoMu.Unlock()
	}
	if first == 0 || seq < first {
		return 1
	}
	return seq - first + 1
}

// eta estimates when the message at position pos starts delivery.
func (q *Queue) eta(now time.Time, pos uint64) time.Time {
	if pos <= 1 {
		return now
	}
	r := q.Config().Outflow
	d := float64(pos-1) * float64(r.Period) / float64(r.Count)
	if d > float64(math.MaxInt64/2) {
		d = float64(math.MaxInt64 / 2)
	}
	return now.Add(time.Duration(d))
}

// softCapAge is how old the stream info may be by which Park keeps the caps of a queue
// with schedules: concurrent parks within it may each find the last free place, so such
// a queue can exceed MaxDepth by about as many orders as it takes in softCapAge.
const softCapAge = 100 * time.Millisecond

// checkRoom keeps MaxDepth and MaxBytes for a queue whose stream cannot (one with
// schedules, see scheduledStream): ErrFull (a *FullError) once they are reached,
// counting the scheduled orders. For any other queue JetStream itself refuses.
func (q *Queue) checkRoom(ctx context.Context) error {
	if !q.schedules.Load() {
		return nil
	}
	cfg := q.Config()
	info, err := q.streamInfo(ctx, softCapAge)
	if err != nil {
		return err
	}
	if (cfg.MaxDepth > 0 && info.State.Msgs >= uint64(cfg.MaxDepth)) || (cfg.MaxBytes > 0 && info.State.Bytes >= uint64(cfg.MaxBytes)) {
		return q.fullError(ctx)
	}
	return nil
}

// fullError describes the queue full now: its depth, the limit it reached (max_depth
// or max_bytes, by the stream's state), and when to come back.
func (q *Queue) fullError(ctx context.Context) *FullError {
	cfg := q.Config()
	fe := &FullError{Queue: q.name}
	if info, err := q.streamInfo(ctx, 0); err == nil {
		fe.Depth = info.State.Msgs
		switch {
		case cfg.MaxDepth > 0 && info.State.Msgs >= uint64(cfg.MaxDepth):
			fe.Limit, fe.Max = "max_depth", cfg.MaxDepth
		case cfg.MaxBytes > 0:
			// Not its depth, so its bytes: JetStream refuses a message that would take
			// the stream past them, however far below they are now.
			fe.Limit, fe.Max = "max_bytes", cfg.MaxBytes
		}
	}
	r := cfg.Outflow
	ra := time.Duration(float64(fe.Depth) / 10 * float64(r.Period) / float64(r.Count))
	fe.RetryAfter = max(ra.Round(time.Second), time.Second)
	return fe
}

// connected reports whether the connection can publish right now.
func (s *Store) connected() bool { return s.nc.Status() == nats.CONNECTED }

func unavailable(what string, err error) error {
	if errors.Is(err, ErrUnavailable) {
		return err
	}
	return fmt.Errorf("%w: %s: %w", ErrUnavailable, what, err)
}
