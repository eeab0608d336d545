package limiter

import (
	"fmt"
	"math"
	"time"
)

// This file is the reference implementation of the algorithms: the memory store runs it
// directly and the Lua scripts of the Redis store repeat it operation for operation, so
// both stores reach the same decisions to the microsecond (the conformance suite checks
// that). Floating-point expressions keep the scripts' order of operations, and explicit
// float64 conversions keep Go from fusing multiply-adds.

// never is the retry-after, in µs, of a request larger than the capacity.
const never = -1

// state is one key's state. Each algorithm uses its own fields; the sliding window
// log keeps its timestamps beside it (timeLog), so that the state of every other
// algorithm stays small: the memory store keeps it inline in its hash table.
type state struct {
	last    int64 // latest time seen, µs; the clock never goes backwards for a key
	expires int64 // from this time on the state is equivalent to a fresh one, µs

	level float64 // buckets: units in the virtual queue (capacity minus tokens)

	start int64 // windows: start of the current window, µs
	count int64 // windows: units counted in the current window
	prev  int64 // sliding window counter: units counted in the previous window
}

// algo is an Algorithm as a small number, which the hot paths compare and switch on
// (comparing strings costs more than some of the algorithms).
type algo uint8

const (
	noAlgo algo = iota // not a valid algorithm
	algoTokenBucket
	algoLeakyBucket
	algoFixedWindow
	algoSlidingWindowLog
	algoSlidingWindowCounter
)

func algoOf(a Algorithm) algo {
	switch a {
	case TokenBucket:
		return algoTokenBucket
	case LeakyBucket:
		return algoLeakyBucket
	case FixedWindow:
		return algoFixedWindow
	case SlidingWindowLog:
		return algoSlidingWindowLog
	case SlidingWindowCounter:
		return algoSlidingWindowCounter
	}
	return noAlgo
}

func (a algo) bucket() bool { return a == algoTokenBucket || a == algoLeakyBucket }

// params are a Limit's numbers as the algorithms use them.
type params struct {
	algorithm algo
	rate      int64 // units per period
	period    int64 // µs
	capacity  int64
	forgive   bool
}

// from checks a request of n units under l (see Limit.Validate) and sets p to l's
// params. Its first test is a cheap sufficient condition for validity, so that valid
// requests, nearly all of them, skip building Validate's errors. (p is filled in
// place: params are too large to travel in registers, and copying them costs more
// than it seems.)
func (p *params) from(l *Limit, n int64) error {
	a := algoOf(l.Algorithm)
	period := l.Period.Microseconds()
	if a == noAlgo || n < 1 || l.Rate <= 0 || l.Rate >= maxMicros || l.Period < time.Microsecond ||
		period >= maxMicros || l.Burst < 0 || l.Burst >= maxMicros || !l.FailureMode.known() {
		if err := checkRequest(*l, n); err != nil {
			return err
		}
	}
	p.algorithm, p.rate, p.period, p.forgive = a, l.Rate, period, l.ForgiveRejected
	p.capacity = l.Rate
	if a.bucket() && l.Burst > 0 {
		p.capacity = l.Burst // as Limit.Capacity
	}
	return nil
}

func checkRequest(l Limit, n int64) error {
	if n < 1 {
		return fmt.Errorf("%w: n must be at least 1, got %d", ErrInvalidLimit, n)
	}
	return l.Validate()
}

// outcome is a decision in the algorithms' units (µs).
type outcome struct {
	allowed    bool
	remaining  int64
	retryAfter int64 // 0 when allowed, never when n exceeds the capacity
	resetAfter int64
}

func (o outcome) decision(capacity int64) Decision {
	var d Decision
	o.fill(&d, capacity)
	return d
}

// fill sets d to o. Writing a Decision field by field spares the hot paths a copy of
// the whole struct, whose wide loads stall on the narrow stores that built it.
func (o outcome) fill(d *Decision, capacity int64) {
	d.Allowed = o.allowed
	d.Limit = capacity
	d.Remaining = o.remaining
	d.RetryAfter = micros(o.retryAfter)
	d.ResetAfter = micros(o.resetAfter)
}

func micros(us int64) time.Duration {
	if us == never {
		return Never
	}
	return time.Duration(us) * time.Microsecond
}

// decide applies one request of n units at time now (µs) to s; log is the key's
// sliding window log (unused by the other algorithms).
func (s *state) decide(p *params, now, n int64, log *timeLog) outcome {
	if now < s.last {
		now = s.last
	}
	elapsed := now - s.last
	s.last = now
	var o outcome
	switch p.algorithm {
	case algoTokenBucket, algoLeakyBucket:
		o = s.bucket(p, now, elapsed, n)
	case algoFixedWindow:
		o = s.fixedWindow(p, now, n)
	case algoSlidingWindowLog:
		o = slidingLog(log, p, now, n)
	case algoSlidingWindowCounter:
		o = s.slidingCounter(p, now, n)
	}
	s.expires = now + o.resetAfter
	return o
}

// bucket is the token bucket and the leaky bucket (as a meter): level is the content
// of the virtual queue, the token bucket's capacity minus its tokens. It drains by
// rate/period per µs, and a request fits when level+n <= capacity.
func (s *state) bucket(p *params, now, elapsed, n int64) outcome {
	capacity, rate, period := float64(p.capacity), float64(p.rate), float64(p.period)
	level := s.level - float64(float64(elapsed)*rate)/period
	if level < 0 {
		level = 0
	}
	o := outcome{}
	if level+float64(n) <= capacity {
		o.allowed = true
		level += float64(n)
	} else if n > p.capacity {
		o.retryAfter = never
	} else {
		o.retryAfter = int64(math.Ceil(float64(float64(level+float64(n)-capacity)*period) / rate))
	}
	s.level = level
	o.remaining = int64(math.Floor(capacity - level))
	o.resetAfter = int64(math.Ceil(float64(level*period) / rate))
	return o
}

// fixedWindow counts units per epoch-aligned window.
func (s *state) fixedWindow(p *params, now, n int64) outcome {
	start := now - now%p.period
	if s.start != start {
		s.start, s.count = start, 0
	}
	o := outcome{}
	switch {
	case s.count+n <= p.rate:
		o.allowed = true
		s.count += n
	case n > p.rate:
		o.retryAfter = never
	default:
		o.retryAfter = start + p.period - now
	}
	o.remaining = p.rate - s.count
	if s.count > 0 {
		o.resetAfter = start + p.period - now
	}
	return o
}

// slidingLog keeps the newest timestamps, at most rate of them.
func slidingLog(log *timeLog, p *params, now, n int64) outcome {
	log.dropThrough(now - p.period)
	o := outcome{}
	switch {
	case int64(log.len())+n <= p.rate:
		o.allowed = true
		log.push(now, n, p.rate)
	case !p.forgive:
		log.push(now, n, p.rate)
	}
	size := int64(log.len())
	o.remaining = max(p.rate-size, 0)
	if !o.allowed {
		if n > p.rate {
			o.retryAfter = never
		} else {
			// The request fits once the oldest size+n-rate timestamps have expired.
			o.retryAfter = log.at(int(size+n-p.rate-1)) + p.period - now
		}
	}
	if size > 0 {
		o.resetAfter = log.at(int(size-1)) + p.period - now
	}
	return o
}

// slidingCounter weighs the previous window's count by its overlap with the sliding
// window that ends now.
func (s *state) slidingCounter(p *params, now, n int64) outcome {
	start := now - now%p.period
	if s.start != start {
		if start-s.start == p.period {
			s.prev = s.count
		} else {
			s.prev = 0
		}
		s.start, s.count = start, 0
	}
	period := float64(p.period)
	elapsed := now - start
	used := s.count + int64(math.Floor(float64(float64(s.prev)*float64(p.period-elapsed))/period))
	o := outcome{}
	switch {
	case used+n <= p.rate:
		o.allowed = true
		s.count += n
		used += n
	case n > p.rate:
		o.retryAfter = never
	case s.count+n <= p.rate:
		// Only the previous window's share is in the way: wait until it has shrunk so
		// that prev*(period-e)/period < rate-n+1-count.
		room := float64(p.rate - n + 1 - s.count)
		e := int64(math.Floor(period-float64(room*period)/float64(s.prev))) + 1
		o.retryAfter = start + e - now
	default:
		// The current window itself is full: in the next one it becomes the previous
		// window, and its share must shrink below rate-n+1.
		room := float64(p.rate - n + 1)
		e := max(int64(math.Floor(period-float64(room*period)/float64(s.count)))+1, 0)
		o.retryAfter = start + p.period + e - now
	}
	o.remaining = max(p.rate-used, 0)
	switch {
	case s.count > 0:
		o.resetAfter = start + 2*p.period - now
	case s.prev > 0:
		o.resetAfter = start + p.period - now
	}
	return o
}
