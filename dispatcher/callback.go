package dispatcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// CallbackPolicy is how completion callbacks are sent (see queue.Callback): each POST
// bounded by Timeout, retried after failures (no answer, or anything but 2xx) with
// Backoff (a receiver's Retry-After on 429/503 when longer) until MaxAttempts, then
// given up and counted. Workers callbacks are sent at once per dispatcher, so a slow
// receiver holds up only its own.
type CallbackPolicy struct {
	Timeout     time.Duration
	MaxAttempts int
	Backoff     queueconfig.Backoff
	Workers     int
}

// DefaultCallbackPolicy retries for about a day: 5s doubling to 2h, 20 attempts.
var DefaultCallbackPolicy = CallbackPolicy{
	Timeout:     10 * time.Second,
	MaxAttempts: 20,
	Backoff:     queueconfig.Backoff{Initial: 5 * time.Second, Max: 2 * time.Hour},
	Workers:     8,
}

// WithCallbackPolicy sets how completion callbacks are sent (default
// DefaultCallbackPolicy).
func WithCallbackPolicy(p CallbackPolicy) Option { return func(o *options) { o.callbacks = p } }

func (p CallbackPolicy) validate() error {
	if p.Timeout <= 0 || p.MaxAttempts < 1 || p.Workers < 1 || p.Backoff.Initial <= 0 || p.Backoff.Max < p.Backoff.Initial {
		return errors.New("dispatcher: callback policy needs a positive timeout, backoff (max ≥ initial), attempts and workers")
	}
	return nil
}

// runCallbacks sends completion callbacks until ctx ends. Only queues that declare
// callback_hosts have any: until one does (a reload may add them), it only looks every
// second. The consumer is shared with every other dispatcher.
func (d *Dispatcher) runCallbacks(ctx context.Context) {
	p := d.opts.callbacks
	for !d.anyCallbacks() {
		if d.opts.clock.Sleep(ctx, time.Second) != nil {
			return
		}
	}
	var cc *queue.CallbackConsumer
	for attempt := 1; cc == nil; attempt++ {
		var err error
		if cc, err = d.store.CallbackConsumer(ctx, p.Timeout+5*time.Second, p.Workers); err != nil {
			if ctx.Err() != nil {
				return // stopping
			}
			d.log.Warn("callbacks: cannot reach the callback stream; retrying", "err", err)
			if d.opts.clock.Sleep(ctx, retryDelay(queueconfig.Backoff{Initial: time.Second, Max: 30 * time.Second}, attempt)) != nil {
				return
			}
		}
	}
	var wg sync.WaitGroup
	for range p.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				cb, err := cc.Next(ctx, 5*time.Second)
				switch {
				case errors.Is(err, queue.ErrDropped):
					d.metrics.callbacks.WithLabelValues("", "dropped").Inc()
					d.log.Warn("callback dropped", "err", err)
				case err != nil:
					if d.opts.clock.Sleep(ctx, time.Second) != nil {
						return
					}
				case cb != nil:
					d.sendCallback(ctx, cb)
				}
			}
		}()
	}
	wg.Wait()
}

// sendCallback makes one attempt and settles the callback by its outcome.
func (d *Dispatcher) sendCallback(ctx context.Context, cb *queue.Callback) {
	p := d.opts.callbacks
	status, wait, err := d.postCallback(ctx, cb)
	count := func(outcome string) { d.metrics.callbacks.WithLabelValues(cb.Queue, outcome).Inc() }
	if err == nil && status/100 == 2 {
		_ = cb.Done()
		count("delivered")
		return
	}
	if ctx.Err() != nil {
		_ = cb.Retry(time.Millisecond) // stopping: another dispatcher takes it
		return
	}
	why := fmt.Sprintf("receiver answered %d", status)
	if err != nil {
		why = err.Error()
	}
	if cb.Attempt >= p.MaxAttempts {
		_ = cb.Drop(fmt.Sprintf("gave up after %d attempts: %s", cb.Attempt, why))
		count("failed")
		d.log.Warn("callback given up", "queue", cb.Queue, "id", cb.ID, "attempts", cb.Attempt, "last", why)
		return
	}
	_ = cb.Retry(max(retryDelay(p.Backoff, cb.Attempt), min(wait, d.opts.maxPause)))
	count("retried")
	d.log.Debug("callback to be retried", "queue", cb.Queue, "id", cb.ID, "attempt", cb.Attempt, "why", why)
}

// postCallback POSTs cb signed now; it returns the status and a Retry-After (0 when none).
func (d *Dispatcher) postCallback(ctx context.Context, cb *queue.Callback) (int, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, d.opts.callbacks.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, cb.URL, bytes.NewReader(cb.Body))
	if err != nil {
		return 0, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "sluice-callback")
	cb.Secret.SetHeaders(req.Header, cb.ID, d.opts.clock.Now(), cb.Body)
	resp, err := d.client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // lets the connection be reused
	var wait time.Duration
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		wait, _ = pace.RetryAfter(resp.Header, d.opts.clock.Now())
	}
	return resp.StatusCode, wait, nil
}

// anyCallbacks reports whether a queue of the store takes completion callbacks.
func (d *Dispatcher) anyCallbacks() bool {
	for _, q := range d.store.Queues() {
		if len(q.Config().CallbackHosts) > 0 {
			return true
		}
	}
	return false
}
