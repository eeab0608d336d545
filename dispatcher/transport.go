package dispatcher

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
)

// PacingTransport is an http.RoundTripper for programs that call a rate-limited API
// (typically a paid third party): requests leave evenly at a fixed rate, and a 429 or
// 503 answer with Retry-After pauses every later request until then.
//
// In-process it uses a Pacer, with the same guarantee: in any interval Δt at most
// ceil(rate × Δt) + 1 requests start. With WithRedisPacing the rate is shared by every
// process using the same Redis key: a Lua script hands out the next start time
// atomically on Redis server time, so replicas need no clock agreement. Each process
// then sleeps until its slot; the slots obey the bound, the actual starts add the
// round trip's jitter. If Redis cannot be reached the request fails (nothing is sent):
// pacing is a contract with the remote side, so the transport fails closed.
//
// A 429 or 503 answer: the Retry-After (seconds or HTTP-date; missing or unusable: 1s,
// capped at 1h by default) pauses all subsequent requests of this transport — and of
// every process sharing the Redis key. The request is then retried after the pause if
// its body can be replayed (no body, or Request.GetBody set, as http.NewRequest does for
// in-memory bodies), up to the retry limit and within the request context's deadline;
// otherwise the 429/503 response is returned.
type PacingTransport struct {
	base         http.RoundTripper
	pacer        *Pacer
	clock        Clock
	redis        redis.UniversalClient
	key          string
	interval     float64 // µs
	tolerance    float64 // µs
	retries      int
	defaultPause time.Duration
	maxPause     time.Duration
}

// TransportOption configures a PacingTransport.
type TransportOption func(*PacingTransport)

// WithRedisPacing shares the rate through Redis under key, with every transport (in
// any process) configured with the same key and rate. The key holds one string with a
// TTL; hash-tag it for Redis Cluster if it must sit next to other keys.
func WithRedisPacing(client redis.UniversalClient, key string) TransportOption {
	return func(t *PacingTransport) { t.redis, t.key = client, key }
}

// WithRetryLimit sets how many times a request answered 429/503 is retried after the
// pause (default 3; 0 returns the first 429/503).
func WithRetryLimit(n int) TransportOption { return func(t *PacingTransport) { t.retries = n } }

// WithTransportPause sets the pause for a 429/503 without a usable Retry-After
// (default 1s) and the longest pause a Retry-After may impose (default 1h).
func WithTransportPause(def, maxPause time.Duration) TransportOption {
	return func(t *PacingTransport) { t.defaultPause, t.maxPause = def, maxPause }
}

// WithTransportClock sets the clock (default SystemClock).
func WithTransportClock(c Clock) TransportOption { return func(t *PacingTransport) { t.clock = c } }

// NewPacingTransport paces requests sent through base (http.DefaultTransport when nil)
// at rate, which must be valid.
func NewPacingTransport(base http.RoundTripper, rate limiter.Rate, opts ...TransportOption) *PacingTransport {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &PacingTransport{base: base, clock: SystemClock{}, retries: 3, defaultPause: time.Second, maxPause: time.Hour}
	for _, o := range opts {
		o(t)
	}
	t.pacer = NewPacer(rate, WithClock(t.clock))
	iv := float64(rate.Period) / float64(rate.Count) / 1e3
	t.interval = iv
	t.tolerance = math.Min(iv/2, float64(DefaultTolerance)/1e3)
	return t
}

// Pacer returns the in-process pacer (used without Redis, and for pauses).
func (t *PacingTransport) Pacer() *Pacer { return t.pacer }

// RoundTrip implements http.RoundTripper.
func (t *PacingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
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
		resp, err := t.base.RoundTrip(r)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode != http.StatusTooManyRequests && resp.StatusCode != http.StatusServiceUnavailable {
			return resp, nil
		}
		now := t.clock.Now()
		pause, ok := parseRetryAfter(resp.Header, now)
		if !ok || pause <= 0 {
			pause = t.defaultPause
		}
		pause = min(pause, t.maxPause)
		until := now.Add(pause)
		t.pause(ctx, pause, until)
		if attempt >= t.retries || !replayable {
			return resp, nil
		}
		if dl, ok := ctx.Deadline(); ok && dl.Before(until) {
			return resp, nil
		}
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		_ = resp.Body.Close()
	}
}

func (t *PacingTransport) wait(ctx context.Context) error {
	if t.redis == nil {
		_, err := t.pacer.Wait(ctx)
		return err
	}
	// A pause learnt in this process holds even before Redis has it.
	if d := t.pacer.PausedUntil().Sub(t.clock.Now()); d > 0 {
		if err := t.clock.Sleep(ctx, d); err != nil {
			return err
		}
	}
	waitUS, err := reserveSlotScript.Run(ctx, t.redis, []string{t.key},
		fmt.Sprintf("%.3f", t.interval), fmt.Sprintf("%.3f", t.tolerance)).Int64()
	if err != nil {
		return fmt.Errorf("dispatcher: shared pacer in Redis: %w", err)
	}
	return t.clock.Sleep(ctx, time.Duration(waitUS)*time.Microsecond)
}

func (t *PacingTransport) pause(ctx context.Context, pause time.Duration, until time.Time) {
	t.pacer.PauseUntil(until)
	if t.redis == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = pauseScript.Run(ctx, t.redis, []string{t.key}, pause.Microseconds()).Err()
}

// reserveSlotScript hands out the next start time of a pacer shared through Redis,
// atomically and on Redis server time. The key holds the next free slot in µs since
// the epoch. A slot late by more than the tolerance is not caught up: the schedule
// restarts at now − tolerance (the same rule as Pacer).
//
// KEYS[1] pacer key; ARGV[1] interval µs (fractional); ARGV[2] tolerance µs.
// Returns how long the caller waits for its slot, in whole µs (0: start now).
var reserveSlotScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tol = tonumber(ARGV[2])
local slot = tonumber(redis.call('GET', KEYS[1]) or '0')
if slot < now - tol then
  slot = now - tol
end
local nxt = slot + interval
redis.call('SET', KEYS[1], string.format('%.3f', nxt), 'PX', math.ceil((nxt - now) / 1000) + 60000)
local wait = slot - now
if wait < 0 then
  wait = 0
end
return math.ceil(wait)
`)

// pauseScript holds every start of a shared pacer for a while (never shortening an
// earlier pause). KEYS[1] pacer key; ARGV[1] pause in µs.
var pauseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local untilus = now + tonumber(ARGV[1])
local slot = tonumber(redis.call('GET', KEYS[1]) or '0')
if untilus > slot then
  redis.call('SET', KEYS[1], string.format('%.3f', untilus), 'PX', math.ceil((untilus - now) / 1000) + 60000)
end
return 1
`)
