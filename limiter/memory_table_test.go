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
