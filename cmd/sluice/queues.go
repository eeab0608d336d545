package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
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

// Declaring is retried with this backoff while it fails for want of NATS: unreachable,
// no quorum, streams that cannot be placed yet.
const (
	declareRetryMin = 250 * time.Millisecond
	declareRetryMax = 10 * time.Second
	// declareTimeout bounds one attempt: a cluster without a meta leader does not
	// answer at all.
	declareTimeout = 10 * time.Second
)

// versionLogEvery is how often a server too old for sluice is logged while declaring
// is retried.
const versionLogEvery = time.Minute

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

// declare tries once, at start, to declare the queues of live, the active set (or of
// the set a reload has activated meanwhile). What fails for want of NATS stays pending
// for the loop of run to retry. It reports whether the set is fully declared.
func (q *queues) declare(ctx context.Context, live *rules.Set) bool {
	q.declMu.Lock()
	defer q.declMu.Unlock()
	if q.want == nil {
		q.want, q.pending = live, true
	}
	if !q.pending {
		return true
	}
	return q.declareWant(ctx)
}

// declareWant tries once to declare every queue of q.want (see sync); declMu is held.
// It logs when declaring starts or stops failing, not at every attempt. It reports
// whether q.want is fully declared, or refused for good.
func (q *queues) declareWant(ctx context.Context) bool {
	err := q.sync(ctx, q.want)
	q.mu.Lock()
	q.declErr = err
	q.mu.Unlock()
	if err == nil || isRefusal(err) {
		if err != nil {
			// Retrying cannot help: the rules are wrong for the queue package.
			q.log.Error("queues of the rules refused", "err", err)
		}
		q.declared()
		return true
	}
	q.attempts++
	switch {
	case errors.Is(err, queue.ErrServerVersion):
		// Nothing else is wrong, and nothing changes until the servers are upgraded
		// (or the connection moves to a newer one): said plainly, once a minute.
		if q.failingFrom.IsZero() || time.Since(q.versionLogged) >= versionLogEvery {
			q.versionLogged = time.Now()
			q.log.Error("the NATS server is too old for sluice: defers answer 503 and /readyz fails until it is upgraded; retrying", "err", err)
		} else {
			q.log.Debug("queues still not declared", "attempts", q.attempts, "err", err)
		}
	case q.failingFrom.IsZero():
		q.log.Warn("queues not declared yet; defers answer 503 until they are; retrying in the background", "err", err)
	default:
		q.log.Debug("queues still not declared", "attempts", q.attempts, "err", err)
	}
	if q.failingFrom.IsZero() {
		q.failingFrom = time.Now()
	}
	return false
}

// declared records that q.want is declared; declMu is held.
func (q *queues) declared() {
	if !q.failingFrom.IsZero() {
		q.log.Info("queues declared", "failed_for", time.Since(q.failingFrom).Round(time.Millisecond), "attempts", q.attempts+1)
	}
	q.pending, q.failingFrom, q.attempts = false, time.Time{}, 0
}

// prepare is the rules watcher's Prepare: it declares the queues of a new set before
// the set goes live. Once the store is open, a set whose queues cannot all be declared
// is refused; the active set's queues are then declared again as they were, so that
// nothing of the refused set stays in force (a queue it added keeps its stream, empty,
// reported as orphaned), and the loop of run retries the reload with backoff, unless
// the queue package refused the configuration itself. While the store is not open,
// the set goes live and the loop declares it.
func (q *queues) prepare(set *rules.Set) error {
	q.declMu.Lock()
	defer q.declMu.Unlock()
	store := q.store.Load()
	if store == nil {
		q.want, q.pending = set, true
		q.wake()
		return nil
	}
	added, changed, removed := queueChanges(q.want, set)
	if !q.pending && len(added) == 0 && len(changed) == 0 && !removed {
		// Its queues are declared already, as the active set has them: nothing to ask
		// NATS, so a change of limits or routes goes live while NATS is away too.
		q.want, q.refused = set, false
		for _, dq := range store.Queues() {
			if dq.Orphaned() {
				q.log.Warn(orphanDraining, "queue", dq.Name())
			}
		}
		return nil
	}
	if q.pending {
		changed = otherQueues(set, added) // the active set is not all declared: all of them
	}
	ctx, cancel := context.WithTimeout(q.lifetime(), declareTimeout)
	defer cancel()
	// New queues first: the server refuses a new queue more often than a change, and
	// then nothing of the active set was touched.
	err := q.declareQueues(ctx, store, added)
	touched := err == nil && len(changed) > 0
	if err == nil {
		err = q.declareQueues(ctx, store, changed)
	}
	adopting := err == nil
	if err == nil {
		err = q.adoptOrphans(ctx, store, set, true)
	}
	if err == nil {
		q.mu.Lock()
		q.declErr = nil
		q.mu.Unlock()
		q.want, q.refused = set, false
		q.declared()
		return nil
	}
	if q.want != nil {
		// Back to the active set: what the refused set changed is declared again as
		// the active set has it; queues it added stay, empty, as orphans.
		var undo []*rules.Queue
		for _, wq := range q.want.Queues() {
			if adopting || touched && slices.ContainsFunc(changed, func(c *rules.Queue) bool { return c.Name == wq.Name }) {
				undo = append(undo, wq)
			}
		}
		rctx, rcancel := context.WithTimeout(q.lifetime(), declareTimeout)
		defer rcancel()
		rerr := q.declareQueues(rctx, store, undo)
		if rerr == nil {
			rerr = q.adoptOrphans(rctx, store, q.want, false)
		}
		if rerr != nil {
			// The loop declares the active set again until it succeeds.
			q.log.Warn("the active rules' queues could not be declared again after a refused reload; retrying in the background", "err", rerr)
			q.mu.Lock()
			q.declErr = rerr
			q.mu.Unlock()
			q.pending = true
			if q.failingFrom.IsZero() {
				q.failingFrom = time.Now()
			}
		}
	}
	q.refused = !isRefusal(err)
	q.wake()
	return fmt.Errorf("its queues could not be declared: %w", err)
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

// catchUp is one round of the loop of run: it declares what is pending, then retries
// a reload that was refused for want of NATS.
func (q *queues) catchUp(ctx context.Context) {
	q.declMu.Lock()
	if q.pending {
		q.declareWant(ctx)
	}
	retry := q.refused
	q.refused = false // prepare sets it again if the retry is refused too
	q.declMu.Unlock()
	if retry && ctx.Err() == nil {
		// The rules files as they are now: the refused content, or what replaced it.
		if err := q.reload(); err != nil && !errors.Is(err, watch.ErrNotPrepared) {
			q.log.Debug("retried rules reload", "err", err)
		}
	}
}

// idle reports whether the loop of run has nothing to retry.
func (q *queues) idle() bool {
	q.declMu.Lock()
	defer q.declMu.Unlock()
	return !q.pending && !q.refused
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

// isRefusal reports whether every error in err is a refusal of the configuration
// itself (which no retry changes), not trouble with NATS.
func isRefusal(err error) bool {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			if !isRefusal(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, queue.ErrInvalidConfig)
}

// sync opens the store if need be, declares every queue of set (creating or updating
// its stream) and starts a dispatcher for each new one. Queues that left the rules but
// still have a stream keep draining with the configuration stored with it (orphans,
// reported here). It returns every declaration error at once.
func (q *queues) sync(ctx context.Context, set *rules.Set) error {
	store, err := q.open(ctx)
	if err != nil {
		return err
	}
	err = q.declareQueues(ctx, store, set.Queues())
	if emb := q.conn.embedded; emb != nil {
		// The streams just made must outlive a power cut (embedded.Server.SyncMetadata).
		if serr := emb.SyncMetadata(); serr != nil {
			q.log.Warn("a power cut may lose the streams made since the last start", "error", serr)
		}
	}
	if oerr := q.adoptOrphans(ctx, store, set, true); oerr != nil {
		return errors.Join(err, oerr)
	}
	return err
}

// declareQueues declares the queues rqs and starts a dispatcher for each new one. It
// returns every declaration error at once.
func (q *queues) declareQueues(ctx context.Context, store *queue.Store, rqs []*rules.Queue) error {
	q.mu.Lock()
	replicas := q.replicas
	q.mu.Unlock()
	var errs []error
	for _, rq := range rqs {
		cfg := rq.Config
		cfg.Replicas = replicas // where the queues live decides, not the rules file
		if _, err := store.Declare(ctx, cfg); err != nil {
			errs = append(errs, fmt.Errorf("queue %s: %w", rq.Name, err))
			continue
		}
		if payload := q.conn.nc.MaxPayload(); payload < cfg.MaxBody {
			q.log.Warn("the NATS server's max payload is smaller than the queue's max_body: larger bodies get 413 "+
				"(raise max_payload on the NATS servers; the embedded server's follows max_body at start)",
				"queue", rq.Name, "max_body", cfg.MaxBody, "max_payload", payload)
		}
		q.startDispatching(rq.Name)
	}
	return errors.Join(errs...)
}

const orphanDraining = "queue left the rules; draining it with the configuration it was declared with (sluice queue retire it once empty)"

// queueChanges compares the queues of set with those of from (nil: none): the ones
// from does not have, the ones it configures otherwise, and whether from has queues
// that set has not.
func queueChanges(from, set *rules.Set) (added, changed []*rules.Queue, removed bool) {
	configs := map[string]queueconfig.Config{}
	if from != nil {
		for _, rq := range from.Queues() {
			configs[rq.Name] = rq.Config
		}
	}
	kept := 0
	for _, rq := range set.Queues() {
		c, ok := configs[rq.Name]
		switch {
		case !ok:
			added = append(added, rq)
		case !reflect.DeepEqual(c, rq.Config):
			changed = append(changed, rq)
			kept++
		default:
			kept++
		}
	}
	return added, changed, kept < len(configs)
}

// otherQueues returns the queues of set that are not in some.
func otherQueues(set *rules.Set, some []*rules.Queue) []*rules.Queue {
	var out []*rules.Queue
	for _, rq := range set.Queues() {
		if !slices.Contains(some, rq) {
			out = append(out, rq)
		}
	}
	return out
}

// adoptOrphans marks the queues that set does not name as orphans, which keep
// draining with the configuration stored with their streams, and logs them if report.
func (q *queues) adoptOrphans(ctx context.Context, store *queue.Store, set *rules.Set, report bool) error {
	var names []string
	for _, rq := range set.Queues() {
		names = append(names, rq.Name)
	}
	orphans, err := store.AdoptOrphans(ctx, names)
	if err != nil {
		return fmt.Errorf("orphaned queues: %w", err)
	}
	for _, o := range orphans {
		switch {
		case o.Queue == nil:
			if report {
				q.log.Error("a queue that left the rules holds orders it cannot drain: put it back in the rules, or sluice queue retire --drop it",
					"queue", o.Name, "depth", o.Depth, "err", o.Err)
			}
			continue
		case report:
			q.log.Warn(orphanDraining, "queue", o.Name, "depth", o.Depth)
		}
		q.startDispatching(o.Name)
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

// keepDeclared is the declaring loop of run.
func (q *queues) keepDeclared(ctx context.Context) {
	b := backoff.NewExponentialBackOff(backoff.WithInitialInterval(declareRetryMin),
		backoff.WithMaxInterval(declareRetryMax), backoff.WithMaxElapsedTime(0))
	retry := time.NewTimer(b.NextBackOff())
	defer retry.Stop()
	if q.idle() {
		retry.Stop()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-q.kick:
			b.Reset() // new work: a new set or a fresh refusal
		case <-retry.C:
		}
		actx, cancel := context.WithTimeout(ctx, declareTimeout)
		q.catchUp(actx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		// A retried reload refused again woke the loop: that is no news. What is left
		// to do is read after it, so nothing is missed.
		select {
		case <-q.kick:
		default:
		}
		if q.idle() {
			retry.Stop()
			b.Reset()
		} else {
			retry.Reset(b.NextBackOff())
		}
	}
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
