package queue

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

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
// sluice_queue_park_unacknowledged_total, sluice_queue_depth…) on r. Without it no metrics are registered anywhere.
func WithRegisterer(r prometheus.Registerer) Option { return func(o *options) { o.registerer = r } }

// WithPublishTimeout bounds how long Park waits for JetStream to acknowledge
// (default 5s). The bound is on the whole Park: past it during the publish, Park fails
// with ErrNotAcknowledged (the order may be stored); before it (a keyed order's lookup
// or slot), with ErrUnavailable (nothing was stored).
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
