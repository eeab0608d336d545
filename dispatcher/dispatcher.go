package dispatcher

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// Option configures a Dispatcher.
type Option func(*options)

type options struct {
	logger           *slog.Logger
	registerer       prometheus.Registerer
	client           *http.Client
	deliveryTimeout  time.Duration
	ackWait          time.Duration
	pinnedTTL        time.Duration
	fetchWait        time.Duration
	defaultPause     time.Duration
	maxPause         time.Duration
	clock            pace.Clock
	circuitAfter     int
	circuitMaxProbe  time.Duration
	callbacks        CallbackPolicy
	callbackResolver Resolver
	tracerProvider   trace.TracerProvider
	flowLimiter      limiter.Limiter
}

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegisterer registers the dispatcher metrics on r (none are registered without it).
func WithRegisterer(r prometheus.Registerer) Option {
	return func(o *options) { o.registerer = r }
}

// WithHTTPClient sets the client for HTTP downstreams. Its Timeout is ignored in favour
// of the delivery timeout; it should not follow redirects. Default: a client of its own
// with keep-alive connections and no redirects. Each delivery is sent through
// pace.SendOnce, so that no client sends it again on its own outside its pacing slot;
// a delivery without a body whose method is not GET, HEAD, OPTIONS or TRACE carries
// its idempotency key as header "idempotency-key" (lower case; see pace.SendOnce).
func WithHTTPClient(c *http.Client) Option { return func(o *options) { o.client = c } }

// WithDeliveryTimeout bounds one delivery attempt (default 30s). A timeout is a failed
// attempt.
func WithDeliveryTimeout(d time.Duration) Option {
	return func(o *options) { o.deliveryTimeout = d }
}

// WithAckWait sets the consumer's ack wait: how long after a dispatcher took a message
// and went silent it is handed to another one (default: delivery timeout + 30s; never
// less than delivery timeout + two pacing intervals + 1s).
func WithAckWait(d time.Duration) Option { return func(o *options) { o.ackWait = d } }

// WithPinnedTTL sets how long the server keeps a queue pinned to a dispatcher that has
// stopped asking for messages — the fail-over time after a dispatcher dies (default
// 10s; raised to at least two fetch waits plus two pacing intervals).
func WithPinnedTTL(d time.Duration) Option { return func(o *options) { o.pinnedTTL = d } }

// WithFetchWait sets the expiry of each pull request (default: a third of the pinned
// TTL, at most 5s).
func WithFetchWait(d time.Duration) Option { return func(o *options) { o.fetchWait = d } }

// WithDefaultPause sets the pause after a 429 or 503 without a usable Retry-After
// (default 1s).
func WithDefaultPause(d time.Duration) Option { return func(o *options) { o.defaultPause = d } }

// WithMaxPause caps the pause a downstream's Retry-After can impose (default 1h).
func WithMaxPause(d time.Duration) Option { return func(o *options) { o.maxPause = d } }

// WithCircuit sets when a queue's circuit opens — after `after` consecutive attempts
// that found the downstream down (connection refused or unreachable, or no answer
// within the delivery timeout; default 3) — and the longest wait between the probes
// while it is open (default 30s; the first is 1s, doubling).
func WithCircuit(after int, maxProbeInterval time.Duration) Option {
	return func(o *options) { o.circuitAfter, o.circuitMaxProbe = after, maxProbeInterval }
}

// WithDispatcherClock sets the clock that paces the dispatcher's queues' outflow
// (default pace.SystemClock).
func WithDispatcherClock(c pace.Clock) Option { return func(o *options) { o.clock = c } }

// WithTracerProvider sets where delivery spans go (default otel.GetTracerProvider(),
// which records nothing until the program sets a provider; noop.NewTracerProvider()
// turns them off). Each delivery attempt gets a span "sluice.deliver" with the
// attributes sluice.queue, sluice.ticket, sluice.attempt and, once answered,
// http.response.status_code. It starts a trace of its own, linked to the parked
// order's trace context (queue.Message.TraceParent): the wait can last hours, longer
// than any request's trace should. Its context goes to the downstream as W3C
// traceparent (and tracestate), replacing the client's, on HTTP requests and on
// nats:SUBJECT publishes alike; the delivery and wait histograms carry its trace as
// an exemplar when it is sampled.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) { o.tracerProvider = tp }
}

// Dispatcher drains queues of a queue.Store to their downstreams.
//
// Any number of dispatcher processes may run the same queue. They share one durable pull
// consumer whose pinned priority group lets the server hand messages to one of them at a
// time (the pinned one); that dispatcher's Pacer therefore sets the queue's global
// outflow. When it dies, it stops sending pull requests; after the pinned TTL the
// server pins one of the others, whose pull requests were waiting all along (fail-over).
// Messages the dead one had taken come back after the ack wait, with the same ticket as
// Idempotency-Key. A dispatcher that stops cleanly unpins itself at once. An order
// that comes back to the dispatcher still delivering it (the delivery and its
// settlement outlasted the ack wait: a stall, or an ack wait too short) is not
// delivered beside itself: the delivery under way settles it (see queue.Consumer).
//
// Each dispatcher asks for one message at a time (a pull request of batch 1 that
// expires after the fetch wait); a fetched message waits for its pacing slot while the
// next one is fetched, so at most two are held, each for about one interval — nothing
// sits in a buffer while its ack wait runs (the ack wait exceeds the delivery timeout
// plus two intervals). The consumer's MaxAckPending is the queue's MaxInFlight, which
// caps concurrent deliveries across all dispatchers.
//
// A 429 or 503 answer pauses the queue until its Retry-After (capped by WithMaxPause):
// the dispatcher pauses the consumer on the server (PauseConsumer), which stops every
// replica, and its own pacer; the message is retried after the pause and the attempt is
// not counted. Other 5xx answers, timeouts and other network errors are failed
// attempts, retried after an exponential backoff with jitter (NakWithDelay); a
// connection that could not be made is retried the same way without counting. Such
// failures on consecutive orders (WithCircuit) open the queue's circuit: the queue
// pauses and one order at a time probes the downstream on a backoff, attempts not
// counted, until an answer closes it. Other 4xx answers end in status failed. After MaxAttempts failed attempts the message is copied to the
// dead-letter stream, an event goes to sluice.dead.{queue}, and the message is
// terminated. Failed attempts are counted in the ticket record, because JetStream's
// delivery count also counts pauses and crash redeliveries.
//
// Settling an order never waits on its bookkeeping: a ticket record JetStream refuses
// is kept in memory (see queue.Lease) and written later. A dispatcher that
// stops hands the orders it fetched but did not start back at once.
//
// Before a delivery the dispatcher reads the ticket record; a ticket already done,
// failed or dead is acknowledged without delivering it again (a redelivery after a crash
// between the final record and the acknowledgement, or a republished duplicate).
type Dispatcher struct {
	store   *queue.Store
	opts    options
	log     *slog.Logger
	metrics *metrics
	client  *http.Client
	// callbackClient sends callbacks (see callbackDialer); privateCallbackClient those
	// of queues with CallbackPrivate, on connections of its own.
	callbackClient, privateCallbackClient *http.Client
	tracer                                trace.Tracer // nil: no spans
	flow                                  *flowGate
	// replica names this dispatcher's reports of flow keys (a random id).
	replica string
}

// New returns a dispatcher for the queues of store.
func New(store *queue.Store, opts ...Option) (*Dispatcher, error) {
	o := options{
		deliveryTimeout: 30 * time.Second,
		pinnedTTL:       10 * time.Second,
		defaultPause:    time.Second,
		maxPause:        time.Hour,
		clock:           pace.SystemClock{},
		circuitAfter:    3,
		circuitMaxProbe: 30 * time.Second,
		callbacks:       DefaultCallbackPolicy,
	}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.deliveryTimeout <= 0 || o.pinnedTTL <= 0 || o.defaultPause <= 0 || o.maxPause <= 0 || o.circuitMaxProbe <= 0 {
		return nil, errors.New("dispatcher: timeouts and pauses must be positive")
	}
	if o.clock == nil {
		return nil, errors.New("dispatcher: WithDispatcherClock(nil)")
	}
	if err := o.callbacks.validate(); err != nil {
		return nil, err
	}
	if o.circuitAfter < 1 {
		return nil, errors.New("dispatcher: the circuit needs at least 1 failed attempt to open")
	}
	if o.ackWait > 0 && o.ackWait <= o.deliveryTimeout {
		return nil, fmt.Errorf("dispatcher: ack wait %s must exceed the delivery timeout %s", o.ackWait, o.deliveryTimeout)
	}
	if o.flowLimiter == nil {
		o.flowLimiter = limiter.NewMemory(limiter.WithClock(o.clock.Now))
	}
	d := &Dispatcher{store: store, opts: o, log: o.logger, metrics: newMetrics(), tracer: telemetry.Tracer(o.tracerProvider),
		flow: newFlowGate(o.flowLimiter), replica: rand.Text()[:16]}
	if o.registerer != nil {
		if err := d.metrics.register(o.registerer); err != nil {
			return nil, err
		}
	}
	d.client = o.client
	if d.client == nil {
		d.client = defaultHTTPClient()
	}
	if o.callbackResolver == nil {
		o.callbackResolver = net.DefaultResolver
	}
	d.callbackClient = newCallbackClient(newCallbackDialer(o.callbackResolver, false))
	d.privateCallbackClient = newCallbackClient(newCallbackDialer(o.callbackResolver, true))
	return d, nil
}

// Run drains the named queues (every declared queue when none are named) until ctx ends,
// then lets running deliveries finish (each bounded by the delivery timeout) and
// returns. It returns an error only for an unknown queue.
func (d *Dispatcher) Run(ctx context.Context, queues ...string) error {
	var qs []*queue.Queue
	if len(queues) == 0 {
		qs = d.store.Queues()
	}
	for _, name := range queues {
		q, err := d.store.Queue(name)
		if err != nil {
			return err
		}
		qs = append(qs, q)
	}
	if len(qs) == 0 {
		return errors.New("dispatcher: no queues")
	}
	runners := make([]*runner, 0, len(qs))
	for _, q := range qs {
		r, err := newRunner(d, q)
		if err != nil {
			return err
		}
		runners = append(runners, r)
	}
	// Callbacks are sent while any of the queues drains (a retired queue's runner ends).
	cbCtx, stopCallbacks := context.WithCancel(ctx)
	callbacksDone := make(chan struct{})
	go func() {
		defer close(callbacksDone)
		d.runCallbacks(cbCtx)
	}()
	// Results of nats: deliveries are written while the queues drain, by every
	// dispatcher that runs a queue with a nats: downstream. Their stream exists before
	// the first such delivery: a consumer's reply is a plain publish, lost when no
	// stream captures it.
	var results *queue.ResultConsumer
	if slices.ContainsFunc(qs, func(q *queue.Queue) bool { return q.Config().NATSSubject() != "" }) {
		if results = d.openResults(cbCtx); results == nil {
			stopCallbacks()
			<-callbacksDone
			return nil // ctx ended
		}
	}
	resultsDone := make(chan struct{})
	go func() {
		defer close(resultsDone)
		if results != nil {
			d.writeResults(cbCtx, results)
		}
	}()
	var wg sync.WaitGroup
	for _, r := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.run(ctx)
		}()
	}
	wg.Wait()
	stopCallbacks()
	<-callbacksDone
	<-resultsDone
	if d.opts.client == nil {
		d.client.CloseIdleConnections()
	}
	d.callbackClient.CloseIdleConnections()
	d.privateCallbackClient.CloseIdleConnections()
	return nil
}

// effective timing for a queue's rate.
func (d *Dispatcher) timing(cfg queueconfig.Config) (fetchWait, pinnedTTL, ackWait time.Duration) {
	interval := cfg.Outflow.Interval()
	pinnedTTL = d.opts.pinnedTTL
	fetchWait = d.opts.fetchWait
	if fetchWait <= 0 {
		fetchWait = min(pinnedTTL/3, 5*time.Second)
	}
	fetchWait = max(fetchWait, 100*time.Millisecond)
	pinnedTTL = max(pinnedTTL, 2*fetchWait+2*interval)
	ackWait = d.opts.ackWait
	if ackWait <= 0 {
		ackWait = d.opts.deliveryTimeout + 30*time.Second
	}
	ackWait = max(ackWait, d.opts.deliveryTimeout+2*interval+time.Second)
	return fetchWait, pinnedTTL, ackWait
}

func (d *Dispatcher) consumerConfig(cfg queueconfig.Config) queue.ConsumerConfig {
	_, pinnedTTL, ackWait := d.timing(cfg)
	inFlight := cfg.MaxInFlight
	if cfg.FlowBy.Enabled() {
		inFlight += FlowPending // the dispatcher keeps MaxInFlight itself
	}
	return queue.ConsumerConfig{AckWait: ackWait, PinnedTTL: pinnedTTL, MaxInFlight: inFlight}
}
