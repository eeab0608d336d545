package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
)

// dispatchConfig tunes the dispatchers of serve and dispatch.
type dispatchConfig struct {
	deliveryTimeout time.Duration
	ackWait         time.Duration
	pinnedTTL       time.Duration
}

func (c *dispatchConfig) flags(fs *pflag.FlagSet) {
	fs.DurationVar(&c.deliveryTimeout, "delivery-timeout", 30*time.Second, "how long one delivery attempt may take; longer is a failed attempt")
	fs.DurationVar(&c.ackWait, "ack-wait", 0, "how long a message taken by a dispatcher that went silent (crashed) waits before another one delivers it (at least the delivery timeout and two outflow intervals); 0: --delivery-timeout + 30s")
	fs.DurationVar(&c.pinnedTTL, "failover-after", 10*time.Second, "how long a queue stays with a dispatcher that stopped asking for messages before another replica takes it over")
}

func (c dispatchConfig) options() []dispatcher.Option {
	opts := []dispatcher.Option{dispatcher.WithDeliveryTimeout(c.deliveryTimeout), dispatcher.WithPinnedTTL(c.pinnedTTL)}
	if c.ackWait > 0 {
		opts = append(opts, dispatcher.WithAckWait(c.ackWait))
	}
	return opts
}

// queues keeps the declared queues in step with the rules, and, when it has
// dispatcher options, drains each one. Until the queue store is open (the shared
// streams and buckets exist) and a queue is declared, parking in it fails with
// queue.ErrUnavailable or queue.ErrUnknownQueue, which the front door answers with 503
// and Retry-After.
//
// Reloads declare first (prepare): once the store is open, a new rules set goes live
// only after every queue it names is declared, so a defer to a queue it adds never
// meets an undeclared queue; a set whose queues cannot be declared is refused as a
// whole and retried by the loop of run. While the store is not open, a new set goes
// live at once (defers answer 503 whichever set is active) and the loop declares the
// newest one as soon as NATS lets it.
type queues struct {
	conn     *natsConn
	dispOpts []dispatcher.Option // nil: park only
	reg      prometheus.Registerer
	log      *slog.Logger
	reload   func() error         // reads the rules files again (watch.Watcher.Reload)
	tracing  trace.TracerProvider // nil: the global one

	store atomic.Pointer[queue.Store] // nil until open

	mu       sync.Mutex
	replicas int
	declErr  error // of the latest declaration; nil once every queue is declared
	disp     *dispatcher.Dispatcher
	reports  jetstream.KeyValue // the console's bucket, once made (reportsBucket)
	ctx      context.Context    // dispatchers run until it ends
	running  map[string]bool
	wg       sync.WaitGroup // dispatchers and the declaring loop

	// Declaring, one at a time: at start (declare), on a reload (prepare) and in the
	// loop of run (catchUp).
	declMu sync.Mutex
	// want is the set whose queues are declared, or are to be: the active set, or
	// the one a reload is activating. pending: not all declared yet (for want of
	// NATS), retried by the loop; failingFrom and attempts say since when.
	want        *rules.Set
	pending     bool
	failingFrom time.Time
	attempts    int
	// versionLogged: when a server too old for sluice was last logged (versionLogEvery).
	versionLogged time.Time
	// refused: a reload was refused because its queues could not be declared; the
	// loop retries it.
	refused bool
	kick    chan struct{} // wakes the loop: something to declare or to retry
}

// newQueues returns the queues on c; nothing is opened until declare. Unless disp is
// nil, the queues get a dispatcher with those options. reload reads the rules again
// (to retry a refused reload).
func newQueues(c *natsConn, disp []dispatcher.Option, reg prometheus.Registerer, log *slog.Logger, reload func() error) *queues {
	return &queues{conn: c, dispOpts: disp, reg: reg, log: log, reload: reload, kick: make(chan struct{}, 1)}
}

// wake makes the loop of run look for work; it never blocks.
func (q *queues) wake() {
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

// errNotDeclared answers what needs the store while NATS has not let it open yet.
var errNotDeclared = fmt.Errorf("%w: the queues are not declared yet", queue.ErrUnavailable)

// opened returns the store, or errNotDeclared until it is open.
func (q *queues) opened() (*queue.Store, error) {
	if s := q.store.Load(); s != nil {
		return s, nil
	}
	return nil, errNotDeclared
}

// Park, BodyLimit, Cancel and Status implement deferral.Parker.

func (q *queues) Park(ctx context.Context, req *queue.Request) (queue.Receipt, error) {
	s, err := q.opened()
	if err != nil {
		return queue.Receipt{}, err
	}
	return s.Park(ctx, req)
}

// Repeat makes the front door answer a repeat of an accepted order on the proxy path
// (deferral.Repeater).
func (q *queues) Repeat(ctx context.Context, req *queue.Request) (queue.Receipt, bool, error) {
	s, err := q.opened()
	if err != nil {
		return queue.Receipt{}, false, err
	}
	return s.Repeat(ctx, req)
}

func (q *queues) BodyLimit(req *queue.Request) (queue.BodyLimit, error) {
	s, err := q.opened()
	if err != nil {
		return queue.BodyLimit{}, err
	}
	return s.BodyLimit(req)
}

func (q *queues) Cancel(ctx context.Context, ticket string) error {
	s, err := q.opened()
	if err != nil {
		return err
	}
	return s.Cancel(ctx, ticket)
}

func (q *queues) Status(ctx context.Context, ticket string) (*queue.Record, error) {
	s, err := q.opened()
	if err != nil {
		return nil, err
	}
	return s.Status(ctx, ticket)
}

// WatchRecords implements deferral.RecordWatcher: errNotDeclared until the store is
// open (the waits then read their tickets every few seconds and try again).
func (q *queues) WatchRecords(ctx context.Context, changed func(ticket string)) (stop func(), err error) {
	s, err := q.opened()
	if err != nil {
		return nil, err
	}
	return s.WatchRecords(ctx, changed)
}

// reportsBucket returns the console's bucket of the replicas' reports
// (console.ReportsBucket), made once the queue store is open, with the queues'
// replica count; errNotDeclared until then.
func (q *queues) reportsBucket(ctx context.Context) (jetstream.KeyValue, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.reports != nil {
		return q.reports, nil
	}
	if q.store.Load() == nil {
		return nil, errNotDeclared
	}
	js, err := jetstream.New(q.conn.nc)
	if err != nil {
		return nil, err
	}
	kv, err := console.OpenReportsBucket(ctx, js, q.replicas)
	if err != nil {
		return nil, fmt.Errorf("bucket %s: %w", console.ReportsBucket, err)
	}
	q.reports = kv
	return kv, nil
}

// open opens the queue store (creating the dead-letter stream and the key-value
// buckets) and the dispatcher, once.
func (q *queues) open(ctx context.Context) (*queue.Store, error) {
	if s := q.store.Load(); s != nil {
		return s, nil
	}
	replicas, err := q.conn.replicaCount()
	if err != nil {
		return nil, err
	}
	if !q.conn.nc.IsConnected() {
		// A request now would fail at once anyway; say why.
		return nil, q.conn.notConnected()
	}
	opts := []queue.Option{queue.WithReplicas(replicas), queue.WithRegisterer(q.reg), queue.WithLogger(q.log),
		queue.WithIdempotencyMaxBytes(q.conn.idemMax), queue.WithSigningKey(q.conn.key), queue.WithTracerProvider(q.tracing)}
	// A cluster's account limit, if any, is read by Open.
	if q.conn.embedded != nil {
		opts = append(opts, queue.WithStoreLimit(q.conn.embedded.MaxStore()), queue.WithDiskFree(q.conn.embedded.DiskFree))
	}
	store, err := queue.Open(ctx, q.conn.nc, opts...)
	if err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	var disp *dispatcher.Dispatcher
	if q.dispOpts != nil {
		opts := append([]dispatcher.Option{dispatcher.WithRegisterer(q.reg), dispatcher.WithLogger(q.log)}, q.dispOpts...)
		if disp, err = dispatcher.New(store, opts...); err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	q.mu.Lock()
	q.replicas, q.disp = replicas, disp
	q.mu.Unlock()
	q.store.Store(store)
	return store, nil
}

// lifetime ends when the process stops (once run has started).
func (q *queues) lifetime() context.Context {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ctx != nil {
		return q.ctx
	}
	return context.Background()
}

// health is the NATS check of /sluice/v1/status: down while not connected or not
// answering, degraded while JetStream does not answer (no meta leader) or the queues
// are not all declared.
func (q *queues) health(ctx context.Context) ingress.DependencyReport {
	nc := q.conn.nc
	store := q.store.Load()
	q.mu.Lock()
	declErr := q.declErr
	q.mu.Unlock()
	declared := store != nil && declErr == nil
	detail := map[string]any{"queues_declared": declared, "embedded": q.conn.embedded != nil}
	if !nc.IsConnected() {
		return ingress.DependencyReport{State: ingress.DependencyDown, Err: q.conn.notConnected(), Detail: detail}
	}
	detail["server"] = inProcess
	if q.conn.embedded == nil {
		detail["server"] = nc.ConnectedUrlRedacted()
	}
	if err := nc.FlushWithContext(ctx); err != nil {
		return ingress.DependencyReport{State: ingress.DependencyDown, Err: fmt.Errorf("NATS does not answer: %w", err), Detail: detail}
	}
	js, err := jetstream.New(nc)
	if err == nil {
		_, err = js.AccountInfo(ctx)
	}
	switch {
	case err != nil:
		return ingress.DependencyReport{State: ingress.DependencyDegraded, Err: fmt.Errorf("JetStream does not answer: %w", err), Detail: detail}
	case !declared:
		if declErr == nil {
			declErr = errors.New("the queues are not declared yet")
		}
		return ingress.DependencyReport{State: ingress.DependencyDegraded, Err: declErr, Detail: detail}
	}
	return ingress.DependencyReport{State: ingress.DependencyUp, Detail: detail}
}

// serverVersion is a readiness check: the error of the latest declaration when it
// is that the NATS server is too old for sluice's queues (queue.ErrServerVersion),
// else nil. A queue refused for a feature the server lacks is no failure: the others
// serve.
func (q *queues) serverVersion(context.Context) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.store.Load() == nil && errors.Is(q.declErr, queue.ErrServerVersion) {
		return q.declErr
	}
	return nil
}

func (q *queues) startDispatching(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.disp == nil || q.ctx == nil || q.running[name] {
		return
	}
	q.running[name] = true
	q.log.Info("dispatching", "queue", name)
	ctx := q.ctx
	q.wg.Go(func() {
		if err := q.disp.Run(ctx, name); err != nil {
			q.log.Error("dispatcher stopped", "queue", name, "err", err)
		}
		// A retired queue's dispatcher returns early; the queue may be declared again.
		q.mu.Lock()
		delete(q.running, name)
		q.mu.Unlock()
	})
}

// run starts the dispatchers of the declared queues, and of queues declared later,
// until ctx ends; and keeps declaring what is pending and retrying refused reloads,
// with backoff, until they succeed.
func (q *queues) run(ctx context.Context) {
	q.mu.Lock()
	q.ctx, q.running = ctx, map[string]bool{}
	q.mu.Unlock()
	// Samples for the achieved outflow of the queue API.
	q.wg.Go(func() { q.sampleOutflow(ctx) })
	if s := q.store.Load(); s != nil {
		for _, dq := range s.Queues() {
			q.startDispatching(dq.Name())
		}
	}
	q.wg.Go(func() { q.keepDeclared(ctx) })
}

// outflowSampleEvery is how often the achieved outflow of the queues is sampled.
const outflowSampleEvery = 5 * time.Second

// sampleOutflow samples the queues' achieved outflow once the store is open.
func (q *queues) sampleOutflow(ctx context.Context) {
	wait := time.NewTicker(outflowSampleEvery)
	defer wait.Stop()
	for q.store.Load() == nil {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
	}
	q.store.Load().SampleOutflow(ctx, outflowSampleEvery)
}

// wait waits until the dispatchers have finished the deliveries under way (after the
// context of dispatch ended), or until ctx ends. It reports whether they finished.
func (q *queues) wait(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		q.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
