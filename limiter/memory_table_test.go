package limiter

import (
	"math"
	"math/rand/v2"
	"reflect"
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
	want := map[key]int64{} // key → its slot's word, a marker
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
			s := m.insert(sh, k.id, k.check, algo.TokenBucket, 0)
			s.word, s.ttl = uint64(step), ttlOf(1<<62) // never dropped as fresh

			want[k] = int64(step)
			keys = append(keys, k)
		} else {
			i := rng.IntN(len(keys))
			k := keys[i]
			keys[i] = keys[len(keys)-1]
			keys = keys[:len(keys)-1]
			delete(want, k)
			sh.remove(k.id, k.check)
		}
		if sh.used != len(want) {
			t.Fatalf("step %d: %d keys in the table, want %d", step, sh.used, len(want))
		}
		for k, count := range want {
			i := sh.find(k.id, k.check)
			if i < 0 {
				t.Fatalf("step %d: %v lost", step, k)
			}
			if s := &sh.table[i]; s.word != uint64(count) || s.algorithm() != algo.TokenBucket {
				t.Fatalf("step %d: %v has marker %d, algorithm %d; want %d", step, k, s.word, s.algorithm(), count)
			}
		}
		if len(sh.table) > 256 {
			t.Fatalf("step %d: the table grew to %d slots for at most 96 keys", step, len(sh.table))
		}
	}
}

// TestMemoryRecordsAreReleased checks that the state a key keeps outside its slot (a
// sliding log's timestamps, a window's counts) goes with the key: when the key is
// dropped or changes to a bucket, whose state is all in its slot.
func TestMemoryRecordsAreReleased(t *testing.T) {
	now := int64(0)
	m := NewMemory(WithShards(1))
	m.now = func() int64 { return now }
	log := algo.Params{Algorithm: algo.SlidingWindowLog, Rate: 100, Period: 1000, Capacity: 100}
	fixed := algo.Params{Algorithm: algo.FixedWindow, Rate: 100, Period: 1000, Capacity: 100}
	bucket := algo.Params{Algorithm: algo.TokenBucket, Rate: 100, Period: 1000, Capacity: 100}
	sh := &m.shards[0]
	m.decide("a", &log, 5)
	m.decide("b", &fixed, 5)
	m.decide("c", &log, 5)
	if len(sh.logs.items) != 2 || len(sh.windows.items) != 1 || len(sh.logs.free)+len(sh.windows.free) != 0 {
		t.Fatalf("%d logs, %d windows, %d free; want 2, 1, 0", len(sh.logs.items), len(sh.windows.items), len(sh.logs.free)+len(sh.windows.free))
	}
	m.decide("a", &bucket, 1)
	m.decide("b", &bucket, 1)
	if len(sh.logs.free) != 1 || !reflect.DeepEqual(sh.logs.items[sh.logs.free[0]], algo.TimeLog{}) ||
		len(sh.windows.free) != 1 || sh.windows.items[sh.windows.free[0]] != (window{}) {
		t.Fatalf("a and b changed to a bucket but their records were kept: %d logs, %d windows free", len(sh.logs.free), len(sh.windows.free))
	}
	m.decide("d", &log, 1) // reuses a's log
	if len(sh.logs.items) != 2 || len(sh.logs.free) != 0 {
		t.Fatalf("%d logs, %d free; want 2, 0", len(sh.logs.items), len(sh.logs.free))
	}
	now = 10_000 // every key is fresh again: new keys sweep them away
	for _, k := range []string{"e", "f", "g", "h"} {
		m.decide(k, &bucket, 1)
	}
	if got := m.Len(); got != 4 {
		t.Fatalf("%d keys, want the 4 new ones", got)
	}
	if len(sh.logs.free) != 2 {
		t.Fatalf("%d logs free, want 2", len(sh.logs.free))
	}
}

// TestTTL checks that a slot's ttl never brings a key's expiry forward, and keeps it
// within float32's precision.
func TestTTL(t *testing.T) {
	for _, last := range []int64{-1e15, 0, 1_800_000_000_000_000, math.MaxInt64 - 10} {
		for _, d := range []int64{0, 1, 999_999, 1<<24 + 1, 1<<53 - 1, 1e15 + 7, math.MaxInt64} {
			s := slot{last: last, ttl: ttlOf(d)}
			want := last + d
			if want < last {
				want = math.MaxInt64
			}
			// Saturating at the largest time is later still, which is allowed.
			if got := s.expires(); got < want || got != math.MaxInt64 && float64(got)-float64(last) > float64(d)*(1+1.0/(1<<23)) {
				t.Errorf("last %d, ttl of %d µs: expires %d, want %d or at most 2^-23 of the ttl later", last, d, got, want)
			}
		}
	}
	if s := (slot{last: -5, ttl: ttlOf(-3)}); s.expires() != -5 {
		t.Errorf("a negative ttl expires at %d, want last", s.expires())
	}
}

// TestMemoryLayout checks the sizes the memory store's cache behaviour rests on: two
// slots to a cache line, and shards that start on one.
func TestMemoryLayout(t *testing.T) {
	if n := unsafe.Sizeof(slot{}); n != 32 {
		t.Errorf("a slot is %d bytes, want 32", n)
	}
	if n := unsafe.Sizeof(memoryShard{}); n%64 != 0 {
		t.Errorf("a shard is %d bytes, not a multiple of 64", n)
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
