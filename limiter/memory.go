package limiter

import (
	"context"
	"hash/maphash"
	"math"
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Memory is an in-process store. Keys are spread over shards, each with its own lock;
// a decision on a key that is already tracked allocates nothing. Memory is bounded: a
// key whose state has gone back to a fresh key's is dropped when new keys arrive, and
// beyond MaxKeys the key closest to fresh is evicted (which forgets its history).
//
// Each shard is an open-addressing hash table (linear probing) whose slots hold the
// key's state inline, one cache line per key: with many keys, a decision costs one
// cache miss for its state, where a Go map of pointers costs three or four (bucket,
// key bytes, state). The tables hold no pointers, so the garbage collector does not
// scan them, and the keys themselves are not kept: a slot holds two independent
// hashes of its key, 88 bits in all that must match (see slot).
type Memory struct {
	seed      maphash.Seed // the key's hash: shard, slot and identity
	checkSeed maphash.Seed // the key's second hash: identity
	shards    []memoryShard
	shift     uint         // a hash's shard is hash >> shift
	now       func() int64 // µs since the Unix epoch
	perCap    int          // keys per shard

	evictions atomic.Int64
}

// memoryShard is one shard. A decision on a key that the shard already tracks, under
// the algorithm it last used, takes neither mu nor any other shared lock: it finds the
// key's slot by reading the table without locking and locks that slot alone (see
// slot.lock), so callers deciding at once on one hot key contend on one cache line,
// the slot's, rather than on the shard's lock and then the slot. Everything else
// (a new key, a change of algorithm, the sliding window log, whose logs live beside
// the table) takes mu, which serialises every change to the table's layout.
type memoryShard struct {
	mu    sync.Mutex
	table atomic.Pointer[[]slot] // a power of two of slots, at most 13/16 used; nil until the first key
	used  int                    // under mu

	logs     []algo.TimeLog // sliding window logs, by slot.log-1; under mu
	freeLogs []int32        // indices of unused logs; under mu

	_ [56]byte // keep neighbouring shards' locks off one cache line
}

// slot is one key of a shard's table: 64 bytes, aligned to a cache line (tables are
// allocated as powers of two of slots, which Go aligns to their size up to a page).
//
// A key is known by its hash h (64 bits, from which its shard and home slot derive)
// and a 32-bit check from a second, independently seeded hash. The low byte of h is
// replaced by the key's algorithm and the slot's lock bit, so 56 bits of h and the 32
// of the check must match: 88 bits of two hashes whose seeds are random per store and
// never leave the process. Two distinct keys are mistaken for one another only if they
// agree on all of them, a chance of 2^-88 (3·10^-27) per slot compared; a lookup
// compares a few slots, so a store making a million decisions a second for a century
// would mistake two keys with a probability of about 10^-10, far below that of a memory
// error. The seeds are what keeps clients from steering keys into one another, as they
// do for Go's own maps.
//
// id is read and written only with sync/atomic, since lookups read it without mu; the
// other fields only by the holder of the slot's lock (lockBit in id), so a decision
// sees and leaves a whole state. Only a holder of mu changes a slot's id (but for the
// lock bit), and it locks a slot before moving, copying or clearing it: a lookup that
// locks a slot and still finds its key there has the key's one live state.
type slot struct {
	id         uint64 // the key's hash, lockBit, and its algorithm in the low bits; 0: an empty slot
	check      uint32 // the key's second hash
	log        int32  // sliding window log: 1 + its index in the shard's logs; 0: none
	algo.State        // 48 bytes
}

const (
	idMask  = ^uint64(0xff) // the bits of a slot's id that come from the key's hash
	lockBit = 0x80          // set in a slot's id while a goroutine holds the slot
	algMask = 0x7f
)

func (s *slot) algorithm() algo.Algo { return algo.Algo(atomic.LoadUint64(&s.id) & algMask) }

// lock locks s if it holds the key whose unlocked id is id, waiting while another
// goroutine holds it, and reports whether it did: false once s holds another key or
// none.
func (s *slot) lock(id uint64) bool {
	for spins := 0; ; spins++ {
		switch atomic.LoadUint64(&s.id) {
		case id:
			if atomic.CompareAndSwapUint64(&s.id, id, id|lockBit) {
				return true
			}
		case id | lockBit:
			wait(spins)
		default:
			return false
		}
	}
}

// lockAny locks s, which is not empty, whatever key it holds, and returns its unlocked
// id. Only holders of mu call it, so the id cannot change but for the lock bit.
func (s *slot) lockAny() uint64 {
	for spins := 0; ; spins++ {
		id := atomic.LoadUint64(&s.id) &^ lockBit
		if atomic.CompareAndSwapUint64(&s.id, id, id|lockBit) {
			return id
		}
		wait(spins)
	}
}

// wait is how a goroutine waits, its spins-th time, for a slot that another holds. A
// slot is held for one decision, tens of nanoseconds, unless its holder's thread has
// lost its CPU (on a machine with more runnable threads than cores), which then takes
// milliseconds. So the waiter spins first, then yields to other goroutines (the holder
// may be one, preempted), and then sleeps, which hands its CPU to other threads (the
// holder's among them) instead of spinning against them.
func wait(spins int) {
	switch {
	case spins < 64:
	case spins < 96:
		runtime.Gosched()
	default:
		time.Sleep(time.Microsecond) // the timer's granularity makes it longer
	}
}

// tryLock locks s if it holds a key and nobody holds it, and returns its unlocked id,
// or 0.
func (s *slot) tryLock() uint64 {
	id := atomic.LoadUint64(&s.id)
	if id == 0 || id&lockBit != 0 || !atomic.CompareAndSwapUint64(&s.id, id, id|lockBit) {
		return 0
	}
	return id
}

// unlock releases s, which holds the key with unlocked id id; it is also how a holder
// of mu publishes a slot it has filled (or emptied, with id 0).
func (s *slot) unlock(id uint64) { atomic.StoreUint64(&s.id, id) }

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
	sh := &m.shards[h>>m.shift]               // a shift by 64 (one shard) gives 0
	if p.Algorithm != algo.SlidingWindowLog { // its logs are under mu
		if t := sh.table.Load(); t != nil {
			if s, id := lookup(*t, h, check, p.Algorithm); s != nil {
				o := s.Decide(p, now, n, nil)
				s.unlock(id)
				return o
			}
		}
	}
	return m.decideLocked(sh, h, check, p, now, n)
}

// lookup finds and locks, without mu, the slot of the key with hash h and check if it
// uses algorithm a, and returns it with its unlocked id. It returns nil when it cannot
// tell, for the caller to look again under mu: the key is absent, uses another
// algorithm, or is being moved (a table being grown or a key being removed reads as
// missing keys until mu is released).
func lookup(t []slot, h uint64, check uint32, a algo.Algo) (*slot, uint64) {
	mask := uint64(len(t) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &t[i]
		id := atomic.LoadUint64(&s.id)
		if id == 0 {
			return nil, 0
		}
		if (id^h)&idMask != 0 {
			continue
		}
		// The slot is nearly always free: try it before calling lock, which waits.
		if id&lockBit != 0 || !atomic.CompareAndSwapUint64(&s.id, id, id|lockBit) {
			if id &^= lockBit; !s.lock(id) {
				return nil, 0
			}
		}
		if s.check != check || algo.Algo(id&algMask) != a {
			s.unlock(id)
			return nil, 0
		}
		return s, id
	}
}

// decideLocked is decide under mu: it may add the key, change its algorithm, and use
// the shard's sliding window logs.
func (m *Memory) decideLocked(sh *memoryShard, h uint64, check uint32, p *algo.Params, now, n int64) algo.Outcome {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	var s *slot
	var id uint64
	if i := sh.find(h, check); i >= 0 {
		s = &sh.slots()[i]
		id = s.lockAny()
	} else {
		s, id = m.insert(sh, h, check, p.Algorithm, now)
	}
	if algo.Algo(id&algMask) != p.Algorithm {
		sh.freeLog(s)
		id = h&idMask | uint64(p.Algorithm)
		s.State = algo.State{}
	}
	var log *algo.TimeLog
	if p.Algorithm == algo.SlidingWindowLog {
		log = sh.logOf(s)
	}
	o := s.Decide(p, now, n, log)
	s.unlock(id)
	return o
}

// slots returns the shard's table (nil before the first key).
func (sh *memoryShard) slots() []slot {
	if t := sh.table.Load(); t != nil {
		return *t
	}
	return nil
}

// find returns the index of the key with hash h and check, or -1. The caller holds mu.
func (sh *memoryShard) find(h uint64, check uint32) int {
	t := sh.slots()
	if len(t) == 0 {
		return -1
	}
	mask := uint64(len(t) - 1)
	for i := home(h, mask); ; i = (i + 1) & mask {
		s := &t[i]
		id := atomic.LoadUint64(&s.id)
		if id == 0 {
			return -1 // a table always has empty slots
		}
		// check is written only under mu, which the caller holds.
		if (id^h)&idMask == 0 && s.check == check {
			return int(i)
		}
	}
}

// insert adds the key with hash h and check to sh, whose mu is held, with algorithm a
// and an empty state, and returns its slot locked, with its unlocked id. Like Redis'
// expiry, it first inspects a few keys (those from the key's home slot on, which the
// lookup has just brought into the cache): those whose state is fresh again are
// dropped, and if the shard is full the one that becomes fresh soonest is evicted.
// Keys held by a decision under way are in use and are passed over.
func (m *Memory) insert(sh *memoryShard, h uint64, check uint32, a algo.Algo, now int64) (*slot, uint64) {
	if t := sh.slots(); sh.used > 0 {
		type ref struct {
			id    uint64
			check uint32
		}
		var expired [sampleSize]ref
		var victim ref
		nexpired, victimExpires := 0, int64(0)
		mask := uint64(len(t) - 1)
		i, seen := home(h, mask), 0
		for range t {
			s := &t[i]
			if id := s.tryLock(); id != 0 {
				if s.Expires <= now {
					expired[nexpired] = ref{id, s.check}
					nexpired++
				} else if victim.id == 0 || s.Expires < victimExpires {
					victim, victimExpires = ref{id, s.check}, s.Expires
				}
				s.unlock(id)
				if seen++; seen == sampleSize {
					break
				}
			}
			i = (i + 1) & mask
		}
		for _, r := range expired[:nexpired] {
			// A decision may have renewed the key since it was inspected.
			sh.remove(r.id, r.check, now)
		}
		if sh.used >= m.perCap && victim.id != 0 {
			if sh.remove(victim.id, victim.check, math.MaxInt64) {
				m.evictions.Add(1)
			}
		}
	}
	if (sh.used+1)*16 > len(sh.slots())*13 {
		sh.grow()
	}
	sh.used++
	id := h&idMask | uint64(a)
	s := sh.place(id|lockBit, check, nil)
	return s, id
}

// place puts a key with this id and check, and src's state and log (or an empty
// state), in the first empty slot from its home in the shard's table, and returns
// that slot. Its id is stored last, with sync/atomic, which publishes the slot to
// lookups; an id with lockBit keeps it locked.
func (sh *memoryShard) place(id uint64, check uint32, src *slot) *slot {
	return placeIn(sh.slots(), id, check, src)
}

func placeIn(t []slot, id uint64, check uint32, src *slot) *slot {
	mask := uint64(len(t) - 1)
	i := home(id, mask)
	for atomic.LoadUint64(&t[i].id) != 0 {
		i = (i + 1) & mask
	}
	s := &t[i]
	s.check = check
	if src != nil {
		s.log, s.State = src.log, src.State
	} else {
		s.log, s.State = 0, algo.State{}
	}
	atomic.StoreUint64(&s.id, id)
	return s
}

// grow doubles the table (or makes the first one). Each key is locked while it is
// copied, so a decision under way on the old table finishes before its key is copied,
// and the old slot is then emptied, so that a later lookup in the old table misses and
// looks again under mu, which grow holds until the new table is in place.
func (sh *memoryShard) grow() {
	old := sh.slots()
	t := make([]slot, max(2*len(old), 8))
	for i := range old {
		s := &old[i]
		if atomic.LoadUint64(&s.id) == 0 {
			continue
		}
		id := s.lockAny()
		placeIn(t, id, s.check, s)
		s.unlock(0)
	}
	sh.table.Store(&t)
}

// remove deletes the key with this id (hash bits) and check if it is present and its
// state is fresh by the time fresh (math.MaxInt64: whatever its state), and reports
// whether it did. The caller holds mu.
// The slots after it move back (backward-shift deletion), so the table needs no
// tombstones; each is locked while it moves, and a lookup that meets a slot being
// emptied or refilled misses and looks again under mu.
func (sh *memoryShard) remove(id uint64, check uint32, fresh int64) bool {
	i := sh.find(id, check)
	if i < 0 {
		return false
	}
	t := sh.slots()
	hid := t[i].lockAny()
	if t[i].Expires > fresh {
		t[i].unlock(hid)
		return false
	}
	sh.freeLog(&t[i])
	mask := uint64(len(t) - 1)
	hole := uint64(i) // locked, by this goroutine
	for j := (hole + 1) & mask; ; j = (j + 1) & mask {
		jid := atomic.LoadUint64(&t[j].id)
		if jid == 0 {
			break
		}
		// The slot at j may fill the hole unless its home lies cyclically in (hole, j].
		if (j-home(jid, mask))&mask >= (j-hole)&mask {
			jid = t[j].lockAny()
			t[hole].check, t[hole].log, t[hole].State = t[j].check, t[j].log, t[j].State
			t[hole].unlock(jid) // publishes the key in its new slot
			hole = j            // stays locked until it is refilled or emptied
		}
	}
	t[hole].check, t[hole].log, t[hole].State = 0, 0, algo.State{}
	t[hole].unlock(0)
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
