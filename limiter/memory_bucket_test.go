package limiter

import (
	"math"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// The safeguards of the buckets' decisions without a lock (memory_bucket.go), each
// driven to the moment it exists for. The decisions without a lock run only on
// amd64 without the race detector; under it, the tests check the same invariant on
// the slot's lock where there is one, and skip where there is none.

// bucketParams are the params of a bucket limit for n units.
func bucketParams(t *testing.T, a Algorithm, rate int64, period time.Duration, burst, n int64) *algo.Params {
	t.Helper()
	var p algo.Params
	l := Limit{Algorithm: a, Rate: rate, Period: period, Burst: burst}
	if err := paramsOf(&p, &l, n); err != nil {
		t.Fatal(err)
	}
	return &p
}

// wordsOf are the bucket words of s, read atomically.
func wordsOf(s *slot) [2]uint64 {
	w := s.words()
	return [2]uint64{atomic.LoadUint64(&w[0]), atomic.LoadUint64(&w[1])}
}

// oneSlotStore is a store of one shard, on a stopped clock, and that shard.
func oneSlotStore() (*Memory, *memoryShard) {
	m := NewMemory(WithShards(1), WithClock(func() time.Time { return time.Unix(1000, 0) }))
	return m, &m.shards[0]
}

// TestBucketWithoutLockChecksTheKey: a decision for a key of the same hash but
// another check (the second hash, which the lookup without the lock does not
// compare) must not decide on the slot's bucket: decideBucket compares the slot's
// check after reading its words, as lockKey does under the lock.
func TestBucketWithoutLockChecksTheKey(t *testing.T) {
	m, sh := oneSlotStore()
	p := bucketParams(t, TokenBucket, 1, time.Hour, 2, 1)
	const h, check = 5 << 8, 7
	now := m.now()
	if o := m.decideHashed(h, check, p, now, 1, nil); !o.Allowed {
		t.Fatalf("first unit: %+v", o)
	}
	i := sh.find(h, check)
	before := wordsOf(&sh.table[i])
	var o algo.Outcome
	if sh.decideTracked(&o, h|uint64(p.Algorithm), check+1, p, now, 1, nil) {
		t.Fatalf("a key of another check decided on the slot's bucket: %+v", o)
	}
	if after := wordsOf(&sh.table[i]); after != before {
		t.Fatalf("a key of another check changed the slot's words: %x, were %x", after, before)
	}
}

// TestBucketWithoutLockRereadsTheID: a decision that found its key's slot, and meets
// it holding another key (its own was removed and the other, of the same home slot
// and limit, put there), must not decide on the other key's bucket: decideBucket
// reads the slot's id again after its words. (Under the lock, lockKey does.)
func TestBucketWithoutLockRereadsTheID(t *testing.T) {
	m, sh := oneSlotStore()
	p := bucketParams(t, TokenBucket, 1, time.Hour, 2, 1)
	const h, other, check = 5 << 8, (5 + 64) << 8, 7 // one home slot in tables up to 64 slots
	now := m.now()
	m.decideHashed(h, check, p, now, 1, nil)
	i := sh.find(h, check)
	sh.mu.Lock()
	if !sh.remove(h, check, math.MaxInt64) {
		t.Fatal("the key was not removed")
	}
	sh.mu.Unlock()
	m.decideHashed(other, check, p, now, 1, nil)
	if j := sh.find(other, check); j != i {
		t.Fatalf("the other key is in slot %d, not %d", j, i)
	}
	s := &sh.table[i]
	before := wordsOf(s)
	id := uint64(h | uint64(p.Algorithm))
	if !sh.fast.Load().lockFree {
		if s.lockKey(id, check) {
			t.Fatal("the slot's lock was taken for a key it no longer holds")
		}
		return
	}
	var o algo.Outcome
	if s.decideBucket(&o, id, check, p, now, 1, nil) {
		t.Fatalf("a removed key decided on the bucket of the key now in its slot: %+v", o)
	}
	if after := wordsOf(s); after != before {
		t.Fatalf("the other key's words changed: %x, were %x", after, before)
	}
}

// TestBucketWithoutLockWaitsForARetype: while a key changes from the token bucket to
// the leaky bucket of the same rate and period (a rules reload), a leaky decision
// without the lock that meets the slot with its new id but its old words (the
// token bucket's, which pass every other check) must not decide on them: the re-type
// freezes the words before it changes the id. Deciding there granted the unit on
// top of the re-type's, which starts from an empty bucket: more than the capacity.
func TestBucketWithoutLockWaitsForARetype(t *testing.T) {
	m, sh := oneSlotStore()
	token := bucketParams(t, TokenBucket, 1, time.Hour, 2, 1)
	leaky := bucketParams(t, LeakyBucket, 1, time.Hour, 2, 2)
	const h, check = 5 << 8, 7
	now := m.now()
	m.decideHashed(h, check, token, now, 1, nil)
	requireLockFree(t, sh.fast.Load().lockFree) // under the lock the re-type holds it; the freeze guards decisions without it
	id := uint64(h | uint64(algo.LeakyBucket))
	var during algo.Outcome
	var decided, ran bool
	m.retyping = func(s *slot) {
		ran = true
		decided = s.decideBucket(&during, id, check, leaky, now, 1, nil)
	}
	o := m.decideHashed(h, check, leaky, now, 2, nil)
	if !ran {
		t.Fatal("the key was not re-typed")
	}
	if decided {
		t.Fatalf("a leaky decision without the lock decided on the token bucket's words during the re-type: %+v, then the re-type's %+v", during, o)
	}
}

// requireLockFree skips a test of the lock-free bucket path where buckets are decided
// under their slot's lock (the race detector, or no CMPXCHG16B), except in CI's run
// without the race detector on amd64: that run is the only one that reaches the path,
// so there a missing path fails.
func requireLockFree(t *testing.T, lockFree bool) {
	t.Helper()
	switch {
	case lockFree:
	case os.Getenv("CI") == "true" && !raceEnabled && runtime.GOARCH == "amd64":
		t.Fatal("CI's run without -race on amd64 must decide buckets without the lock, and this build does not")
	default:
		t.Skip("buckets are decided under their slot's lock here (race detector, or no CMPXCHG16B)")
	}
}
