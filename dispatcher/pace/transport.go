package pace

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// Transport is an http.RoundTripper for programs that call a rate-limited API
// (typically a paid third party): requests leave evenly at a fixed rate, slow down
// when the API reports its quota running low, and pause when it answers 429 or 503.
//
// Pacing. In-process the transport uses a Pacer, with the same guarantee: in any
// interval Δt at most ceil(rate × Δt) + 1 requests start. With WithShared the starts
// come from a schedule shared by every process using it (pace/redispace keeps one in
// Redis); a pause or a spread learnt in this process still holds here first. If the
// shared schedule cannot be reached the request fails and nothing is sent: pacing is
// a contract with the remote side, so the transport fails closed.
//
// Adapting to the answers. After every response the transport reads the quota the API
// reports (ParseQuota: draft RateLimit / RateLimit-Policy, X-RateLimit-Remaining /
// X-RateLimit-Reset) and hands it to the pacer's Spread: with nothing remaining every
// request waits for the reset; with fewer remaining than the rate would spend before
// the reset, the remaining requests are spread evenly until then. Requests that are
// already in flight are not subtracted from what the API reports, so with many
// concurrent requests the last of a window can still meet a 429. The wait is capped
// like a Retry-After (WithTransportPause), so a misread reset cannot stall the client
// for longer than that.
//
// A 429 or 503 answer: the Retry-After (seconds or HTTP-date; missing or unusable: the
// default pause, 1s; capped at 1h) pauses all subsequent requests of this transport —
// and of every process sharing the schedule — the longer pause winning when the quota
// already asked for one. The request is then retried after the pause if its body can
// be replayed (no body, or Request.GetBody set, as http.NewRequest does for in-memory
// bodies), up to the retry limit and within the request context's deadline; otherwise
// the 429/503 response is returned.
//
// Every request that reaches the API took a slot: the transport sends each one
// through SendOnce, so net/http does not send it again on its own when the connection
// fails unanswered. The transport does instead, at the next slot and within the retry
// limit, for a request net/http would have sent again: a body it can replay, and an
// idempotent method (GET, HEAD, OPTIONS, TRACE) or an Idempotency-Key; for others the
// failure is returned.
type Transport struct {
	base         http.RoundTripper
	pacer        *Pacer
	clock        Clock
	shared       Shared
	sharedNil    bool // WithShared(nil), refused
	retries      int
	defaultPause time.Duration
	maxPause     time.Duration
}

// Shared is a schedule of starts shared by several processes, so that together they
// keep to a rate. pace/redispace implements it on Redis; the plain program does not
// link a Redis client.
type Shared interface {
	// Reserve takes the next start on the shared schedule, one interval of rate after
	// the previous start of any process, and returns how long the caller must wait
	// for it (≤ 0: start now). An error means no start was taken.
	Reserve(ctx context.Context, rate limiter.Rate) (time.Duration, error)
	// Pause holds every start on the shared schedule for d from now; it never
	// shortens an earlier pause.
	Pause(ctx context.Context, d time.Duration) error
}

// TransportOption configures a Transport.
type TransportOption func(*Transport)

// WithShared paces the transport on a schedule shared with other processes instead of
// its own pacer alone (see Transport).
func WithShared(s Shared) TransportOption {
	return func(t *Transport) { t.shared, t.sharedNil = s, s == nil }
}

// WithRetryLimit sets how many times a request answered 429/503 is retried after the
// pause (default 3; 0 returns the first 429/503).
func WithRetryLimit(n int) TransportOption { return func(t *Transport) { t.retries = n } }

// WithTransportPause sets the pause for a 429/503 without a usable Retry-After
// (default 1s) and the longest pause a Retry-After or a reported quota may impose
// (default 1h).
func WithTransportPause(def, maxPause time.Duration) TransportOption {
	return func(t *Transport) { t.defaultPause, t.maxPause = def, maxPause }
}

// WithTransportClock sets the clock (default SystemClock).
func WithTransportClock(c Clock) TransportOption { return func(t *Transport) { t.clock = c } }

// NewTransport paces requests sent through base (http.DefaultTransport when nil) at
// rate. It fails with ErrInvalidOption for a rate that is not positive, a negative
// retry limit, pauses that are not positive (or a default above the maximum), a nil
// clock or a nil shared schedule.
func NewTransport(base http.RoundTripper, rate limiter.Rate, opts ...TransportOption) (*Transport, error) {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, clock: SystemClock{}, retries: 3, defaultPause: time.Second, maxPause: time.Hour}
	for _, o := range opts {
		o(t)
	}
	switch {
	case t.retries < 0:
		return nil, fmt.Errorf("%w: negative retry limit %d", ErrInvalidOption, t.retries)
	case t.defaultPause <= 0 || t.maxPause <= 0 || t.defaultPause > t.maxPause:
		return nil, fmt.Errorf("%w: pauses %s (default) and %s (maximum) must be positive, the default at most the maximum",
			ErrInvalidOption, t.defaultPause, t.maxPause)
	case t.clock == nil:
		return nil, fmt.Errorf("%w: nil clock", ErrInvalidOption)
	case t.sharedNil:
		return nil, fmt.Errorf("%w: WithShared(nil)", ErrInvalidOption)
	}
	p, err := New(rate, WithClock(t.clock))
	if err != nil {
		return nil, err
	}
	t.pacer = p
	return t, nil
}

// Pacer returns the transport's pacer: it paces the requests without WithShared, and
// holds the pauses and spreads learnt from the answers in every case.
func (t *Transport) Pacer() *Pacer { return t.pacer }

// RoundTrip implements http.RoundTripper.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	for attempt := 0; ; attempt++ {
		if err := t.wait(ctx); err != nil {
			if attempt == 0 && req.Body != nil {
				_ = req.Body.Close()
			}
			return nil, err
		}
		r := req
		if attempt > 0 {
			r = req.Clone(ctx)
			if req.GetBody != nil {
				body, err := req.GetBody()
				if err != nil {
					return nil, err
				}
				r.Body = body
			}
		}
		resp, err := t.base.RoundTrip(SendOnce(r))
		if err != nil {
			// What net/http would have sent again on its own (see SendOnce) is sent
			// again here, at a slot of its own.
			if attempt < t.retries && replayable && idempotentRequest(req) && ctx.Err() == nil && droppedUnanswered(err) {
				continue
			}
			return nil, err
		}
		now := t.clock.Now()
		t.adapt(ctx, resp.Header, now)
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			return resp, nil
		}
		pause, ok := RetryAfter(resp.Header, now)
		if !ok || pause <= 0 {
			pause = t.defaultPause
		}
		t.pause(ctx, now, min(pause, t.maxPause))
		if attempt >= t.retries || !replayable {
			return resp, nil
		}
		if dl, ok := ctx.Deadline(); ok && dl.Before(t.pacer.PausedUntil()) {
			return resp, nil
		}
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}
}

// adapt hands the quota a response reports to the pacer (see Transport).
func (t *Transport) adapt(ctx context.Context, h http.Header, now time.Time) {
	q, ok := ParseQuota(h, now)
	if !ok {
		return
	}
	reset := min(q.Reset, t.maxPause)
	if q.Remaining == 0 {
		t.pause(ctx, now, reset)
		return
	}
	t.pacer.Spread(q.Remaining, now.Add(reset))
}

func (t *Transport) wait(ctx context.Context) error {
	if t.shared == nil {
		return t.pacer.Wait(ctx)
	}
	// A pause learnt in this process holds even before the shared schedule has it.
	if d := t.pacer.PausedUntil().Sub(t.clock.Now()); d > 0 {
		if err := t.clock.Sleep(ctx, d); err != nil {
			return err
		}
	}
	d, err := t.shared.Reserve(ctx, t.pacer.rateAt(t.clock.Now()))
	if err != nil {
		return fmt.Errorf("pace: shared schedule: %w", err)
	}
	return t.clock.Sleep(ctx, d)
}

// pause holds every request for d from now, here and on the shared schedule.
func (t *Transport) pause(ctx context.Context, now time.Time, d time.Duration) {
	t.pacer.PauseUntil(now.Add(d))
	if t.shared == nil {
		return
	}
	// The pause must reach the others even when this request's context has ended.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	// A failure is not the request's: the pause holds in this process, and the next
	// Reserve fails closed if the schedule is really gone.
	_ = t.shared.Pause(ctx, d)
}
