package dispatcher

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// CallbackPolicy is how completion callbacks are sent (see queue.Callback): each POST
// bounded by Timeout, retried after failures (no answer, or anything but 2xx) with
// Backoff (a receiver's Retry-After on 429/503 when longer) until MaxAttempts, then
// given up and counted. A callback waiting for its retry is a stored job, not one of
// the Workers: Workers callbacks are sent at once per dispatcher, and one receiver
// (a URL's host:port) gets at most PerHost of them; a callback fetched while its
// receiver has that many goes back untried for about a second. HostFailures attempts
// in a row that fail at one receiver make it cool down: its callbacks go back untried
// until the cool-down ends (Backoff, growing with each further failure), then one
// attempt probes it; the first success ends the streak. So a receiver that fails or
// never answers costs at most PerHost senders, and its callbacks none of their
// attempts while it cools.
type CallbackPolicy struct {
	Timeout     time.Duration
	MaxAttempts int
	Backoff     queueconfig.Backoff
	Workers     int
	// PerHost is the attempts at once to one receiver; 0 means Workers/4, at least 1.
	PerHost int
	// HostFailures is the failures in a row that make a receiver cool down; 0 means 5.
	HostFailures int
}

// DefaultCallbackPolicy retries for about a day: 5s doubling to 2h, 20 attempts; 2 of
// the 8 senders at most for one receiver, which cools down after 5 failures in a row.
var DefaultCallbackPolicy = CallbackPolicy{
	Timeout:      10 * time.Second,
	MaxAttempts:  20,
	Backoff:      queueconfig.Backoff{Initial: 5 * time.Second, Max: 2 * time.Hour},
	Workers:      8,
	PerHost:      2,
	HostFailures: 5,
}

// WithCallbackPolicy sets how completion callbacks are sent (default
// DefaultCallbackPolicy).
func WithCallbackPolicy(p CallbackPolicy) Option { return func(o *options) { o.callbacks = p } }

func (p CallbackPolicy) validate() error {
	if p.Timeout <= 0 || p.MaxAttempts < 1 || p.Workers < 1 || p.Backoff.Initial <= 0 || p.Backoff.Max < p.Backoff.Initial ||
		p.PerHost < 0 || p.HostFailures < 0 {
		return errors.New("dispatcher: callback policy needs a positive timeout, backoff (max ≥ initial), attempts and workers, and no negative per-host limits")
	}
	return nil
}

// withDefaults fills in PerHost and HostFailures.
func (p CallbackPolicy) withDefaults() CallbackPolicy {
	if p.PerHost == 0 {
		p.PerHost = max(1, p.Workers/4)
	}
	if p.HostFailures == 0 {
		p.HostFailures = 5
	}
	return p
}

// hostBudget is what a dispatcher's senders may still spend on each receiver: the
// attempts under way and the failures in a row (see CallbackPolicy).
type hostBudget struct {
	p     CallbackPolicy
	mu    sync.Mutex
	hosts map[string]*hostState
}

type hostState struct {
	busy   int
	streak int       // failed attempts in a row
	until  time.Time // end of the cool-down, while streak ≥ HostFailures
}

// take reserves an attempt at host now, or says until when the callback should go back.
func (b *hostBudget) take(host string, now time.Time) (ok bool, retry time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hosts[host]
	if h == nil {
		h = &hostState{}
		b.hosts[host] = h
	}
	switch {
	case now.Before(h.until):
		// Spread the returns just after its end, not all at once.
		rem := h.until.Sub(now)
		return false, h.until.Add(retryDelay(queueconfig.Backoff{Initial: max(rem/4, time.Millisecond), Max: max(rem/2, time.Millisecond)}, 1))
	case h.busy >= b.p.PerHost || h.streak >= b.p.HostFailures && h.busy > 0:
		// At its share, or cooled down with its one probe under way.
		return false, now.Add(retryDelay(queueconfig.Backoff{Initial: time.Second, Max: 2 * time.Second}, 1))
	}
	h.busy++
	return true, time.Time{}
}

// done returns the attempt take reserved, and whether it failed.
func (b *hostBudget) done(host string, failed bool, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h := b.hosts[host]
	h.busy--
	if !failed {
		h.streak, h.until = 0, time.Time{}
	} else if h.streak++; h.streak >= b.p.HostFailures {
		h.until = now.Add(retryDelay(b.p.Backoff, h.streak-b.p.HostFailures+1))
	}
	if h.busy == 0 && h.streak == 0 {
		delete(b.hosts, host) // the map holds only the receivers in trouble or in use
	}
}

// runCallbacks sends completion callbacks until ctx ends. Only queues that declare
// callback_hosts have any: until one does (a reload may add them), it only looks every
// second. The consumer is shared with every other dispatcher.
func (d *Dispatcher) runCallbacks(ctx context.Context) {
	p := d.opts.callbacks.withDefaults()
	for !d.anyCallbacks() {
		if d.opts.clock.Sleep(ctx, time.Second) != nil {
			return
		}
	}
	var cc *queue.CallbackConsumer
	for attempt := 1; cc == nil; attempt++ {
		var err error
		if cc, err = d.store.CallbackConsumer(ctx, p.Timeout+5*time.Second); err != nil {
			if ctx.Err() != nil {
				return // stopping
			}
			d.log.Warn("callbacks: cannot reach the callback stream; retrying", "err", err)
			if d.opts.clock.Sleep(ctx, retryDelay(queueconfig.Backoff{Initial: time.Second, Max: 30 * time.Second}, attempt)) != nil {
				return
			}
		}
	}
	budget := &hostBudget{p: p, hosts: map[string]*hostState{}}
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
					d.sendCallback(ctx, p, budget, cb)
				}
			}
		}()
	}
	wg.Wait()
}

// sendCallback makes one attempt, when the callback is due and its receiver has budget
// left, and settles the callback by its outcome.
func (d *Dispatcher) sendCallback(ctx context.Context, p CallbackPolicy, budget *hostBudget, cb *queue.Callback) {
	now := d.opts.clock.Now()
	if now.Before(cb.Due) {
		_ = cb.Wait(cb.Due.Sub(now))
		return
	}
	count := func(outcome string) { d.metrics.callbacks.WithLabelValues(cb.Queue, outcome).Inc() }
	host := callbackHost(cb.URL)
	if ok, retry := budget.take(host, now); !ok {
		_ = cb.Defer(ctx, retry)
		count("deferred")
		return
	}
	status, wait, err := d.postCallback(ctx, cb)
	budget.done(host, err != nil || status/100 != 2, d.opts.clock.Now())
	if err == nil && status/100 == 2 {
		_ = cb.Done()
		count("delivered")
		return
	}
	if ctx.Err() != nil {
		_ = cb.Wait(time.Millisecond) // stopping: another dispatcher takes it
		return
	}
	why := fmt.Sprintf("receiver answered %d", status)
	if err != nil {
		why = err.Error()
	}
	if errors.Is(err, ErrCallbackAddress) {
		// The operator's to fix (the name's DNS, or callback_private): say so each time.
		d.log.Warn("callback refused: its host resolves to an address its queue may not reach (see callback_private)", "queue", cb.Queue, "id", cb.ID, "err", err)
	}
	if cb.Attempt >= p.MaxAttempts {
		_ = cb.Drop(fmt.Sprintf("gave up after %d attempts: %s", cb.Attempt, why))
		count("failed")
		d.log.Warn("callback given up", "queue", cb.Queue, "id", cb.ID, "attempts", cb.Attempt, "last", why)
		return
	}
	_ = cb.Retry(ctx, d.opts.clock.Now().Add(max(retryDelay(p.Backoff, cb.Attempt), min(wait, d.opts.maxPause))))
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
	client := d.callbackClient
	if cb.Private {
		client = d.privateCallbackClient
	}
	resp, err := client.Do(req)
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

// callbackHost is the receiver of a callback URL, its host[:port] in lower case as the
// queue's callback_hosts match it.
func callbackHost(raw string) string {
	if u, err := url.Parse(raw); err == nil {
		return strings.ToLower(u.Host)
	}
	return raw
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
