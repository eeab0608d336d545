package limiter

import (
	"math"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// Buckets without a lock.
//
// A token or leaky bucket's state is the latest time seen and the level, two words
// (State.Last and State.Level, 16-byte aligned in a slot), and the decision reads
// nothing else of the state: so a decision on a tracked bucket reads the two words,
// decides on a copy with algo's own code (the float64 arithmetic the Redis scripts
// repeat, so the stores still agree to the µs) and writes them back with one 128-bit
// compare-and-swap (CMPXCHG16B), retrying if another decision came first. No lock,
// one atomic instruction on the key's cache line. Bits of the words say what they
// hold:
//
//	first word  bit 63   frozen: whoever holds the slot's lock is writing the slot
//	            bit 62   parked: the time does not fit in 53 bits (a clock before 1970
//	                     or after 2255) and is in State.Expires; decided under the lock
//	            53-61    version: the shard's count of bucket publications, mod 512
//	            0-52     the latest time seen, µs
//	second word bit 63   tag: the words hold a bucket's state (a level is never
//	                     negative, so the bit is free); other algorithms' words never
//	                     have it
//	            0-62     the level's float64 bits
//
// and State.Start and State.Count hold the rate and period of the decision that
// wrote them, by which the slot tells when the state becomes a fresh key's (as
// State.Expires does for the other algorithms). A decision without the lock needs
// the words unfrozen, unparked and tagged, the slot's id and check still its key's
// (read after the words), and its own rate and period equal to those: otherwise it
// is made under the slot's lock (decideLocked), which freezes the words by
// compare-and-swap, decides, and publishes them with the new rate and period.
//
// Everything that rewrites a slot holds its lock, freezes its words first and
// publishes a bucket's words last, with a new version, after the slot's id: so a
// decision that read the words before the rewrite fails its compare-and-swap (the
// words are frozen or have another version), and one that reads the published
// words reads the new id too. A decision that read a slot's words and id, and then
// slept through 512 publications in its shard, could still succeed if the words
// came back bit for bit the same (same µs, same level, same version mod 512):
// that is the one way a decision without the lock could go to a state it did not
// read, and it needs a thread descheduled for hundreds of key rewrites at the exact
// moment and an identical state after them.
//
// Under the race detector, or without CMPXCHG16B, buckets are decided under the
// slot's lock like the other algorithms (see cas128_other.go).
const (
	bucketFrozen  = 1 << 63
	bucketParked  = 1 << 62
	versionShift  = 53
	versionMask   = 0x1ff << versionShift
	bucketTimeMax = 1<<53 - 1
	bucketTag     = 1 << 63 // in the second word
)

// words are the bucket words of s.
func (s *slot) words() *[2]uint64 { return (*[2]uint64)(unsafe.Pointer(&s.Last)) }

// bucketOf is the bucket state of words w0 and w1; expires is the slot's Expires,
// which holds a parked bucket's time.
func bucketOf(w0, w1 uint64, expires int64) algo.State {
	last := int64(w0 & bucketTimeMax)
	if w0&bucketParked != 0 {
		last = expires
	}
	return algo.State{Last: last, Level: math.Float64frombits(w1 &^ bucketTag)}
}

// decideBucket makes the decision into o on the bucket in s without its lock, if the
// slot still holds the key of this id and check, last decided with p's rate and
// period, and reports whether it did (and sets last as decideHashed does).
func (s *slot) decideBucket(o *algo.Outcome, id uint64, check uint32, p *algo.Params, now, n int64, last *int64) bool {
	if now < 0 || now > bucketTimeMax {
		return false
	}
	w := s.words()
	for {
		w0 := atomic.LoadUint64(&w[0])
		w1 := atomic.LoadUint64(&w[1])
		if w0&(bucketFrozen|bucketParked) != 0 || w1&bucketTag == 0 ||
			atomic.LoadUint64(&s.id) != id || atomic.LoadUint32(&s.check) != check ||
			atomic.LoadInt64(&s.Start) != p.Rate || atomic.LoadInt64(&s.Count) != p.Period {
			return false
		}
		st := algo.State{Last: int64(w0 & bucketTimeMax), Level: math.Float64frombits(w1 &^ bucketTag)}
		if last != nil {
			*last = st.Last
		}
		*o = st.Decide(p, now, n, nil)
		if cas128(w, w0, w1, uint64(st.Last)|w0&versionMask, math.Float64bits(st.Level)|bucketTag) {
			return true
		}
	}
}

// freeze sets the frozen bit of the words of s, whose lock is held, and returns
// them as they were: from then on no decision without the lock changes them. Only
// a bucket's words change without the lock, but any words are frozen before they
// are rewritten, since they may become a bucket's.
func (s *slot) freeze() (w0, w1 uint64) {
	w := s.words()
	for {
		w0, w1 = atomic.LoadUint64(&w[0]), atomic.LoadUint64(&w[1])
		if cas128(w, w0, w1, w0|bucketFrozen, w1) {
			return w0, w1
		}
	}
}

// decideLocked makes the decision on s, whose lock is held; log is its sliding
// window log, last as decideHashed says. With lockFree, a bucket's words are frozen
// while it decides.
func (sh *memoryShard) decideLocked(s *slot, p *algo.Params, now, n int64, log *algo.TimeLog, last *int64, lockFree bool) algo.Outcome {
	if !p.Algorithm.Bucket() {
		if last != nil {
			*last = s.Last
		}
		return s.Decide(p, now, n, log)
	}
	w0, w1 := uint64(s.Last), math.Float64bits(s.Level)
	if lockFree {
		w0, w1 = s.freeze()
	}
	st := bucketOf(w0, w1, s.Expires)
	if last != nil {
		*last = st.Last
	}
	o := st.Decide(p, now, n, nil)
	sh.publish(s, &st, p.Rate, p.Period)
	return o
}

// publish stores st, decided with rate and period, as the bucket words of s, whose
// lock is held and whose words are frozen if the table is lock-free: the rate and
// period, the second word, then the first, unfrozen and with a new version.
func (sh *memoryShard) publish(s *slot, st *algo.State, rate, period int64) {
	atomic.StoreInt64(&s.Start, rate)
	atomic.StoreInt64(&s.Count, period)
	w0 := uint64(st.Last)
	if st.Last < 0 || st.Last > bucketTimeMax {
		s.Expires, w0 = st.Last, bucketParked
	}
	atomic.StoreUint64(&s.words()[1], math.Float64bits(st.Level)|bucketTag)
	atomic.StoreInt64(&s.Last, sh.published(w0))
}

// published is a bucket's first word w0 unfrozen, with the shard's next version.
func (sh *memoryShard) published(w0 uint64) int64 {
	v := uint64(sh.versions.Add(1)) << versionShift & versionMask
	return int64(w0&^(bucketFrozen|versionMask) | v)
}

// expires is when the state of s, whose lock is held, becomes a fresh key's
// (math.MaxInt64: never).
func (s *slot) expires() int64 {
	if !s.algorithm().Bucket() {
		return s.Expires
	}
	w := s.words()
	st := bucketOf(atomic.LoadUint64(&w[0]), atomic.LoadUint64(&w[1]), s.Expires)
	rate, period := atomic.LoadInt64(&s.Start), atomic.LoadInt64(&s.Count)
	if rate <= 0 {
		return st.Last // never decided
	}
	// A parked time may be near the end of int64.
	reset := algo.BucketReset(st.Level, rate, period)
	if st.Last > math.MaxInt64-reset {
		return math.MaxInt64
	}
	return st.Last + reset
}
