package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Memory is an in-process store. Keys are spread over shards; a decision on a key that
// is already tracked allocates nothing and takes no shard lock. Memory is bounded: a
// key whose state has gone back to a fresh key's is dropped when new keys arrive, and
// beyond MaxKeys the key closest to fresh is evicted (which forgets its history).
//
// Each shard is an open-addressing hash table (linear probing) whose slots hold the
// key's state inline, one cache line per key: with many keys, a decision costs one
// cache miss for its state, where a Go map of pointers costs three or four (bucket,
// key bytes, state). The tables hold no pointers, so the garbage collector does not
// scan them, and the keys themselves are not kept: a slot holds two independent
// hashes of its key, 87 bits in all that must match (see slot).
//
// A hot key is the common case (a global limit, "all orders"), so a decision on a
// tracked key touches that key's cache line and nothing else that other callers
// write: it finds the key without the shard's lock and takes the slot's own lock,
// which lives in the same line (see slot), makes the decision and releases it. Every
// write to a slot is made under its lock, so a decision that holds the lock and finds
// its key's identity still there decides on the key's only copy of its state. What
// changes the table (inserting, dropping or moving keys, growing it, a key changing
// algorithm) takes the shard's lock as well, and a decision that meets any of it
// half-way (an empty or moved slot, an identity gone) is made under the shard's lock
// instead, which is always right. The sliding window log, whose timestamps live in
// the shard, is always decided under the shard's lock.
//
// Tried and dropped (measured in deploy/figures/README.md): a decision packed into
// one 64-bit word (the token bucket's state is a float64 level and a time in µs, 128
// bits, and the Redis scripts compute the same doubles, so packing it would change
// decisions); a bucket's two words changed by one 128-bit compare-and-swap
// (CMPXCHG16B, in assembly), slower than the slot lock with two callers on one key,
// and bimodal from run to run, the two cores redoing decisions on one line; the
// hashes of a few hot keys remembered in the store, which saved a hot key about 6ns
// of hashing but cost 100k keys with two callers about 40ns a decision, its entries
// being small objects that every decision reads and that may share a cache line with
// whatever the allocator puts beside them. The slot lock costs one compare-and-swap
// and one atomic add on the key's line, as a compare-and-swap loop would, and keeps
// every algorithm exact.
type Memory struct {
	seed      maphash.Seed // the key's hash: shard, slot and identity
	checkSeed maphash.Seed // the key's second hash: identity
	shards    []memoryShard
	shift     uint         // a hash's shard is hash >> shift
	now       func() int64 // µs since the Unix epoch
	perCap    int          // keys per shard

	evictions atomic.Int64
}

type memoryShard struct {
	mu    sync.Mutex
	table []slot                 // a power of two of slots, at most 13/16 used; nil until the first key
	fast  atomic.Pointer[[]slot] // table, for the decisions that do not take mu
	used  int

	logs     []algo.TimeLog // sliding window logs, by slot.log-1
	freeLogs []int32        // indices of unused logs

	_ [32]byte // keep neighbouring shards' locks off one cache line
}

// slot is one key of a shard's table: 64 bytes, aligned to a cache line (tables are
// allocated as powers of two of slots, which Go aligns to their size up to a page).
//
// A key is known by its hash h (64 bits, from which its shard and home slot derive)
// and a 32-bit check from a second, independently seeded hash. The low byte of h is
// replaced by the key's algorithm, so 56 bits of h and the 32 of the check must
// match: 88 bits of two hashes whose seeds are random per store and never leave the
// process. Two distinct keys are mistaken for one another only if they agree on all
// of them, a chance of 2^-88 (3·10^-27) per slot compared; a lookup compares a few
// slots, so a store making a million decisions a second for a century would mistake
// two keys with a probability of about 10^-10, far below that of a memory error. The
// seeds are what keeps clients from steering keys into one another, as they do for
// Go's own maps.
//
// mu is the slot's lock. id is read without the shard's lock by decisions looking
// their key up, so it is read and written atomically; everything in a slot is
// written only under mu, and what moves keys also holds the shard's lock. A
// sync.Mutex rather than a spin lock: callers hammering one key then take turns in
// runs (a waiter parks, the holder keeps the line in its cache), where a spin lock
// hands the line from core to core at every decision, which measured slower than
// x/time/rate's one mutex.
type slot struct {
	mu         sync.Mutex
	id         uint64 // the key's hash with its algorithm in the low byte; 0: an empty slot
	check      uint32 // the key's second hash
	log        int32  // sliding window log: 1 + its index in the shard's logs; 0: none
	algo.State        // 40 bytes
}

// lockKey locks s if it holds the key of this id and check, and reports whether it
// did.
func (s *slot) lockKey(id uint64, check uint32) bool {
	s.mu.Lock()
	if atomic.LoadUint64(&s.id) == id && s.check == check {
		return true
	}
	s.mu.Unlock()
	return false // moved, dropped or replaced meanwhile
}

// setID sets the id of s, which is locked.
func (s *slot) setID(id uint64) { atomic.StoreUint64(&s.id, id) }

const idMask = ^uint64(0xff) // the bits of a slot's id that come from the key's hash

func (s *slot) algorithm() algo.Algo { return algo.Algo(s.id) }

// home is the slot where probing for hash h starts, in a table of mask+1 slots.
func home(h, mask uint64) uint64 { return (h >> 8) & mask }

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

// WithMaxKeys caps the number of keys tracked (default 1,000,000): a new key in a full
// shard evicts the sampled key whose state becomes fresh soonest.
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
		seed:      maphash.MakeSeed(),
		checkSeed: maphash.MakeSeed(),
		shards:    make([]memoryShard, shards),
		shift:     uint(64 - bits.TrailingZeros(uint(shards))),
		perCap:    max(cfg.maxKeys/shards, 1),
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
func (m *Memory) AllowN(_ context.Context, key string, l Limit, n int64) (d Decision, err error) {
	var p algo.Params
	if err = paramsOf(&p, &l, n); err != nil {
		return d, err
	}
	// Any n above the capacity gets the same decision; capping it keeps the
	// algorithms' sums from overflowing (the Redis store does the same).
	fill(&d, m.decide(key, &p, min(n, p.Capacity+1)), p.Capacity)
	return d, nil
}

// paramsOf checks a request of n units under l and sets p to l's params.
func paramsOf(p *algo.Params, l *Limit, n int64) error {
	if !p.Set(string(l.Algorithm), l.Rate, l.Period, l.Burst, l.ForgiveRejected, n) || !l.FailureMode.known() {
		return l.ValidateRequest(n)
	}
	return nil
}

// fill sets d to o. Writing a Decision field by field spares the hot path a copy of
// the whole struct, whose wide loads stall on the narrow stores that built it.
func fill(d *Decision, o algo.Outcome, capacity int64) {
	d.Allowed = o.Allowed
	d.Limit = capacity
	d.Remaining = o.Remaining
	d.RetryAfter = algo.Duration(o.RetryAfter)
	d.ResetAfter = algo.Duration(o.ResetAfter)
}

func (m *Memory) decide(key string, p *algo.Params, n int64) algo.Outcome {
	h := maphash.String(m.seed, key)
	check := uint32(maphash.String(m.checkSeed, key))
	now := m.now()
	sh := &m.shards[h>>m.shift] // a shift by 64 (one shard) gives 0
	if p.Algorithm != algo.SlidingWindowLog {
		var o algo.Outcome
		if sh.decideTracked(&o, h&idMask|uint64(p.Algorithm), check, p, now, n) {
			return o
		}
	}
	sh.mu.Lock()
	var s *slot
	if i := sh.find(h, check); i >= 0 {
		s = &sh.table[i]
	} else {
		s = m.insert(sh, h, check, p.Algorithm, now)
	}
	s.mu.Lock()
	if s.algorithm() != p.Algorithm {
		sh.freeLog(s)
		s.setID(h&idMask | uint64(p.Algorithm))
		s.State = algo.State{}
	}
	var log *algo.TimeLog
	if p.Algorithm == algo.SlidingWindowLog {
		log = sh.logOf(s)
	}
	o := s.Decide(p, now, n, log)
	s.mu.Unlock()
	sh.mu.Unlock()
	return o
}

// decideTracked makes the decision into o without the shard's lock if the key whose
// id (hash and algorithm) and check are given is in the table, and reports whether
// it did; false sends the decision to the shard's lock, for a new key, another
// algorithm, or a table changing under the lookup.
func (sh *memoryShard) decideTracked(o *algo.Outcome, id uint64, check uint32, p *algo.Params, now, n int64) bool {
	t := sh.fast.Load()
	if t == nil {
		return false
	}
	table := *t
	mask := uint64(len(table) - 1)
	for i := home(id, mask); ; i = (i + 1) & mask {
		s := &table[i]
		switch atomic.LoadUint64(&s.id) {
		case 0:
			return false // a table always has empty slots
		case id:
			// Moving a key away clears or changes its id under the slot's lock.
			if !s.lockKey(id, check) {
				return false
			}
			*o = s.Decide(p, now, n, nil)
			s.mu.Unlock()
			return true
		}
	}
}

// find returns the index of the key with hash h and check, or -1. The shard's lock
// is held: ids change only under it.
func (sh *memoryShard) find(h uint64, check uint32) int {
	if len(sh.table) == 0 {
		return -1
	}
	mask := uint64(len(sh.table) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &sh.table[i]
		if s.id == 0 {
			return -1 // a table always has empty slots
		}
		if (s.id^h)&idMask == 0 && s.check == check {
			return int(i)
		}
	}
}

// insert adds the key with hash h and check to sh, whose lock is held, with algorithm
// a and an empty state. Like Redis' expiry, it first inspects a few keys (those from
// the key's home slot on, which the lookup has just brought into the cache): those
// whose state is fresh again are dropped, and if the shard is full the one that
// becomes fresh soonest is evicted.
func (m *Memory) insert(sh *memoryShard, h uint64, check uint32, a algo.Algo, now int64) *slot {
	if sh.used > 0 {
		type ref struct {
			id    uint64
			check uint32
		}
		var expired [sampleSize]ref
		var victim, busy ref
		nexpired, victimExpires := 0, int64(0)
		mask := uint64(len(sh.table) - 1)
		i, seen := home(h, mask), 0
		for range sh.table {
			if s := &sh.table[i]; s.id != 0 {
				// A slot locked by a decision is in use: neither fresh nor a victim.
				if s.mu.TryLock() {
					expires := s.Expires
					s.mu.Unlock()
					if expires <= now {
						expired[nexpired] = ref{s.id, s.check}
						nexpired++
					} else if victim.id == 0 || expires < victimExpires {
						victim, victimExpires = ref{s.id, s.check}, expires
					}
				} else if busy.id == 0 {
					busy = ref{s.id, s.check}
				}
				if seen++; seen == sampleSize {
					break
				}
			}
			i = (i + 1) & mask
		}
		for _, r := range expired[:nexpired] {
			sh.remove(r.id, r.check, now)
		}
		if victim.id == 0 {
			// Every key sampled is being decided: evict one all the same (remove waits
			// for its decision; a decision never waits for the shard lock), or the cap
			// would not hold.
			victim = busy
		}
		if sh.used >= m.perCap && victim.id != 0 && sh.remove(victim.id, victim.check, math.MaxInt64) {
			m.evictions.Add(1)
		}
	}
	if (sh.used+1)*16 > len(sh.table)*13 {
		sh.grow()
	}
	sh.used++
	s := place(sh.table, h&idMask|uint64(a), check)
	s.mu.Unlock()
	return s
}

// place takes the first empty slot of table from the home of id, locks it, gives it
// id and check and returns it, for the caller to fill and unlock.
func place(table []slot, id uint64, check uint32) *slot {
	mask := uint64(len(table) - 1)
	i := home(id, mask)
	for table[i].id != 0 {
		i = (i + 1) & mask
	}
	s := &table[i]
	s.mu.Lock()
	s.check = check
	s.setID(id)
	return s
}

// moveTo moves the key of s, which is locked, to d, which is locked and empty, and
// leaves d locked.
func (s *slot) moveTo(d *slot) {
	d.check, d.log, d.State = s.check, s.log, s.State
	d.setID(s.id)
}

// grow doubles the table (or makes the first one). Each key moves under its old slot's
// lock, which it leaves empty: a decision that still looks in the old table finds
// nothing there and goes to the shard's lock.
func (sh *memoryShard) grow() {
	old := sh.table
	table := make([]slot, max(2*len(old), 8))
	for i := range old {
		if s := &old[i]; s.id != 0 {
			s.mu.Lock()
			d := place(table, s.id, s.check)
			s.moveTo(d)
			d.mu.Unlock()
			s.setID(0)
			s.mu.Unlock()
		}
	}
	sh.table = table
	sh.fast.Store(&table)
}

// remove deletes the key with this id (hash bits) and check if it is present and its
// state is fresh by time freshBy (math.MaxInt64: whatever its state), and reports
// whether it did. The state is looked at under the slot's lock: a decision that does
// not take the shard's lock may have changed it since the caller inspected it, and
// dropping a state that a decision has changed would forget that decision. The slots
// after it move back (backward-shift deletion), so the table needs no tombstones.
func (sh *memoryShard) remove(id uint64, check uint32, freshBy int64) bool {
	i := sh.find(id, check)
	if i < 0 {
		return false
	}
	s := &sh.table[i]
	s.mu.Lock()
	if s.Expires > freshBy {
		s.mu.Unlock()
		return false
	}
	sh.freeLog(s)
	mask := uint64(len(sh.table) - 1)
	hole := uint64(i)
	for j := (hole + 1) & mask; sh.table[j].id != 0; j = (j + 1) & mask {
		// The slot at j may fill the hole unless its home lies cyclically in (hole, j].
		if (j-home(sh.table[j].id, mask))&mask >= (j-hole)&mask {
			t := &sh.table[j]
			t.mu.Lock()
			t.moveTo(&sh.table[hole])
			sh.table[hole].mu.Unlock()
			hole = j
		}
	}
	s = &sh.table[hole]
	s.setID(0)
	s.check, s.log, s.State = 0, 0, algo.State{}
	s.mu.Unlock()
	sh.used--
	return true
}

// logOf returns the sliding window log of s, making it if s has none.
func (sh *memoryShard) logOf(s *slot) *algo.TimeLog {
	if s.log == 0 {
		if n := len(sh.freeLogs); n > 0 {
			s.log = sh.freeLogs[n-1] + 1
			sh.freeLogs = sh.freeLogs[:n-1]
		} else {
			sh.logs = append(sh.logs, algo.TimeLog{})
			s.log = int32(len(sh.logs))
		}
	}
	return &sh.logs[s.log-1]
}

// freeLog releases the sliding window log of s, if any, and its timestamps.
func (sh *memoryShard) freeLog(s *slot) {
	if s.log == 0 {
		return
	}
	sh.logs[s.log-1] = algo.TimeLog{}
	sh.freeLogs = append(sh.freeLogs, s.log-1)
	s.log = 0
}

// Len returns the number of keys tracked.
func (m *Memory) Len() int {
	total := 0
	for i := range m.shards {
		sh := &m.shards[i]
		sh.mu.Lock()
		total += sh.used
		sh.mu.Unlock()
	}
	return total
}

// Evictions returns how many keys were evicted because the store was full.
func (m *Memory) Evictions() int64 { return m.evictions.Load() }
