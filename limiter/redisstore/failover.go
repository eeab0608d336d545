package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/promshare"
)

// What the Redis store does when Redis fails: see Store.

var monoBase = time.Now()

// monoMicros reads the monotonic clock, in µs since the package started.
func (r *Store) monoMicros() int64 { return time.Since(monoBase).Microseconds() }

func (r *Store) initMetrics(reg prometheus.Registerer) error {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sluice_limiter_fallback_total",
		Help: "Decisions the Redis limiter store made without Redis (Redis failed, was too slow or was down), by failure mode.",
	}, []string{"mode"})
	if reg != nil {
		// Another store registered it: count there too.
		var err error
		if vec, err = promshare.Register(reg, vec); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidOption, err)
		}
	}
	r.fallbackTotal = map[limiter.FailureMode]prometheus.Counter{}
	for _, m := range []limiter.FailureMode{limiter.FailLocal, limiter.FailOpen, limiter.FailClosed} {
		r.fallbackTotal[m] = vec.WithLabelValues(string(m))
	}
	return nil
}

// failed handles a request's error: trouble with Redis itself marks it down; an
// error that Redis answered for this request alone (a script error, a key of the
// wrong type) only fails this decision, and is logged at most once a second.
func (r *Store) failed(err error) {
	if errors.Is(err, errClosed) {
		return
	}
	if isRedisTrouble(err) {
		r.markDown(err)
		return
	}
	now := r.monoMicros()
	last := r.lastErrLog.Load()
	if now-last >= int64(time.Second/time.Microsecond) && r.lastErrLog.CompareAndSwap(last, now) {
		r.logger.Error("limiter: redis rejected a decision; deciding per the limit's failure mode", "err", err)
	}
}

// isRedisTrouble reports whether err means Redis is unreachable, too slow or unable
// to serve, rather than an error reply about one command.
func isRedisTrouble(err error) bool {
	if errors.Is(err, errReply) || errors.Is(err, errClosed) {
		return false
	}
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return true // network, timeout, pool, closed client
	}
	for _, prefix := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "BUSY", "TRYAGAIN", "NOREPLICAS"} {
		if redis.HasErrorPrefix(err, prefix) {
			return true
		}
	}
	return false
}

// markDown records that Redis failed: decisions fall back until a probe finds it again.
func (r *Store) markDown(err error) {
	if r.down.Load() {
		return
	}
	r.lifecycle.Lock()
	defer r.lifecycle.Unlock()
	if r.closed || !r.down.CompareAndSwap(false, true) {
		return
	}
	r.logger.Warn("limiter: redis is down; deciding per each limit's failure mode until it answers", "err", err)
	r.wg.Add(1)
	go r.probe()
}

// probe PINGs Redis with exponential backoff until it answers, then sends decisions
// back to it.
func (r *Store) probe() {
	defer r.wg.Done()
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(r.probeMin),
		backoff.WithMaxInterval(r.probeMax),
		backoff.WithMaxElapsedTime(0),
	)
	started := time.Now()
	t := time.NewTimer(b.NextBackOff())
	defer t.Stop()
	for attempts := 1; ; attempts++ {
		select {
		case <-r.quit:
			return
		case <-t.C:
		}
		if err := r.ping(); err == nil {
			r.down.Store(false)
			r.logger.Info("limiter: redis is back; deciding with redis again",
				"down_for", time.Since(started).Round(time.Millisecond), "probes", attempts)
			return
		}
		t.Reset(b.NextBackOff())
	}
}

// ping checks that Redis answers within the store's timeout.
func (r *Store) ping() error {
	ctx, cancel := context.WithTimeout(context.Background(), max(r.timeout, 100*time.Millisecond))
	defer cancel()
	return r.Ping(ctx)
}

// Ping checks that Redis answers: every master of a Cluster. It is bounded by ctx's
// deadline when the client honours it (ContextTimeoutEnabled). It does not change
// whether decisions fall back (see Down).
func (r *Store) Ping(ctx context.Context) error {
	if c, ok := r.client.(*redis.ClusterClient); ok {
		return c.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.Ping(ctx).Err()
		})
	}
	return r.client.Ping(ctx).Err()
}
