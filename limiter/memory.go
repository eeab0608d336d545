package limiter

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"
)

// Memory is an in-process store. Keys are spread over shards, each with its own lock;
// a decision on a key that is already tracked allocates nothing. Memory is bounded: a
// key whose state has gone back to a fresh key's is dropped when new keys arrive, and
// beyond MaxKeys the key closest to fresh is evicted (which forgets its history).
type Memory struct {
	seed   maphash.Seed
	shards []memoryShard
	mask   uint64
	now    func() int64 // µs since the Unix epoch
	perCap int          // keys per shard

	evictions atomic.Int64
}

type memoryShard struct {
	mu   sync.Mutex
	keys map[string]*entry
	_    [40]byte // keep neighbouring shards' locks off one cache line
}

type entry struct {
	algorithm Algorithm
	state
}

// MemoryOption configures a Memory store.
type MemoryOption func(*memoryConfig)

type memoryConfig struct {
	clock   func() time.Time
	maxKeys int
	shards  int
}

// WithClock makes the store read time from clock instead of the system's monotonic clock.
func WithClock(clock func() time.Time) MemoryOption {
	return func(c *memoryConfig) { c.clock = clock }
}

// WithMaxKeys caps the number of keys tracked (default 1,000,000).
func WithMaxKeys(n int) MemoryOption {
	return func(c *memoryConfig) { c.maxKeys = n }
}

// WithShards sets the number of shards, rounded up to a power of two (default 64).
func WithShards(n int) MemoryOption {
	return func(c *memoryConfig) { c.shards = n }
}

// sampleSize is how many keys an insertion inspects for expiry or eviction.
const sampleSize = 8

// NewMemory returns an empty memory store.
func NewMemory(opts ...MemoryOption) *Memory {
	cfg := memoryConfig{maxKeys: 1_000_000, shards: 64}
	for _, o := range opts {
		o(&cfg)
	}
	shards := 1
	for shards < cfg.shards {
		shards *= 2
	}
	m := &Memory{
		seed:   maphash.MakeSeed(),
		shards: make([]memoryShard, shards),
		mask:   uint64(shards - 1),
		perCap: max(cfg.maxKeys/shards, 1),
	}
	for i := range m.shards {
		m.shards[i].keys = make(map[string]*entry)
	}
	if cfg.clock != nil {
		m.now = func() int64 { return cfg.clock().UnixMicro() }
	} else {
		m.now = monotonicMicros()
	}
	return m
}

// monotonicMicros reads the wall clock once and then advances it by the monotonic
// clock, which is cheaper to read than time.Now and never steps.
func monotonicMicros() func() int64 {
	base := time.Now()
	baseMicros := base.UnixMicro()
	return func() int64 { return baseMicros + time.Since(base).Microseconds() }
}

// AllowN implements Limiter. It returns an error only for an invalid limit or n < 1.
func (m *Memory) AllowN(_ context.Context, key string, l Limit, n int64) (Decision, error) {
	if err := checkRequest(l, n); err != nil {
		return Decision{}, err
	}
	p := paramsOf(l)
	// Any n above the capacity gets the same decision; capping it keeps the
	// algorithms' sums from overflowing (the Redis store does the same).
	return m.decide(key, &p, min(n, p.capacity+1)).decision(p.capacity), nil
}

func checkRequest(l Limit, n int64) error {
	if n < 1 {
		return fmt.Errorf("%w: n must be at least 1, got %d", ErrInvalidLimit, n)
	}
	return l.Validate()
}

func (m *Memory) decide(key string, p *params, n int64) outcome {
	now := m.now()
	sh := &m.shards[maphash.String(m.seed, key)&m.mask]
	sh.mu.Lock()
	e := sh.keys[key]
	if e == nil {
		e = m.insert(sh, key, now)
	}
	if e.algorithm != p.algorithm {
		e.algorithm, e.state = p.algorithm, state{}
	}
	o := e.decide(p, now, n)
	sh.mu.Unlock()
	return o
}

// insert adds key to sh, whose lock is held. Like Redis' expiry, it inspects a few
// keys: those whose state is fresh again are dropped, and if the shard is full the one
// that becomes fresh soonest is evicted.
func (m *Memory) insert(sh *memoryShard, key string, now int64) *entry {
	var victim string
	victimExpires, seen := int64(0), 0
	for k, e := range sh.keys {
		if e.expires <= now {
			delete(sh.keys, k)
		} else if victim == "" || e.expires < victimExpires {
			victim, victimExpires = k, e.expires
		}
		if seen++; seen == sampleSize {
			break
		}
	}
	if len(sh.keys) >= m.perCap && victim != "" {
		delete(sh.keys, victim)
		m.evictions.Add(1)
	}
	e := &entry{}
	sh.keys[key] = e
	return e
}

// Len returns the number of keys tracked.
func (m *Memory) Len() int {
	total := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		total += len(sh.keys)
		sh.mu.Unlock()
	}
	return total
}

// Evictions returns how many keys were evicted because the store was full.
func (m *Memory) Evictions() int64 { return m.evictions.Load() }
