package main

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
)

// The declaring of the queues: a rules set's queues are declared before the set goes
// live (prepare); what fails for want of NATS is retried in the background (catchUp,
// keepDeclared); queues that left the rules drain as orphans (adoptOrphans).

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
