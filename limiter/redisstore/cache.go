package redisstore

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// The over-limit cache. When Redis rejects a request with a finite retry-after, and
// the algorithm records nothing for a rejected request (every algorithm but the
// sliding log without ForgiveRejected), the cache keeps a copy of the key's state as
// the script left it, until the retry-after has passed. A later request on the key
// is decided on that copy, with the algorithms' own code (limiter/internal/algo): if
// the copy rejects it, that rejection is the answer, without a round trip; if it
// would allow it, Redis decides. So the cache only ever rejects, and rejects exactly what Redis
// would reject, with the same remaining, retry-after and reset, as long as no other
// process changes the key meanwhile (if one does, it can only have used more quota:
// the rejection stays right, its numbers may be a little optimistic).
//
// Each cached rejection updates the copy as Redis would have (the latest time seen;
// the buckets' level, drained to that time). With an injected clock the next request
// sent to Redis carries that back: its time is clamped to the latest the key has
// seen, and a bucket's level and time replace those in Redis if Redis still holds
// what the cache copied (a compare-and-set in the script). Decisions are then the
// ones the memory store makes, to the microsecond. With Redis server time, the copy
// runs on the server's time as estimated from the local monotonic clock: the
// script's time plus the time elapsed since the request was sent, never behind the
// server's, so the estimate errs on the side of allowing (which goes to Redis).
//
// The cache is bounded: sharded maps of at most size entries in all; a full shard
// drops expired entries, or one entry, before adding one.
type overLimitCache struct {
	injected bool // times are the injected clock's, not Redis server time
	perShard int
	seed     maphash.Seed
	shards   [cacheShards]cacheShard
	mono     func() int64
}

const cacheShards = 32

// sampleSize is how many entries a full shard inspects for expiry before evicting one.
const sampleSize = 8

type cacheShard struct {
	mu sync.Mutex
	m  map[string]*cacheEntry
	_  [40]byte
}

type cacheEntry struct {
	algorithm algo.Algo
	st        algo.State // buckets and windows; st.last for every algorithm
	log       partialLog // sliding log with ForgiveRejected
	until     int64      // µs; from then on, ask Redis again

	// Injected clock, buckets: the state Redis holds, and whether st has moved on
	// from it (see writeBack).
	redisLast  int64
	redisLevel float64
	dirty      bool

	// Redis server time: the script's time, and the local monotonic time when the
	// request was sent.
	serverAt, sentAt int64
}

// writeBack is what a request sent to Redis carries from the cache (injected clock).
type writeBack struct {
	seen     bool  // the cache knows the key
	last     int64 // latest time the key has seen in-process
	bucket   bool  // replace the bucket's (casLast, casLevel) in Redis by (last, level)
	casLast  int64
	casLevel float64
	level    float64
}

func newOverLimitCache(size int, injected bool) *overLimitCache {
	c := &overLimitCache{
		injected: injected,
		perShard: max(size/cacheShards, 1),
		seed:     maphash.MakeSeed(),
		mono:     func() int64 { return time.Since(monoBase).Microseconds() },
	}
	for i := range c.shards {
		c.shards[i].m = make(map[string]*cacheEntry)
	}
	return c
}

func (c *overLimitCache) shard(key string) *cacheShard {
	return &c.shards[maphash.String(c.seed, key)%cacheShards]
}

// decide answers a request on rkey from the cache when it can (hit: a rejection).
// now is the injected clock's time (unused with Redis server time). On a miss it
// returns what the request must carry to Redis.
func (c *overLimitCache) decide(rkey string, p *algo.Params, n, now int64) (algo.Outcome, bool, writeBack) {
	sh := c.shard(rkey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[rkey]
	if e == nil {
		return algo.Outcome{}, false, writeBack{}
	}
	var wb writeBack
	if c.injected {
		wb = writeBack{seen: true, last: e.st.Last}
		if e.dirty {
			wb.bucket, wb.casLast, wb.casLevel, wb.level = true, e.redisLast, e.redisLevel, e.st.Level
		}
	} else {
		now = e.serverAt + c.mono() - e.sentAt
	}
	if e.algorithm != p.Algorithm || max(now, e.st.Last) >= e.until {
		return algo.Outcome{}, false, wb
	}
	if p.Algorithm == algo.SlidingWindowLog {
		if !p.Forgive {
			return algo.Outcome{}, false, wb
		}
		o, ok := e.log.decide(&e.st.Last, p, now, n)
		return o, ok, wb
	}
	st := e.st
	o := st.Decide(p, now, n, nil)
	if o.Allowed {
		return algo.Outcome{}, false, wb
	}
	e.st = st
	e.dirty = p.Algorithm.Bucket()
	return o, true, wb
}

// update records Redis' answer to a request on rkey.
func (c *overLimitCache) update(rkey string, p *algo.Params, req *redisRequest) {
	rep := &req.reply
	cacheable := !rep.o.Allowed && rep.o.RetryAfter > 0
	var level float64
	switch p.Algorithm {
	case algo.TokenBucket, algo.LeakyBucket:
		cacheable = cacheable && rep.hasLevel
		level = rep.level
	case algo.SlidingWindowLog:
		cacheable = cacheable && p.Forgive && rep.hasLog
	}
	sh := c.shard(rkey)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[rkey]
	if !cacheable {
		// Redis knows everything the entry knew: the request carried it.
		if e != nil {
			delete(sh.m, rkey)
		}
		return
	}
	if e == nil {
		if len(sh.m) >= c.perShard {
			c.evict(sh, rep.now)
		}
		e = &cacheEntry{}
		sh.m[rkey] = e
	}
	e.algorithm = p.Algorithm
	e.st = algo.State{Last: rep.now, Level: level, Start: rep.start, Count: rep.count}
	if p.Algorithm == algo.SlidingWindowCounter {
		e.st.Level = float64(rep.prev) // where State keeps the previous window's count
	}
	if p.Algorithm == algo.SlidingWindowLog {
		e.log.set(rep.head[:rep.nhead], rep.logSize, rep.newest)
	}
	e.until = rep.now + rep.o.RetryAfter
	e.redisLast, e.redisLevel, e.dirty = rep.now, level, false
	e.serverAt, e.sentAt = rep.now, req.sent
}

// evict makes room in sh, whose lock is held: among a few entries, those past their
// time go; if none is, the first one does.
func (c *overLimitCache) evict(sh *cacheShard, now int64) {
	seen, freed := 0, false
	var first string
	mono := c.mono()
	for k, e := range sh.m {
		t := now
		if !c.injected {
			t = e.serverAt + mono - e.sentAt
		}
		if max(t, e.st.Last) >= e.until {
			delete(sh.m, k)
			freed = true
		} else if first == "" {
			first = k
		}
		if seen++; seen == sampleSize {
			break
		}
	}
	if !freed && first != "" {
		delete(sh.m, first)
	}
}

// partialLog is what the cache knows of a sliding log: its oldest timestamps (head),
// how many follow them (rest, all at or after head's last), and the newest.
type partialLog struct {
	head   []int64
	rest   int64
	newest int64
}

func (l *partialLog) set(head []int64, size, newest int64) {
	l.head = append(l.head[:0], head...)
	l.rest = size - int64(len(head))
	l.newest = newest
}

// decide is algo.State.slidingLog for a forgiving log, on what the cache knows of it: ok
// is false when the request would be allowed or the answer needs timestamps the
// cache does not have.
func (l *partialLog) decide(last *int64, p *algo.Params, now, n int64) (algo.Outcome, bool) {
	now = max(now, *last)
	cutoff := now - p.Period
	i := 0
	for i < len(l.head) && l.head[i] <= cutoff {
		i++
	}
	head := l.head[i:]
	if len(head) == 0 && l.rest > 0 {
		return algo.Outcome{}, false // which of the rest have expired is unknown
	}
	size := int64(len(head)) + l.rest
	if size+n <= p.Rate {
		return algo.Outcome{}, false
	}
	o := algo.Outcome{Remaining: max(p.Rate-size, 0)}
	if n > p.Rate {
		o.RetryAfter = algo.Never
	} else {
		idx := size + n - p.Rate - 1
		if idx >= int64(len(head)) {
			return algo.Outcome{}, false
		}
		o.RetryAfter = head[idx] + p.Period - now
	}
	if size > 0 {
		o.ResetAfter = l.newest + p.Period - now
	}
	*last = now
	l.head = l.head[:copy(l.head, head)]
	return o, true
}
