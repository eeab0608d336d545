package limiter

import (
	"encoding/binary"
	"math"

	"github.com/redis/go-redis/v9"
)

// The Redis store's scripts. Each repeats its algorithm in algorithm.go operation for
// operation: Lua numbers are doubles, and the same IEEE operations in the same order
// give the same results, so both stores decide identically to the microsecond. Every
// quantity is an integer below 2^53 (Limit.Validate and Redis.AllowN make sure), so
// integer arithmetic on doubles is exact. Remainders use math.fmod, which is exact and
// has the sign of the dividend like Go's %, where Lua's a%b (a-floor(a/b)*b) rounds.
//
// Numbers cross between Go, Lua and Redis without losing a bit: the arguments and
// the stored state are doubles packed with struct.pack('<d...') (Redis' Lua has the
// struct library), which also spares the scripts most string conversions (a script's
// cost is mostly its calls and conversions). The sliding log's timestamps are
// decimal integers. A fraction returned to Go is formatted with %.17g, which
// round-trips every double (Lua's own tostring, %.14g, would not).
//
// ARGV, common to every script:
//
//	1 now, µs since the Unix epoch, in decimal, or "" for the Redis server's TIME
//	2 packed '<dddddd': n, rate, period (µs), capacity, grace (ms added to every
//	  TTL), forgive (1 or 0)
//
// Every script returns {allowed (1/0), remaining, retryAfter (µs, -1 for never),
// resetAfter (µs), now (µs, after clamping)}, and after a rejection the state the
// over-limit cache needs (see each script).
//
// Each key's TTL is at least its decision's resetAfter (rounded up to the
// millisecond) plus the grace, so an idle key vanishes once its state would be a fresh
// key's. The grace keeps the latest time seen a little longer, so a clock that steps
// back by less than the grace still cannot grant quota twice.

// scriptPrelude reads the arguments and the time. (Helpers are written out in each
// script rather than defined as Lua functions: closures cost on every call.) A TTL is
// string.format('%d', math.floor(reset / 1000) + 1 + grace).
const scriptPrelude = `
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local n, rate, period, capacity, grace, forgive = struct.unpack('<dddddd', ARGV[2])
`

// bucketScript is state.bucket, for the token and the leaky bucket. KEYS[1] holds
// packed '<dd': the latest time seen and the level. ARGV[3], optional, is the
// over-limit cache's write-back: packed '<dddd': the last and level the cache copied
// from this key, and the last and level to use instead if the key still holds those
// (its state after rejections the cache decided without Redis; see overLimitCache).
// Extra results after a rejection: the level, formatted %.17g.
var bucketScript = redis.NewScript(scriptPrelude + `
local last, level = 0, 0
local v = redis.call('GET', KEYS[1])
if v then last, level = struct.unpack('<dd', v) end
if ARGV[3] then
  local casLast, casLevel, newLast, newLevel = struct.unpack('<dddd', ARGV[3])
  if last == casLast and level == casLevel then last, level = newLast, newLevel end
end
if now < last then now = last end
local elapsed = now - last
level = level - (elapsed * rate) / period
if level < 0 then level = 0 end
local allowed, retry = 0, 0
if level + n <= capacity then
  allowed = 1
  level = level + n
elseif n > capacity then
  retry = -1
else
  retry = math.ceil(((level + n - capacity) * period) / rate)
end
local remaining = math.floor(capacity - level)
local reset = math.ceil((level * period) / rate)
redis.call('SET', KEYS[1], struct.pack('<dd', now, level),
  'PX', string.format('%d', math.floor(reset / 1000) + 1 + grace))
if allowed == 1 then return {1, remaining, 0, reset, now} end
return {0, remaining, retry, reset, now, string.format('%.17g', level)}
`)

// fixedWindowScript is state.fixedWindow. KEYS[1] holds packed '<ddd': the latest
// time seen, the window's start and its count. Extra results after a rejection:
// start, count.
var fixedWindowScript = redis.NewScript(scriptPrelude + `
local last, start, count = 0, 0, 0
local v = redis.call('GET', KEYS[1])
if v then last, start, count = struct.unpack('<ddd', v) end
if now < last then now = last end
local ws = now - math.fmod(now, period)
if start ~= ws then
  start = ws
  count = 0
end
local allowed, retry = 0, 0
if count + n <= rate then
  allowed = 1
  count = count + n
elseif n > rate then
  retry = -1
else
  retry = ws + period - now
end
local remaining = rate - count
local reset = 0
if count > 0 then reset = ws + period - now end
redis.call('SET', KEYS[1], struct.pack('<ddd', now, start, count),
  'PX', string.format('%d', math.floor(reset / 1000) + 1 + grace))
if allowed == 1 then return {1, remaining, 0, reset, now} end
return {0, remaining, retry, reset, now, start, count}
`)

// slidingCounterScript is state.slidingCounter. KEYS[1] holds packed '<dddd': the
// latest time seen, the current window's start, its count and the previous window's
// count. Extra results after a rejection: start, count, prev.
var slidingCounterScript = redis.NewScript(scriptPrelude + `
local last, start, count, prev = 0, 0, 0, 0
local v = redis.call('GET', KEYS[1])
if v then last, start, count, prev = struct.unpack('<dddd', v) end
if now < last then now = last end
local ws = now - math.fmod(now, period)
if start ~= ws then
  if ws - start == period then prev = count else prev = 0 end
  start = ws
  count = 0
end
local elapsed = now - ws
local used = count + math.floor((prev * (period - elapsed)) / period)
local allowed, retry = 0, 0
if used + n <= rate then
  allowed = 1
  count = count + n
  used = used + n
elseif n > rate then
  retry = -1
elseif count + n <= rate then
  local room = rate - n + 1 - count
  local e = math.floor(period - (room * period) / prev) + 1
  retry = ws + e - now
else
  local room = rate - n + 1
  local e = math.max(math.floor(period - (room * period) / count) + 1, 0)
  retry = ws + period + e - now
end
local remaining = math.max(rate - used, 0)
local reset = 0
if count > 0 then
  reset = ws + 2 * period - now
elseif prev > 0 then
  reset = ws + period - now
end
redis.call('SET', KEYS[1], struct.pack('<dddd', now, start, count, prev),
  'PX', string.format('%d', math.floor(reset / 1000) + 1 + grace))
if allowed == 1 then return {1, remaining, 0, reset, now} end
return {0, remaining, retry, reset, now, start, count, prev}
`)

// slidingLogScript is state.slidingLog. KEYS[1] is a list of timestamps (decimal
// µs), oldest first, non-decreasing (times are clamped); KEYS[2] holds packed '<d':
// the latest time seen. A request's n timestamps are pushed in chunks (unpack is
// bounded by Lua's C stack) and the list trimmed to the newest rate entries. Extra
// results, for a rejection the cache may remember (ForgiveRejected, finite
// retry-after): the log's size, its newest timestamp and its oldest timestamps, at
// most logPrefix of them.
var slidingLogScript = redis.NewScript(scriptPrelude + `
local last = 0
local v = redis.call('GET', KEYS[2])
if v then last = struct.unpack('<d', v) end
if now < last then now = last end
local cutoff = now - period
local size = redis.call('LLEN', KEYS[1])
if size > 0 then
  if tonumber(redis.call('LINDEX', KEYS[1], -1)) <= cutoff then
    redis.call('DEL', KEYS[1])
    size = 0
  else
    while tonumber(redis.call('LINDEX', KEYS[1], 0)) <= cutoff do
      redis.call('LPOP', KEYS[1])
      size = size - 1
    end
  end
end
local allowed, retry = 0, 0
local push = false
if size + n <= rate then
  allowed = 1
  push = true
elseif forgive == 0 then
  push = true
end
if push then
  local ts = string.format('%d', now)
  local left = math.min(n, rate)
  local chunk = {}
  for i = 1, math.min(left, 512) do chunk[i] = ts end
  while left > 0 do
    local c = math.min(left, 512)
    redis.call('RPUSH', KEYS[1], unpack(chunk, 1, c))
    left = left - c
  end
  redis.call('LTRIM', KEYS[1], string.format('%d', -rate), -1)
  size = redis.call('LLEN', KEYS[1])
end
local remaining = math.max(rate - size, 0)
if allowed == 0 then
  if n > rate then
    retry = -1
  else
    retry = tonumber(redis.call('LINDEX', KEYS[1], string.format('%d', size + n - rate - 1))) + period - now
  end
end
local reset = 0
local newest = 0
local ttl = string.format('%d', math.floor(reset / 1000) + 1 + grace)
if size > 0 then
  newest = tonumber(redis.call('LINDEX', KEYS[1], -1))
  reset = newest + period - now
  ttl = string.format('%d', math.floor(reset / 1000) + 1 + grace)
  redis.call('PEXPIRE', KEYS[1], ttl)
end
redis.call('SET', KEYS[2], struct.pack('<d', now), 'PX', ttl)
local out = {allowed, remaining, retry, reset, now}
if allowed == 0 and forgive == 1 and retry >= 0 then
  out[6] = size
  out[7] = newest
  local head = redis.call('LRANGE', KEYS[1], 0, ` + logPrefixLua + ` - 1)
  for i = 1, #head do out[7 + i] = tonumber(head[i]) end
end
return out
`)

// logPrefix is how many of a sliding log's oldest timestamps a rejection returns for
// the over-limit cache.
const (
	logPrefix    = 32
	logPrefixLua = "32"
)

// packedArgs is an argument of packed little-endian doubles, as struct.unpack('<d…')
// reads them. Requests keep theirs and pass pointers, which go-redis writes through
// MarshalBinary without allocating.
type packedArgs struct {
	n   int
	buf [6 * 8]byte
}

func (p *packedArgs) MarshalBinary() ([]byte, error) { return p.buf[:p.n], nil }

func (p *packedArgs) reset() { p.n = 0 }

func (p *packedArgs) add(v float64) {
	binary.LittleEndian.PutUint64(p.buf[p.n:], math.Float64bits(v))
	p.n += 8
}
