package dispatcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// runner drains one queue in one dispatcher.
type runner struct {
	d     *Dispatcher
	q     *queue.Queue
	store *queue.Store
	log   *slog.Logger
	pacer *pace.Pacer
	m     queueMetrics
	cb    *circuit

	deliveries sync.WaitGroup
	// active counts the deliveries running of a queue with flow_by, and freed is
	// signalled when one ends (see flowTurn).
	active atomic.Int64
	freed  chan struct{}
	// flows are the operators' settings of the queue's flow keys (queue.FlowControl),
	// read again every maintenance tick.
	flows atomic.Pointer[map[string]queue.FlowControl]
	// reported: the last report of the queue's flow keys had keys (see reportFlows).
	reported bool
	gone     atomic.Bool // the queue was retired (see retired)

	mu          sync.Mutex
	cfg         queueconfig.Config
	cons        *queue.Consumer
	target      target
	fetchWait   time.Duration
	serverPause time.Time // pause we (or another replica) set on the server
	pauseSetAt  time.Time // when serverPause was last confirmed (future: being set)
}

func newRunner(d *Dispatcher, q *queue.Queue) (*runner, error) {
	cfg := q.Config()
	log := d.log.With("queue", q.Name())
	pacer, err := pace.New(cfg.Outflow, pace.WithClock(d.opts.clock))
	if err != nil {
		return nil, fmt.Errorf("dispatcher: queue %s: %w", q.Name(), err)
	}
	return &runner{
		d:     d,
		q:     q,
		store: q.Store(),
		log:   log,
		cons:  q.Consumer(queue.WithConsumerLogger(log)),
		pacer: pacer,
		m:     d.metrics.forQueue(q.Name()),
		cb:    newCircuit(d.opts.circuitAfter, d.opts.circuitMaxProbe),
		cfg:   cfg,
		freed: make(chan struct{}, 1),
	}, nil
}

func (r *runner) config() queueconfig.Config {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cfg
}

func (r *runner) run(ctx context.Context) {
	if !r.setup(ctx) {
		return
	}
	r.refreshFlows(ctx)
	maintDone := make(chan struct{})
	go func() {
		defer close(maintDone)
		r.maintain(ctx)
	}()
	r.fetchLoop(ctx) // the messages not started are handed back (HandBack waits for each)
	<-maintDone
	r.deliveries.Wait()
	// The settlements of the last deliveries (a retry's nak, a term) are on their way
	// before anything else stops (the connection, or the embedded server with the
	// process).
	fctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = r.cons.Flush(fctx)
	cancel()
	r.unpin()
	r.reportFlows(context.Background(), true)
	r.m.paused.Set(0)
	r.m.circuit.Set(0)
	r.flushRecords(context.Background())
}

// flushRecords writes the ticket records that JetStream refused earlier (see save).
func (r *runner) flushRecords(ctx context.Context) {
	if r.store.KeptRecords() == 0 {
		return
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if left, err := r.store.FlushRecords(fctx); err != nil {
		r.log.Debug("ticket records still refused", "left", left, "err", err)
	}
}

// setup creates or updates the consumer, retrying until it works or ctx ends.
func (r *runner) setup(ctx context.Context) bool {
	wait := 100 * time.Millisecond
	for {
		err := r.ensureConsumer(ctx)
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false // stopping: the failure is the stop's, nothing to warn about
		}
		if r.retired(ctx) {
			r.log.Info("queue retired; its dispatcher stops")
			return false
		}
		r.log.Warn("cannot set up the consumer; retrying", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return false
		case <-time.After(wait):
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// ensureConsumer makes the shared consumer match the queue config, and applies the
// config to this runner (target, pacing, fetch wait).
func (r *runner) ensureConsumer(ctx context.Context) error {
	cfg := r.q.Config()
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.cons.Ensure(cctx, r.d.consumerConfig(cfg)); err != nil {
		return err
	}
	target, err := r.d.newTarget(cfg)
	if err != nil {
		return err
	}
	fetchWait, _, _ := r.d.timing(cfg)
	if err := r.pacer.SetRate(cfg.Outflow); err != nil {
		return err
	}
	r.mu.Lock()
	r.cfg, r.target, r.fetchWait = cfg, target, fetchWait
	r.mu.Unlock()
	return nil
}

// fetchLoop asks for one message at a time until ctx ends. It checks each message
// and hands it to paceLoop, then asks for the next one while the previous waits for
// its slot: at high rates the round trips overlap the pacing instead of adding to it.
// At most two messages are held at a time (one waiting for its slot, the next one
// checked and handed over), each for about one interval.
func (r *runner) fetchLoop(ctx context.Context) {
	ready := make(chan prepared)
	paced := make(chan struct{})
	go func() {
		defer close(paced)
		r.paceLoop(ctx, ready)
	}()
	defer func() {
		close(ready)
		<-paced
	}()
	failWait := 50 * time.Millisecond
	for ctx.Err() == nil && !r.gone.Load() {
		r.mu.Lock()
		fetchWait := r.fetchWait
		r.mu.Unlock()
		// The pull runs to its end even when the dispatcher is stopping: a message the
		// server hands to a pull abandoned mid-way would wait out the ack wait. What
		// arrives after the stop goes back at once.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fetchWait)
		l, err := r.cons.Next(fctx)
		cancel()
		if err == nil && ctx.Err() != nil {
			handBack(l)
			return
		}
		if err == nil {
			if p, ok := r.prepare(ctx, l); ok {
				ready <- p
			}
		}
		switch {
		case err == nil, ctx.Err() != nil, errors.Is(err, queue.ErrNoMessages):
			failWait = 50 * time.Millisecond
			continue
		case errors.Is(err, queue.ErrConsumerGone):
			if r.retired(ctx) {
				r.log.Info("queue retired; its dispatcher stops")
				return
			}
			r.log.Warn("consumer is gone; setting it up again", "err", err)
			if !r.setup(ctx) {
				return
			}
		default:
			r.log.Debug("fetch failed", "err", err, "retry_in", failWait)
		}
		select {
		case <-ctx.Done():
		case <-time.After(failWait):
		}
		failWait = min(2*failWait, 2*time.Second)
	}
}

// reclaimEvery is how often a dispatcher looks for acknowledged orders its queue's
// stream still holds (see queue.Consumer.Reclaim).
const reclaimEvery = time.Minute

// maintain follows the server's pause state and config changes of the queue, and
// reclaims what the stream kept of acknowledged orders.
func (r *runner) maintain(ctx context.Context) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	var reclaimAt time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.flushRecords(ctx)
		r.refreshFlows(ctx)
		r.reportFlows(ctx, false)
		if now := time.Now(); now.After(reclaimAt) {
			reclaimAt = now.Add(reclaimEvery)
			r.reclaim(ctx)
		}
		// Lanes left to the queue's consumer while it held orders of theirs get their
		// consumers by a later Ensure (see queue.Consumer.LanesHeld).
		if cfg := r.q.Config(); !sameQueueConfig(cfg, r.config()) || r.cons.LanesHeld() {
			if err := r.ensureConsumer(ctx); err != nil {
				r.log.Warn("cannot apply the new queue config", "err", err)
			}
		}
		asked := time.Now()
		ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
		paused, remaining, err := r.cons.PauseState(ictx)
		cancel()
		if err != nil {
			if r.retired(ctx) {
				return // fetchLoop stops too
			}
			continue
		}
		now := time.Now()
		resumed := false
		r.mu.Lock()
		if paused && remaining > 0 {
			r.serverPause = maxTime(r.serverPause, now.Add(remaining))
			r.pauseSetAt = now
		} else if r.serverPause.After(now.Add(time.Second)) && r.pauseSetAt.Before(asked) {
			// The pause on the server ended well before its time: an operator resumed
			// the queue (queue.Queue.Resume). Resume here too.
			r.serverPause, resumed = time.Time{}, true
		}
		r.mu.Unlock()
		if resumed {
			r.pacer.Resume()
			r.log.Info("queue resumed")
		}
		if paused || r.pacer.PausedUntil().After(now) || r.cb.isOpen() {
			r.m.paused.Set(1)
		} else {
			r.m.paused.Set(0)
		}
	}
}

// refreshFlows reads the settings of the queue's flow keys (a queue with flow_by).
// When they cannot be read the last ones read stay.
func (r *runner) refreshFlows(ctx context.Context) {
	if !r.config().FlowBy.Enabled() {
		r.flows.Store(nil)
		return
	}
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	flows, err := r.q.Flows(fctx)
	if err != nil {
		r.log.Debug("cannot read the flow keys' settings", "err", err)
		return
	}
	r.flows.Store(&flows)
	paused, now := 0, time.Now()
	for _, fc := range flows {
		if fc.Paused(now) {
			paused++
		}
	}
	r.m.m.flowPause.WithLabelValues(r.q.Name()).Set(float64(paused))
}

// reportFlows publishes the depth and rate of the queue's flow keys that this
// dispatcher holds orders of or started lately (queue.Queue.PublishFlowStats): every
// maintenance tick while there are any, once more when there are none left (which
// removes the report), and at the end (final: none).
func (r *runner) reportFlows(ctx context.Context, final bool) {
	if !r.config().FlowBy.Enabled() && !r.reported {
		return
	}
	var stats []queue.FlowStat
	if !final {
		stats = r.d.flow.stats(r.q.Name(), r.d.opts.clock.Now())
	}
	if len(stats) == 0 && !r.reported {
		return
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.q.PublishFlowStats(pctx, r.d.replica, stats); err != nil {
		r.log.Debug("cannot publish the flow keys' figures", "err", err)
		return
	}
	r.reported = len(stats) > 0
}

// flowControl returns the settings of flow key key (zero: none).
func (r *runner) flowControl(key string) queue.FlowControl {
	if m := r.flows.Load(); m != nil {
		return (*m)[key]
	}
	return queue.FlowControl{}
}

// reclaim removes the acknowledged orders the queue's stream still holds: a removal
// that failed (a full disk) is not tried again by JetStream.
func (r *runner) reclaim(ctx context.Context) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := r.cons.Reclaim(rctx)
	if n > 0 {
		r.log.Warn("removed acknowledged orders the stream still held (JetStream could not remove them then: a full disk?)", "orders", n)
	}
	if err != nil {
		r.log.Debug("cannot reclaim acknowledged orders", "err", err)
	}
}

// retired reports whether the queue left the rules and its stream was deleted
// (queue.Store.Retire): nothing is left to drain.
func (r *runner) retired(ctx context.Context) bool {
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if r.q.Retired(sctx) {
		r.gone.Store(true)
		return true
	}
	return false
}

// sameQueueConfig reports whether a and b agree on everything the dispatcher sets up
// from a queue's config (its consumers, lanes and scheduler, pacer and target) or
// reads from the config it set up with (max_age and result_headers, at each order).
func sameQueueConfig(a, b queueconfig.Config) bool {
	return a.Outflow == b.Outflow && a.MaxInFlight == b.MaxInFlight && a.Downstream == b.Downstream && a.Delivery == b.Delivery &&
		a.MaxAttempts == b.MaxAttempts && a.Backoff == b.Backoff &&
		a.FairBy == b.FairBy && a.FairLanes == b.FairLanes && a.Priorities.Equal(b.Priorities) && a.FlowBy == b.FlowBy &&
		a.MaxAge == b.MaxAge && slices.Equal(a.ResultHeaders, b.ResultHeaders)
}

// unpin releases the pin if this runner holds it, so that another replica takes over
// without waiting for the pinned TTL.
func (r *runner) unpin() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := r.cons.Unpin(ctx); err != nil {
		r.log.Debug("unpin failed", "err", err)
	}
}

// pause stops the queue until until: locally at once, and on the server (every
// replica) unless a pause at least as long is already set there. why is logged when
// the server pause is set ("": not logged).
func (r *runner) pause(until time.Time, why string) {
	r.pacer.PauseUntil(until)
	r.m.paused.Set(1)
	r.mu.Lock()
	if !until.After(r.serverPause) {
		r.mu.Unlock()
		return
	}
	r.serverPause = until
	r.pauseSetAt = until // not confirmed yet: maintain must not take it for a resume
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.cons.Pause(ctx, until); err != nil {
		r.log.Warn("cannot pause the consumer on the server", "err", err)
		r.mu.Lock()
		r.serverPause = time.Time{}
		r.mu.Unlock()
		return
	}
	r.mu.Lock()
	r.pauseSetAt = time.Now()
	r.mu.Unlock()
	if why != "" {
		r.log.Info(why, "until", until.UTC().Format(time.RFC3339Nano))
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
