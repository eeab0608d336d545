//go:build !amd64 || race

package limiter

// Without CMPXCHG16B, or under the race detector (which cannot see an atomic
// instruction written in assembly, and so would report the bucket words'
// lock-free readers as racing with the lock holders that write them), buckets are
// decided under their slot's lock like every other algorithm.

func hasCAS128() bool { return false }

// cas128 is never called when hasCAS128 is false.
func cas128(*[2]uint64, uint64, uint64, uint64, uint64) bool {
	panic("limiter: cas128 without CMPXCHG16B")
}
