package redisstore

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// reserveScript is algo.State.reserve, the waiting rules' leaking bucket (GCRA), one
// reservation per call. KEYS[1] holds packed '<dd': the latest time seen and the
// theoretical arrival time (TAT, the start of the next free slot), µs. ARGV[1] is now
// as in the other scripts ("" for TIME); ARGV[2] is packed '<dddd': the interval
// between slots and the longest wait (µs), the slot to give back (0 reserves; see
// limiter.Reserver.Cancel) and the grace (ms added to the TTL). It returns packed
// '<ddddd': reserved (1/0), wait (µs until the slot), remaining, resetAfter (µs
// until TAT) and the slot (the TAT after the call). The TTL runs until TAT plus the
// grace: past TAT the key is a fresh one.
var reserveScript = redis.NewScript(luaNow + `
local interval, maxwait, cancel, grace = struct.unpack('<dddd', ARGV[2])
local last, tat = 0, 0
local v = redis.call('GET', KEYS[1])
if v then last, tat = struct.unpack('<dd', v) end
if now < last then now = last end
local ok, wait = 0, 0
if cancel ~= 0 then
  if tat == cancel then tat = tat - interval end
  ok = 1
else
  local start = tat
  if start < now then start = now end
  wait = start - now
  if wait <= maxwait then
    ok = 1
    tat = start + interval
  end
end
local ahead = tat - now
if ahead < 0 then ahead = 0 end
local remaining = 0
if ahead <= maxwait then remaining = math.floor((maxwait - ahead) / interval) + 1 end
redis.call('SET', KEYS[1], struct.pack('<dd', now, tat),
  'PX', string.format('%d', math.floor(ahead / 1000) + 1 + grace))
return struct.pack('<ddddd', ok, wait, remaining, ahead, tat)
`)

// Reserve implements limiter.Reserver on Redis: one script call on the hash-tagged
// key "<prefix>{<key>}:rsv", so every replica reserves from one leaking bucket per
// key. It is bounded by the store's timeout; when Redis fails, is slow or is down,
// it follows p.FailureMode as AllowN does (FailLocal reserves in the in-process
// store, FailOpen reserves a slot that starts now, FailClosed refuses with a wait of
// one second past p.MaxWait). Its only errors are about an invalid pace.
func (r *Store) Reserve(ctx context.Context, key string, p limiter.Pace) (limiter.Reservation, error) {
	if err := p.Validate(); err != nil {
		return limiter.Reservation{}, err
	}
	rkey := r.reserveKey(key)
	if !r.down.Load() && !r.stopped.Load() {
		res, err := r.reserve(ctx, rkey, p, 0)
		if err == nil {
			return res, nil
		}
		if ctx.Err() == nil {
			r.failed(err)
		}
	}
	mode := p.FailureMode
	if mode == "" {
		mode = limiter.FailLocal
	}
	r.fallbacks.Add(1)
	r.fallbackTotal[mode].Inc()
	switch mode {
	case limiter.FailOpen:
		return limiter.Reservation{OK: true}, nil
	case limiter.FailClosed:
		return limiter.Reservation{Wait: p.MaxWait + closedRetryAfter}, nil
	}
	res, err := r.local.Reserve(ctx, rkey, p)
	res.Slot = -res.Slot // a local slot: Cancel gives it back to the local store
	return res, err
}

// Cancel implements limiter.Reserver. A reservation made while Redis was down is
// given back to the in-process store; a cancel that Redis does not take is dropped
// (its slot is skipped, as when a later reservation exists).
func (r *Store) Cancel(ctx context.Context, key string, p limiter.Pace, res limiter.Reservation) error {
	if err := p.Validate(); err != nil {
		return err
	}
	if !res.OK || res.Slot == 0 {
		return nil
	}
	rkey := r.reserveKey(key)
	if res.Slot < 0 {
		res.Slot = -res.Slot
		return r.local.Cancel(ctx, rkey, p, res)
	}
	if r.down.Load() || r.stopped.Load() {
		return nil
	}
	if _, err := r.reserve(ctx, rkey, p, res.Slot); err != nil && ctx.Err() == nil {
		r.failed(err)
	}
	return nil
}

// reserveKey is the Redis key of a reservation bucket.
func (r *Store) reserveKey(key string) string {
	b := make([]byte, 0, len(r.prefix)+len(key)+7)
	b = append(b, r.prefix...)
	b = append(b, '{')
	b = appendHashTag(b, key)
	b = append(b, "}:rsv"...)
	return string(b)
}

// reserve runs reserveScript on rkey within the store's timeout.
func (r *Store) reserve(ctx context.Context, rkey string, p limiter.Pace, cancel int64) (limiter.Reservation, error) {
	ctx, stop := context.WithTimeout(ctx, r.timeout)
	defer stop()
	now := ""
	if r.clock != nil {
		now = strconv.FormatInt(r.clock().UnixMicro(), 10)
	}
	var args packedArgs
	args.add(float64(p.Interval.Microseconds()))
	args.add(float64(p.MaxWait.Microseconds()))
	args.add(float64(cancel))
	args.add(float64(r.grace))
	v, err := reserveScript.Run(ctx, r.client, []string{rkey}, now, &args).Result()
	if err != nil {
		return limiter.Reservation{}, err
	}
	s, ok := v.(string)
	if !ok || len(s) != 5*8 {
		return limiter.Reservation{}, fmt.Errorf("%w: %T of %d bytes", errReply, v, len(s))
	}
	f := func(i int) float64 { return math.Float64frombits(littleEndian64(s[8*i:])) }
	return limiter.Reservation{OK: f(0) == 1, Wait: algo.Duration(algo.Micros(f(1))), Remaining: int64(f(2)),
		ResetAfter: algo.Duration(algo.Micros(f(3))), Slot: int64(f(4))}, nil
}
