// Package redisstore is sluice's Redis limiter store: a limiter.Limiter whose state is
// shared by every replica that uses the same Redis, deciding as the memory store does
// to the microsecond. It lives apart from package limiter so that a program on the
// memory store alone links no Redis client.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Store is a limiter.Limiter shared by every replica that uses the same Redis (standalone,
// Sentinel or Cluster, through go-redis' universal client).
//
// Each decision is one atomic Lua script (EVALSHA, reloaded on NOSCRIPT) on one
// hash-tagged key, so it works on Redis Cluster, and takes one round trip:
// concurrent decisions are coalesced into pipelines by a few worker goroutines, and
// on a standalone or Sentinel client the decisions of a pipeline that share a script
// share one EVALSHA too (see scripts.go).
// Every key has a TTL, so idle keys vanish (the scripts set it on every write, or on
// Redis 7.0 and later keep one that is long enough with SET's KEEPTTL). Time is the
// Redis server's (TIME inside
// the script) unless WithClock injects a clock; either way each key keeps the
// latest time it has seen, so a clock that steps backwards never grants quota.
//
// Keys are "<prefix>{<key>}:<algorithm>", the algorithm written tb, lb, fw, swl or
// swc (the sliding log has a second key, with ":t" appended). With the algorithm in
// the name, two limits with different algorithms on one key keep separate state
// (where the memory store starts the key afresh) and never meet a key of the wrong
// type. Keys that are empty, start with '~' or contain '}' are escaped inside the
// braces, so the braces always hold the whole key.
//
// A rejection with a finite retry-after is remembered in-process (see
// WithOverLimitCache), so a key that keeps asking while over its limit is answered
// without Redis, with the decision Redis would give.
//
// AllowN never fails because of Redis: every Redis call is bounded by a timeout
// (WithTimeout), and when Redis fails or is too slow the decision follows the
// limit's FailureMode: FailLocal (the default) decides with an in-process Memory
// store and the same limit, FailOpen allows, FailClosed rejects with a RetryAfter of
// one second. After a failure, Redis is considered down: decisions fall back without
// waiting for it while a background probe PINGs it with exponential backoff, and go
// back to Redis when it answers. Every fallback is counted (Fallbacks, and the
// Prometheus counter sluice_limiter_fallback_total{mode} when WithRegisterer is
// given). AllowN's only errors are about invalid input (ErrInvalidLimit).
//
// Close stops the workers; it does not close the Redis client.
type Store struct {
	client  redis.UniversalClient
	prefix  string
	clock   func() time.Time // nil: Redis server time
	timeout time.Duration
	grace   int64 // ms added to every TTL
	logger  *slog.Logger

	queue    chan *redisRequest
	quit     chan struct{}
	wg       sync.WaitGroup
	workers  int
	batch    int
	reqs     sync.Pool
	direct   bool         // a lone caller may call Redis itself
	merge    bool         // one script may make the decisions of several keys
	inflight atomic.Int32 // decisions waiting for Redis, when direct

	cache *overLimitCache // nil when disabled
	local *limiter.Memory // FailLocal's store

	lifecycle sync.Mutex // guards closed and starting the probe
	closed    bool
	stopped   atomic.Bool // closed, for the hot path
	down      atomic.Bool
	probeMin  time.Duration
	probeMax  time.Duration

	fallbacks     atomic.Int64
	cacheHits     atomic.Int64
	fallbackTotal map[limiter.FailureMode]prometheus.Counter
	lastErrLog    atomic.Int64 // mono µs of the last logged script error
}

// Option configures a Redis store.
type Option func(*config)

type config struct {
	clock      func() time.Time
	prefix     string
	timeout    time.Duration
	cacheSize  int
	registerer prometheus.Registerer
	logger     *slog.Logger
	workers    int
	batch      int
	probeMin   time.Duration
	probeMax   time.Duration
	grace      time.Duration
}

// WithClock makes the scripts use clock's time (to the microsecond) instead of
// the Redis server's TIME. Replicas then need synchronized clocks; the conformance
// suite and simulations use it to run deterministically. TTLs still run on Redis'
// own clock, so the default key grace becomes one minute (see WithKeyGrace): an
// injected clock may run slower than real time, and a key must not vanish before
// its state, on the injected clock, is a fresh key's.
func WithClock(clock func() time.Time) Option {
	return func(c *config) { c.clock = clock }
}

// WithKeyPrefix sets the prefix of every Redis key (default "sluice:"). It must not
// contain '{' or '}', which would break the keys' hash tags.
func WithKeyPrefix(prefix string) Option {
	return func(c *config) { c.prefix = prefix }
}

// WithTimeout bounds each decision's wait for Redis (default 50ms); past it the
// decision falls back (see Store).
func WithTimeout(d time.Duration) Option {
	return func(c *config) { c.timeout = d }
}

// WithOverLimitCache sets how many rejected keys are remembered in-process
// (default 100,000); 0 turns the cache off.
func WithOverLimitCache(keys int) Option {
	return func(c *config) { c.cacheSize = keys }
}

// WithRegisterer registers the store's metrics (sluice_limiter_fallback_total)
// on reg. Without it, they are kept but not registered anywhere.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(c *config) { c.registerer = reg }
}

// WithLogger sets the logger of Redis state changes (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(c *config) { c.logger = l }
}

// WithWorkers sets how many pipelines may be in flight at once (default 4: while
// some are answered, others fill up). Fewer mean larger pipelines, but callers then
// wait for a worker: on two cores with 64 callers, 4 workers made 20% more decisions
// a second than 2, at less CPU a decision, and 8 no more than 4
// (deploy/figures/README.md). A lone caller waits for none when the client bounds
// its calls by their context's deadline: it calls Redis itself.
func WithWorkers(n int) Option {
	return func(c *config) { c.workers = n }
}

// WithBatch sets the most decisions sent in one pipeline (default 128).
func WithBatch(n int) Option {
	return func(c *config) { c.batch = n }
}

// WithProbeBackoff sets the exponential backoff of the probe that watches a
// failed Redis: the first and the longest wait (default 50ms and 5s).
func WithProbeBackoff(initial, maximum time.Duration) Option {
	return func(c *config) { c.probeMin, c.probeMax = initial, maximum }
}

// WithKeyGrace sets how long a key at least outlives the moment its state becomes a
// fresh key's (default 1s; one minute with WithClock): the latest time seen by the
// key is kept that long, so a clock stepping back by less than that is still clamped.
// On the server's clock and Redis 7.0 or later a key may live longer (see scripts.go:
// a TTL is set a quarter longer than needed, and kept while long enough).
func WithKeyGrace(d time.Duration) Option {
	return func(c *config) { c.grace = d }
}

// closedRetryAfter is the RetryAfter of FailClosed decisions.
const closedRetryAfter = time.Second

// ErrInvalidOption: New was given an option value it cannot work with.
var ErrInvalidOption = errors.New("redisstore: invalid option")

// New returns a store over client and starts its workers; Close stops them. A bad
// option value is an error (ErrInvalidOption), never a silent default.
//
// Give it a client with ContextTimeoutEnabled: its calls are then bounded by the
// store's timeout, and a caller alone with Redis calls it directly instead of
// handing its decision to a worker. Without it, callers still stop waiting at the
// timeout, but a worker may stay blocked until the client's ReadTimeout.
func New(client redis.UniversalClient, opts ...Option) (*Store, error) {
	cfg := config{
		prefix:    "sluice:",
		timeout:   50 * time.Millisecond,
		cacheSize: 100_000,
		workers:   4,
		batch:     128,
		probeMin:  50 * time.Millisecond,
		probeMax:  5 * time.Second,
		grace:     -1,
		logger:    slog.Default(),
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.grace < 0 {
		cfg.grace = time.Second
		if cfg.clock != nil {
			cfg.grace = time.Minute
		}
	}
	switch {
	case client == nil:
		return nil, fmt.Errorf("%w: no client", ErrInvalidOption)
	case strings.ContainsAny(cfg.prefix, "{}"):
		// Braces would move keys out of their hash slot.
		return nil, fmt.Errorf("%w: WithKeyPrefix %q: the prefix must not contain '{' or '}'", ErrInvalidOption, cfg.prefix)
	case cfg.workers < 1 || cfg.batch < 1:
		return nil, fmt.Errorf("%w: WithWorkers %d and WithBatch %d must be at least 1", ErrInvalidOption, cfg.workers, cfg.batch)
	case cfg.timeout <= 0:
		return nil, fmt.Errorf("%w: WithTimeout %s must be positive", ErrInvalidOption, cfg.timeout)
	case cfg.logger == nil:
		return nil, fmt.Errorf("%w: WithLogger(nil)", ErrInvalidOption)
	}
	r := &Store{
		client:   client,
		prefix:   cfg.prefix,
		clock:    cfg.clock,
		timeout:  cfg.timeout,
		grace:    max(cfg.grace.Milliseconds(), 0),
		logger:   cfg.logger,
		queue:    make(chan *redisRequest, cfg.workers*cfg.batch*2),
		quit:     make(chan struct{}),
		workers:  cfg.workers,
		batch:    cfg.batch,
		probeMin: cfg.probeMin,
		probeMax: cfg.probeMax,
	}
	r.reqs.New = func() any { return newRedisRequest() }
	r.direct = contextDeadlines(client)
	// A standalone or Sentinel client sends a script with several keys to the one
	// server; a Cluster client (or a Ring) would need them in one slot (or shard).
	_, r.merge = client.(*redis.Client)
	if cfg.cacheSize > 0 {
		r.cache = newOverLimitCache(cfg.cacheSize, cfg.clock != nil)
	}
	memOpts := []limiter.MemoryOption{limiter.WithMaxKeys(100_000)}
	if cfg.clock != nil {
		memOpts = append(memOpts, limiter.WithClock(cfg.clock))
	}
	r.local = limiter.NewMemory(memOpts...)
	if err := r.initMetrics(cfg.registerer); err != nil {
		return nil, err
	}
	for range r.workers {
		r.wg.Add(1)
		go r.worker()
	}
	return r, nil
}

// Close stops the workers and the probe. Decisions after Close fall back as if Redis
// were down. Close does not close the Redis client.
func (r *Store) Close() error {
	r.lifecycle.Lock()
	if r.closed {
		r.lifecycle.Unlock()
		return nil
	}
	r.closed = true
	r.stopped.Store(true)
	close(r.quit)
	r.lifecycle.Unlock()
	r.wg.Wait()
	return nil
}

// Fallbacks returns how many decisions were made without Redis because it failed,
// was too slow or was down.
func (r *Store) Fallbacks() int64 { return r.fallbacks.Load() }

// CacheHits returns how many decisions the over-limit cache made without Redis.
func (r *Store) CacheHits() int64 { return r.cacheHits.Load() }

// Down reports whether Redis is considered down (decisions fall back).
func (r *Store) Down() bool { return r.down.Load() }

// AllowN implements Limiter. It returns an error only for an invalid limit or n < 1;
// Redis trouble is handled by the limit's FailureMode (see Store).
func (r *Store) AllowN(ctx context.Context, key string, l limiter.Limit, n int64) (limiter.Decision, error) {
	var p algo.Params
	if err := l.ValidateRequest(n); err != nil {
		return limiter.Decision{}, err
	}
	p.Set(string(l.Algorithm), l.Rate, l.Period, l.Burst, l.ForgiveRejected, n)
	// Any n above the capacity gets the same decision; this keeps n below 2^53.
	sent := min(n, p.Capacity+1)
	rkey := r.key(key, p.Algorithm)

	var now int64
	if r.clock != nil {
		now = r.clock().UnixMicro()
	}
	var wb writeBack
	if r.cache != nil {
		o, hit, w := r.cache.decide(rkey, &p, sent, now)
		if hit {
			r.cacheHits.Add(1)
			return decision(o, p.Capacity), nil
		}
		wb = w
	}
	if r.down.Load() || r.stopped.Load() {
		return r.fallback(ctx, rkey, l, n), nil
	}

	req := r.reqs.Get().(*redisRequest)
	req.prepare(r, rkey, &p, sent, now, &wb)
	if r.direct && r.inflight.Add(1) == 1 {
		// Nobody else is waiting for Redis: no pipeline to share, so skip the
		// hand-over to a worker. The client honours the context's deadline.
		r.execute(ctx, req.alone(), nil)
		r.inflight.Add(-1)
		defer r.reqs.Put(req)
		if req.err != nil {
			if ctx.Err() == nil {
				r.failed(req.err)
			}
			return r.fallback(ctx, rkey, l, n), nil
		}
		return r.answer(rkey, &p, req), nil
	} else if r.direct {
		defer r.inflight.Add(-1)
	}
	req.timer.Reset(r.timeout)
	select {
	case r.queue <- req: // a free place, the common case: no wait, and no select's cost
	default:
		select {
		case r.queue <- req:
		case <-req.timer.C:
			r.reqs.Put(req)
			r.markDown(errQueueTimeout)
			return r.fallback(ctx, rkey, l, n), nil
		case <-ctx.Done():
			req.timer.Stop()
			r.reqs.Put(req)
			return r.fallback(ctx, rkey, l, n), nil
		case <-r.quit:
			req.timer.Stop()
			r.reqs.Put(req)
			return r.fallback(ctx, rkey, l, n), nil
		}
	}
	select {
	case <-req.done:
	case <-req.timer.C:
		if req.abandon() {
			r.markDown(errTimeout)
			return r.fallback(ctx, rkey, l, n), nil
		}
		<-req.done
	case <-ctx.Done():
		req.timer.Stop() // before abandoning: an abandoned request belongs to its worker
		if req.abandon() {
			return r.fallback(ctx, rkey, l, n), nil
		}
		<-req.done
	}
	req.timer.Stop()
	defer r.reqs.Put(req)
	if req.err != nil {
		r.failed(req.err)
		return r.fallback(ctx, rkey, l, n), nil
	}
	return r.answer(rkey, &p, req), nil
}

// answer turns Redis' reply to req into the decision, and tells the cache.
func (r *Store) answer(rkey string, p *algo.Params, req *redisRequest) limiter.Decision {
	if r.cache != nil {
		r.cache.update(rkey, p, req)
	}
	return decision(req.reply.o, p.Capacity)
}

// decision is o as a limiter.Decision.
func decision(o algo.Outcome, capacity int64) limiter.Decision {
	return limiter.Decision{
		Allowed:    o.Allowed,
		Limit:      capacity,
		Remaining:  o.Remaining,
		RetryAfter: algo.Duration(o.RetryAfter),
		ResetAfter: algo.Duration(o.ResetAfter),
	}
}

// contextDeadlines reports whether client bounds its calls by their context's
// deadline, which calling it directly from AllowN needs.
func contextDeadlines(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

var (
	errTimeout      = errors.New("redis did not answer within the timeout")
	errQueueTimeout = errors.New("redis workers busy past the timeout")
	errClosed       = errors.New("limiter closed")
	errReply        = errors.New("unexpected reply from a limiter script")
)

// key returns the Redis key of key under algorithm a.
func (r *Store) key(key string, a algo.Algo) string {
	var suffix string
	switch a {
	case algo.TokenBucket:
		suffix = "tb"
	case algo.LeakyBucket:
		suffix = "lb"
	case algo.FixedWindow:
		suffix = "fw"
	case algo.SlidingWindowLog:
		suffix = "swl"
	case algo.SlidingWindowCounter:
		suffix = "swc"
	}
	b := make([]byte, 0, len(r.prefix)+len(key)+len(suffix)+6)
	b = append(b, r.prefix...)
	b = append(b, '{')
	b = appendHashTag(b, key)
	b = append(b, '}', ':')
	b = append(b, suffix...)
	return string(b)
}

// appendHashTag appends key as it goes between the braces of a hash tag: unchanged,
// unless it is empty, starts with '~' or contains '}' (which would end the tag
// early or make it empty, so the keys of one decision could land in different
// Cluster slots). Those keys become '~' followed by the key with '~' written "~~"
// and '}' written "~)", so distinct keys always give distinct tags.
func appendHashTag(b []byte, key string) []byte {
	if key != "" && key[0] != '~' && strings.IndexByte(key, '}') < 0 {
		return append(b, key...)
	}
	b = append(b, '~')
	for i := 0; i < len(key); i++ {
		switch key[i] {
		case '~':
			b = append(b, '~', '~')
		case '}':
			b = append(b, '~', ')')
		default:
			b = append(b, key[i])
		}
	}
	return b
}

// scriptOf returns the script of algorithm a.
func scriptOf(a algo.Algo) *script {
	switch a {
	case algo.TokenBucket, algo.LeakyBucket:
		return bucketScript
	case algo.FixedWindow:
		return fixedWindowScript
	case algo.SlidingWindowLog:
		return slidingLogScript
	default:
		return slidingCounterScript
	}
}

// redisReply is a script's answer.
type redisReply struct {
	o   algo.Outcome
	now int64 // the script's time, µs, after clamping

	// State after a rejection, for the over-limit cache.
	level    float64 // buckets
	hasLevel bool
	start    int64 // windows
	count    int64
	prev     int64
	logSize  int64 // sliding log
	newest   int64
	head     [logPrefix]int64
	nhead    int
	hasLog   bool
}

// parse reads the reply of one decision: packed little-endian doubles (see
// scripts.go), every one an integer but the bucket's level.
func (rep *redisReply) parse(a algo.Algo, v any) error {
	s, ok := v.(string)
	if !ok || len(s) < 5*8 || len(s)%8 != 0 {
		return errReply
	}
	num := func(i int) float64 { return math.Float64frombits(littleEndian64(s[8*i:])) }
	integer := func(i int) int64 { return int64(num(i)) }
	rep.o = algo.Outcome{Allowed: num(0) == 1, Remaining: integer(1), RetryAfter: algo.Micros(num(2)), ResetAfter: algo.Micros(num(3))}
	rep.now = integer(4)
	rep.hasLevel, rep.hasLog, rep.nhead = false, false, 0
	extra := len(s)/8 - 5 // after a rejection: the state the cache needs
	switch a {
	case algo.TokenBucket, algo.LeakyBucket:
		if extra > 0 {
			rep.level, rep.hasLevel = num(5), true
		}
	case algo.FixedWindow:
		if extra > 0 {
			if extra < 2 {
				return errReply
			}
			rep.start, rep.count = integer(5), integer(6)
		}
	case algo.SlidingWindowCounter:
		if extra > 0 {
			if extra < 3 {
				return errReply
			}
			rep.start, rep.count, rep.prev = integer(5), integer(6), integer(7)
		}
	case algo.SlidingWindowLog:
		if extra >= 2 {
			rep.hasLog = true
			rep.logSize, rep.newest = integer(5), integer(6)
			for i := 7; i < 5+extra && rep.nhead < logPrefix; i++ {
				rep.head[rep.nhead] = integer(i)
				rep.nhead++
			}
		}
	}
	return nil
}

// littleEndian64 reads 8 bytes of s as a little-endian uint64.
func littleEndian64(s string) uint64 {
	_ = s[7]
	return uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 |
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56
}

// redisRequest is one decision on its way through a worker. Requests are pooled.
type redisRequest struct {
	script *script
	alg    algo.Algo
	keys   [2]string
	nkeys  int
	args   [1]any     // see scripts.go
	params packedArgs // args[0]
	// args holds a pointer to params, which go-redis writes without allocating.

	sent  int64 // mono µs when its pipeline was sent
	reply redisReply
	err   error

	state atomic.Int32 // requestPending, requestDone, requestAbandoned
	done  chan struct{}
	timer *time.Timer
	owner *Store
	self  [1]*redisRequest
	call  [1]redisCall // the request alone, for direct calls
}

const (
	requestPending int32 = iota
	requestDone
	requestAbandoned
)

func newRedisRequest() *redisRequest {
	t := time.NewTimer(time.Hour)
	t.Stop()
	req := &redisRequest{done: make(chan struct{}, 1), timer: t}
	req.self[0] = req
	req.args[0] = &req.params
	return req
}

// alone returns the call of req alone.
func (req *redisRequest) alone() []redisCall {
	req.call[0] = redisCall{script: req.script, reqs: req.self[:], keys: req.keys[:req.nkeys], args: req.args[:]}
	return req.call[:]
}

// prepare fills req for one decision.
func (req *redisRequest) prepare(r *Store, rkey string, p *algo.Params, n, now int64, wb *writeBack) {
	req.owner = r
	req.script = scriptOf(p.Algorithm)
	req.alg = p.Algorithm
	req.err = nil
	req.state.Store(requestPending)
	req.keys[0] = rkey
	req.nkeys = 1
	if p.Algorithm == algo.SlidingWindowLog {
		req.keys[1] = rkey + ":t"
		req.nkeys = 2
	}
	var forgive float64
	if p.Forgive {
		forgive = 1
	}
	pa := &req.params
	pa.reset()
	pa.add(float64(n))
	pa.add(float64(p.Rate))
	pa.add(float64(p.Period))
	pa.add(float64(p.Capacity))
	pa.add(float64(r.grace))
	pa.add(forgive)
	if r.clock == nil {
		return
	}
	if wb.seen && wb.last > now {
		now = wb.last // the latest time the key has seen in-process
	}
	pa.add(float64(now))
	if wb.bucket && p.Algorithm.Bucket() {
		pa.add(float64(wb.casLast))
		pa.add(wb.casLevel)
		pa.add(float64(wb.last))
		pa.add(wb.level)
	}
}

// abandon gives the request up; false means its answer has arrived meanwhile. An
// abandoned request is put back in the pool by its worker.
func (req *redisRequest) abandon() bool {
	return req.state.CompareAndSwap(requestPending, requestAbandoned)
}

// finish hands the request back to its caller, or to the pool if the caller gave up.
func (req *redisRequest) finish() {
	if req.state.CompareAndSwap(requestPending, requestDone) {
		req.done <- struct{}{}
		return
	}
	req.owner.reqs.Put(req)
}

// fallback decides without Redis, per l.FailureMode, and counts it.
func (r *Store) fallback(ctx context.Context, rkey string, l limiter.Limit, n int64) limiter.Decision {
	mode := l.FailureMode
	if mode == "" {
		mode = limiter.FailLocal
	}
	r.fallbacks.Add(1)
	r.fallbackTotal[mode].Inc()
	capacity := l.Capacity()
	switch mode {
	case limiter.FailOpen:
		return limiter.Decision{Allowed: true, Limit: capacity, Remaining: max(capacity-n, 0)}
	case limiter.FailClosed:
		retry := closedRetryAfter
		if n > capacity {
			retry = limiter.Never
		}
		return limiter.Decision{Limit: capacity, RetryAfter: retry, ResetAfter: closedRetryAfter}
	default:
		d, _ := r.local.AllowN(ctx, rkey, l, n)
		return d
	}
}
