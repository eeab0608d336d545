// Package algo is the reference implementation of sluice's rate-limit algorithms, in
// whole microseconds: the memory store runs it directly, the Redis store's over-limit
// cache repeats its decisions in-process, and the Redis store's Lua scripts repeat it
// operation for operation, so every store reaches the same decisions to the
// microsecond (the conformance suite in limiter/redisstore checks that).
// Floating-point expressions keep the scripts' order of operations, and explicit
// float64 conversions keep Go from fusing multiply-adds.
package algo

import (
	"math"
	"time"
)

// Never is the retry-after, in µs, of a request larger than the capacity.
const Never = -1

// MaxMicros bounds every quantity that reaches the Redis scripts, whose numbers are
// doubles: integers are exact only below 2^53. It is also where times saturate: a
// time of MaxMicros µs (about 285 years) or more is the longest time.Duration (see
// Duration and Micros), so that a valid limit whose bucket takes longer than a
// time.Duration holds to drain (1 a day with a burst of 2^20: 2,871 years) never
// gives a negative one, and both stores, whose doubles stop being exact there,
// agree on it.
const MaxMicros = 1 << 53

// State is one key's state. Each algorithm uses its own fields; the sliding window
// log keeps its timestamps beside it (TimeLog), so that the state of every other
// algorithm stays small: the memory store keeps it inline in its hash table, beside
// a lock, in one cache line (40 bytes).
type State struct {
	Last int64 // latest time seen, µs; the clock never goes backwards for a key

	// Level is, for the buckets, the units in the virtual queue (capacity minus
	// tokens), never negative; for the sliding window counter, the units counted in
	// the previous window, a whole number below 2^53 and so exact as a float64 (the
	// two never share a key, and sharing the field keeps State in 40 bytes).
	Level float64

	Expires int64 // from this time on the state is equivalent to a fresh one, µs

	Start int64 // windows: start of the current window, µs
	Count int64 // windows: units counted in the current window
}

// Algo is an algorithm as a small number, which the hot paths compare and switch on
// (comparing strings costs more than some of the algorithms).
type Algo uint8

const (
	None Algo = iota // not a valid algorithm
	TokenBucket
	LeakyBucket
	FixedWindow
	SlidingWindowLog
	SlidingWindowCounter
	// Reserve is the waiting rules' leaking bucket (State.reserve); no rules file names
	// it, so Of never returns it.
	Reserve
)

// Of returns the algorithm of a limiter.Algorithm name, or None.
func Of(name string) Algo {
	switch name {
	case "token_bucket":
		return TokenBucket
	case "leaky_bucket":
		return LeakyBucket
	case "fixed_window":
		return FixedWindow
	case "sliding_window_log":
		return SlidingWindowLog
	case "sliding_window_counter":
		return SlidingWindowCounter
	}
	return None
}

// Bucket reports whether a is the token or the leaky bucket.
func (a Algo) Bucket() bool { return a == TokenBucket || a == LeakyBucket }

// Params are a limit's numbers as the algorithms use them.
type Params struct {
	Algorithm Algo
	Rate      int64 // units per period
	Period    int64 // µs
	Capacity  int64
	Forgive   bool
	// Cancel is, for Reserve, the slot of a reservation to give back (the Remaining of
	// its outcome); 0 reserves.
	Cancel int64
}

// Set sets p to the numbers of a limit (a limiter.Limit's fields but its failure
// mode) and reports whether they and n are certainly valid: a cheap sufficient
// condition, so that valid requests, nearly all of them, skip building
// limiter.Limit.Validate's errors; on false the caller validates. (p is filled in
// place: Params are too large to travel in registers, and copying them costs more
// than it seems.)
func (p *Params) Set(name string, rate int64, period time.Duration, burst int64, forgive bool, n int64) bool {
	a := Of(name)
	us := period.Microseconds()
	p.Algorithm, p.Rate, p.Period, p.Forgive = a, rate, us, forgive
	p.Capacity = rate
	if a.Bucket() && burst > 0 {
		p.Capacity = burst // as limiter.Limit.Capacity
	}
	return a != None && n >= 1 && rate > 0 && rate < MaxMicros && period >= time.Microsecond &&
		us < MaxMicros && burst >= 0 && burst < MaxMicros
}

// Outcome is a decision in the algorithms' units (µs).
type Outcome struct {
	Allowed    bool
	Remaining  int64
	RetryAfter int64 // 0 when allowed, Never when n exceeds the capacity
	ResetAfter int64
}

// Duration returns µs as a time.Duration; Never, and any time of MaxMicros or more,
// as the longest one (limiter.Never).
func Duration(us int64) time.Duration {
	if us == Never || us >= MaxMicros {
		return math.MaxInt64
	}
	return time.Duration(us) * time.Microsecond
}

// Micros returns the whole number of µs us (already rounded, not negative) as an
// int64, saturated at MaxMicros: a float64 time may exceed any int64, whose
// conversion then gives a negative number on amd64. Every time the algorithms and
// the Redis scripts compute in floating point goes through it.
func Micros(us float64) int64 {
	if us >= MaxMicros {
		return MaxMicros
	}
	return int64(us)
}

// Decide applies one request of n units at time now (µs) to s; log is the key's
// sliding window log (unused by the other algorithms).
func (s *State) Decide(p *Params, now, n int64, log *TimeLog) Outcome {
	if now < s.Last {
		now = s.Last
	}
	elapsed := now - s.Last
	s.Last = now
	var o Outcome
	switch p.Algorithm {
	case TokenBucket, LeakyBucket:
		o = s.bucket(p, now, elapsed, n)
	case FixedWindow:
		o = s.fixedWindow(p, now, n)
	case SlidingWindowLog:
		o = slidingLog(log, p, now, n)
	case SlidingWindowCounter:
		o = s.slidingCounter(p, now, n)
	case Reserve:
		o = s.reserve(p, now)
	}
	s.Expires = now + o.ResetAfter
	return o
}

// bucket is the token bucket and the leaky bucket (as a meter): level is the content
// of the virtual queue, the token bucket's capacity minus its tokens. It drains by
// rate/period per µs, and a request fits when level+n <= capacity.
func (s *State) bucket(p *Params, now, elapsed, n int64) Outcome {
	capacity, rate, period := float64(p.Capacity), float64(p.Rate), float64(p.Period)
	level := s.Level - float64(float64(elapsed)*rate)/period
	if level < 0 {
		level = 0
	}
	o := Outcome{}
	if level+float64(n) <= capacity {
		o.Allowed = true
		level += float64(n)
	} else if n > p.Capacity {
		o.RetryAfter = Never
	} else {
		o.RetryAfter = Micros(math.Ceil(float64(float64(level+float64(n)-capacity)*period) / rate))
	}
	s.Level = level
	o.Remaining = int64(math.Floor(capacity - level))
	o.ResetAfter = BucketReset(level, p.Rate, p.Period)
	return o
}

// BucketReset is the time, in µs, until a bucket of this level drains at rate per
// period (at most MaxMicros): the ResetAfter of its decisions.
func BucketReset(level float64, rate, period int64) int64 {
	return Micros(math.Ceil(float64(level*float64(period)) / float64(rate)))
}

// fixedWindow counts units per epoch-aligned window.
func (s *State) fixedWindow(p *Params, now, n int64) Outcome {
	start := now - now%p.Period
	if s.Start != start {
		s.Start, s.Count = start, 0
	}
	o := Outcome{}
	switch {
	case s.Count+n <= p.Rate:
		o.Allowed = true
		s.Count += n
	case n > p.Rate:
		o.RetryAfter = Never
	default:
		o.RetryAfter = start + p.Period - now
	}
	o.Remaining = p.Rate - s.Count
	if s.Count > 0 {
		o.ResetAfter = start + p.Period - now
	}
	return o
}

// slidingLog keeps the newest timestamps, at most rate of them.
func slidingLog(log *TimeLog, p *Params, now, n int64) Outcome {
	log.DropThrough(now - p.Period)
	o := Outcome{}
	switch {
	case int64(log.Len())+n <= p.Rate:
		o.Allowed = true
		log.Push(now, n, p.Rate)
	case !p.Forgive:
		log.Push(now, n, p.Rate)
	}
	size := int64(log.Len())
	o.Remaining = max(p.Rate-size, 0)
	if !o.Allowed {
		if n > p.Rate {
			o.RetryAfter = Never
		} else {
			// The request fits once the oldest size+n-rate timestamps have expired.
			o.RetryAfter = log.At(int(size+n-p.Rate-1)) + p.Period - now
		}
	}
	if size > 0 {
		o.ResetAfter = log.At(int(size-1)) + p.Period - now
	}
	return o
}

// slidingCounter weighs the previous window's count by its overlap with the sliding
// window that ends now.
func (s *State) slidingCounter(p *Params, now, n int64) Outcome {
	start := now - now%p.Period
	if s.Start != start {
		if start-s.Start == p.Period {
			s.Level = float64(s.Count) // the previous window's count
		} else {
			s.Level = 0
		}
		s.Start, s.Count = start, 0
	}
	period, prev := float64(p.Period), s.Level
	elapsed := now - start
	used := s.Count + int64(math.Floor(float64(prev*float64(p.Period-elapsed))/period))
	o := Outcome{}
	switch {
	case used+n <= p.Rate:
		o.Allowed = true
		s.Count += n
		used += n
	case n > p.Rate:
		o.RetryAfter = Never
	case s.Count+n <= p.Rate:
		// Only the previous window's share is in the way: wait until it has shrunk so
		// that prev*(period-e)/period < rate-n+1-count.
		room := float64(p.Rate - n + 1 - s.Count)
		e := int64(math.Floor(period-float64(room*period)/prev)) + 1
		o.RetryAfter = start + e - now
	default:
		// The current window itself is full: in the next one it becomes the previous
		// window, and its share must shrink below rate-n+1.
		room := float64(p.Rate - n + 1)
		e := max(int64(math.Floor(period-float64(room*period)/float64(s.Count)))+1, 0)
		o.RetryAfter = start + p.Period + e - now
	}
	o.Remaining = max(p.Rate-used, 0)
	switch {
	case s.Count > 0:
		o.ResetAfter = start + 2*p.Period - now
	case prev > 0:
		o.ResetAfter = start + p.Period - now
	}
	return o
}

// reserve is GCRA's leaking bucket as a reservation: Start is the key's theoretical
// arrival time (TAT), the start of the next free slot; slots are Period µs apart and
// a reservation may start at most Capacity µs from now. A reservation takes the slot
// at max(TAT, now) and moves TAT one Period on; a refused one (its slot would start
// later than Capacity from now) changes nothing. A cancel (p.Cancel, the TAT a
// reservation returned) moves TAT back one Period if no reservation was made after
// it, which frees its slot for the next caller; otherwise its slot stays taken and
// is skipped, so that no slot is ever given twice.
//
// The outcome's fields mean other things here, so that Outcome stays as small as the
// other algorithms' hot paths want it: RetryAfter is the wait until the slot,
// allowed or not; ResetAfter the time until TAT; Remaining the TAT itself (µs), by
// which a Cancel names the reservation (see ReserveRemaining for the reservations
// still possible).
func (s *State) reserve(p *Params, now int64) Outcome {
	o := Outcome{}
	if p.Cancel != 0 {
		if s.Start == p.Cancel {
			s.Start -= p.Period
		}
		o.Allowed = true
	} else {
		start := max(s.Start, now)
		o.RetryAfter = start - now
		if o.RetryAfter <= p.Capacity {
			o.Allowed = true
			s.Start = start + p.Period
		}
	}
	o.ResetAfter = max(s.Start-now, 0)
	o.Remaining = s.Start
	return o
}

// ReserveRemaining is how many reservations would still succeed at once when the
// next free slot is ahead µs away, with slots interval µs apart and a longest wait
// of maxWait µs. (The Redis script computes the same doubles.)
func ReserveRemaining(ahead, interval, maxWait int64) int64 {
	if ahead > maxWait {
		return 0
	}
	return int64(math.Floor(float64(maxWait-ahead)/float64(interval))) + 1
}
