package limiter

import (
	"math"
	"math/rand/v2"
	"reflect"
	"strconv"
	"sync/atomic"
	"testing"
	"unsafe"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// TestMemoryTable drives a shard's table through random inserts and removals, with
// hashes chosen to collide in a small table (long probe runs that wrap around its
// end), and checks it against a map after every step.
func TestMemoryTable(t *testing.T) {
	m := NewMemory(WithShards(1), WithMaxKeys(1<<20))
	sh := &m.shards[0]
	rng := rand.New(rand.NewPCG(1, 2))
	type key struct {
		id    uint64
		check uint32
	}
	want := map[key]int64{} // key → its state's count, a marker
	var keys []key
	for step := range 20_000 {
		if len(keys) == 0 || rng.IntN(3) > 0 {
			// 24 hashes whose home slots straddle the end of the table, whatever its
			// size, and checks that tell apart keys of one hash.
			k := key{id: (uint64(rng.IntN(24)) - 12) << 8, check: uint32(rng.IntN(4))}
			if _, ok := want[k]; ok {
				continue
			}
			if sh.find(k.id, k.check) >= 0 {
				t.Fatalf("step %d: %v found before it was inserted", step, k)
			}
			s := m.insert(sh, k.id, k.check, algo.FixedWindow, 0)
			s.Count, s.Expires = int64(step), 1<<62 // never dropped as fresh

			want[k] = int64(step)
			keys = append(keys, k)
		} else {
			i := rng.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			delete(want, k)
			sh.remove(k.id, k.check, math.MaxInt64)
		}
		if sh.used != len(want) {
			t.Fatalf("step %d: %d keys in the table, want %d", step, sh.used, len(want))
		}
		for k, count := range want {
			i := sh.find(k.id, k.check)
			if i < 0 {
				t.Fatalf("step %d: %v lost", step, k)
			}
			if s := &sh.table[i]; s.Count != count || s.algorithm() != algo.FixedWindow {
				t.Fatalf("step %d: %v has count %d, algorithm %d; want %d", step, k, s.Count, s.algorithm(), count)
			}
		}
		if len(sh.table) > 256 {
			t.Fatalf("step %d: the table grew to %d slots for at most 96 keys", step, len(sh.table))
		}
	}
}

// TestMemoryLayout checks the sizes the table's design counts on: a slot (its lock,
// the key's identity and its state) in one cache line, and a shard in two.
func TestMemoryLayout(t *testing.T) {
	if n := unsafe.Sizeof(slot{}); n != 64 {
		t.Errorf("a slot is %d bytes, want 64", n)
	}
	if n := unsafe.Sizeof(memoryShard{}); n != 128 {
		t.Errorf("a shard is %d bytes, want 128", n)
	}
	// A bucket's words, for CMPXCHG16B: 16-byte aligned, the time then the level.
	var s slot
	if unsafe.Offsetof(s.Last) != 16 || unsafe.Offsetof(s.Level) != 24 {
		t.Errorf("a bucket's words are at offsets %d and %d, want 16 and 24", unsafe.Offsetof(s.Last), unsafe.Offsetof(s.Level))
	}
	m := NewMemory(WithShards(1))
	sh := &m.shards[0]
	for range 12 { // tables of 8 to 16k slots
		sh.mu.Lock()
		sh.grow(m.lockFree)
		sh.mu.Unlock()
		if t := sh.fast.Load(); t.lockFree != m.lockFree {
			break
		}
	}
	if sh.fast.Load().lockFree != m.lockFree {
		t.Errorf("a table of %d slots is not 16-byte aligned", len(sh.table))
	}
}

// TestMemoryLogsAreReleased checks that a sliding log's timestamps go with its key:
// when the key is dropped or changes algorithm.
func TestMemoryLogsAreReleased(t *testing.T) {
	now := int64(0)
	m := NewMemory(WithShards(1))
	m.now = func() int64 { return now }
	log := algo.Params{Algorithm: algo.SlidingWindowLog, Rate: 100, Period: 1000, Capacity: 100}
	window := algo.Params{Algorithm: algo.FixedWindow, Rate: 100, Period: 1000, Capacity: 100}
	sh := &m.shards[0]
	m.decide("a", &log, 5)
	m.decide("b", &log, 5)
	if len(sh.logs) != 2 || len(sh.freeLogs) != 0 {
		t.Fatalf("%d logs, %d free; want 2, 0", len(sh.logs), len(sh.freeLogs))
	}
	m.decide("a", &window, 1)
	if len(sh.freeLogs) != 1 || !reflect.DeepEqual(sh.logs[sh.freeLogs[0]], algo.TimeLog{}) {
		t.Fatalf("a changed algorithm but its log was kept: %d free", len(sh.freeLogs))
	}
	m.decide("c", &log, 1) // reuses a's log
	if len(sh.logs) != 2 || len(sh.freeLogs) != 0 {
		t.Fatalf("%d logs, %d free; want 2, 0", len(sh.logs), len(sh.freeLogs))
	}
	now = 10_000 // every key is fresh again: new keys sweep them away
	for _, k := range []string{"d", "e", "f", "g"} {
		m.decide(k, &window, 1)
	}
	if got := m.Len(); got != 4 {
		t.Fatalf("%d keys, want the 4 new ones", got)
	}
	if len(sh.freeLogs) != 2 {
		t.Fatalf("%d logs free, want 2", len(sh.freeLogs))
	}
}

// TestAlgorithmNumbers checks that the algorithms' core knows every Algorithm by its
// name, and that its never is Never.
func TestAlgorithmNumbers(t *testing.T) {
	seen := map[algo.Algo]bool{}
	for _, a := range Algorithms {
		n := algo.Of(string(a))
		if n == algo.None || seen[n] {
			t.Errorf("algo.Of(%q) = %d", a, n)
		}
		seen[n] = true
		if n.Bucket() != (a == TokenBucket || a == LeakyBucket) {
			t.Errorf("%s: Bucket() = %v", a, n.Bucket())
		}
	}
	if algo.Of("token-bucket") != algo.None {
		t.Error("algo.Of knows a misspelt name")
	}
	if algo.Duration(algo.Never) != Never {
		t.Errorf("algo.Duration(algo.Never) = %v, want Never", algo.Duration(algo.Never))
	}
}

// TestMemoryHotKeys checks the remembered hashes of hot keys: a key decided again at
// once is remembered, decisions on it stay on its one state, another key of the same
// index (same length, same last byte) keeps its own state and does not displace it
// before hotRefresh, a key read from a buffer that is then rewritten is remembered by
// its content, and keys that are not hot are never remembered.
func TestMemoryHotKeys(t *testing.T) {
	now := int64(1_000_000)
	m := NewMemory(WithShards(1))
	m.now = func() int64 { return now }
	p := algo.Params{Algorithm: algo.FixedWindow, Rate: 100, Period: 1 << 40, Capacity: 100}
	remaining := func(key string) int64 { return m.decide(key, &p, 1).Remaining }

	buf := []byte("hot-a-0")
	a := unsafe.String(&buf[0], len(buf))
	if hotIndex(a) != hotIndex("hot-b-0") {
		t.Fatal("the test's keys do not share an index")
	}
	for i := range 10 {
		if got := remaining(a); got != int64(99-i) {
			t.Fatalf("decision %d on %s: remaining %d, want %d", i, a, got, 99-i)
		}
	}
	e := m.hot[hotIndex(a)].Load()
	if e == nil || e.key != "hot-a-0" {
		t.Fatalf("a key decided ten times at once is not remembered: %+v", e)
	}
	for i := range 10 {
		if got := remaining("hot-b-0"); got != int64(99-i) {
			t.Fatalf("decision %d on hot-b-0: remaining %d, want %d", i, got, 99-i)
		}
	}
	if m.hot[hotIndex(a)].Load() != e {
		t.Fatal("another hot key displaced the entry before hotRefresh")
	}
	copy(buf, "hot-c-0") // the caller reuses its buffer: the entry keeps its own copy
	if got := remaining(a); got != 99 {
		t.Fatalf("hot-c-0, a new key in a rewritten buffer: remaining %d, want 99", got)
	}
	if got := remaining("hot-a-0"); got != 89 {
		t.Fatalf("hot-a-0 after ten decisions: remaining %d, want 89", got)
	}
	now += hotRefresh
	remaining("hot-b-0")
	remaining("hot-b-0") // decided again at once: hot
	if e := m.hot[hotIndex(a)].Load(); e == nil || e.key != "hot-b-0" {
		t.Fatalf("after hotRefresh, the entry did not go to the other hot key: %+v", e)
	}

	cold := NewMemory(WithShards(1))
	cold.now = func() int64 { return now }
	for i := range 3000 {
		now += hotGap
		cold.decide(strconv.Itoa(i%300), &p, 1)
	}
	for i := range cold.hot {
		if e := cold.hot[i].Load(); e != nil {
			t.Fatalf("a key decided every %dµs was remembered as hot: %q", 300*hotGap, e.key)
		}
	}
}

// TestMemoryBucketWordsAfterMoves plays a decision without the lock that read a
// bucket's words and then slept while the key moved: backward (a key before it
// removed) and to a new table (growing). Its compare-and-swap must then fail, on the
// old slot and on the new one, and the bucket's state must be intact.
func TestMemoryBucketWordsAfterMoves(t *testing.T) {
	requireLockFree(t, hasCAS128())
	now := int64(1_000_000)
	m := NewMemory(WithShards(1), WithMaxKeys(1<<20))
	m.now = func() int64 { return now }
	sh := &m.shards[0]
	p := algo.Params{Algorithm: algo.TokenBucket, Rate: 1, Period: 1 << 40, Capacity: 1000}
	// a and b share a home slot, so b sits right after a.
	const ha, hb = 5 << 8, 5<<8 | 1<<40
	ida, idb := uint64(ha)|uint64(algo.TokenBucket), uint64(hb)|uint64(algo.TokenBucket)
	m.decideHashed(ha, 1, &p, now, 1, nil)
	decided := int64(0)
	decide := func() algo.Outcome {
		decided++
		return m.decideHashed(hb, 2, &p, now, 1, nil)
	}
	decide()
	decide() // without the lock
	stale := func() (*[2]uint64, uint64, uint64) {
		w := sh.table[sh.find(idb, 2)].words()
		return w, atomic.LoadUint64(&w[0]), atomic.LoadUint64(&w[1])
	}
	check := func(what string, old *[2]uint64, w0, w1 uint64) {
		t.Helper()
		if cas128(old, w0, w1, w0, w1^1) {
			t.Fatalf("%s: a stale compare-and-swap on the old slot succeeded", what)
		}
		if w := sh.table[sh.find(idb, 2)].words(); cas128(w, w0, w1, w0, w1^1) {
			t.Fatalf("%s: a stale compare-and-swap on the key's new slot succeeded", what)
		}
		if o := decide(); o.Remaining != p.Capacity-decided {
			t.Fatalf("%s: remaining %d after %d decisions", what, o.Remaining, decided)
		}
	}

	old, w0, w1 := stale()
	sh.mu.Lock()
	if !sh.remove(ida, 1, math.MaxInt64) {
		t.Fatal("a was not removed")
	}
	sh.mu.Unlock()
	check("moved back", old, w0, w1)

	old, w0, w1 = stale()
	sh.mu.Lock()
	sh.grow(m.lockFree)
	sh.mu.Unlock()
	check("moved to a new table", old, w0, w1)
}
