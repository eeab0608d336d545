package redisstore

import (
	"encoding/binary"
	"math"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter/internal/algo"
)

// The Redis store's scripts. Each repeats its algorithm in limiter/internal/algo
// operation for operation: Lua numbers are doubles, and the same IEEE operations in the same order
// give the same results, so both stores decide identically to the microsecond. Every
// quantity is an integer below 2^53 (Limit.Validate and Store.AllowN make sure), so
// integer arithmetic on doubles is exact. Remainders use math.fmod, which is exact and
// has the sign of the dividend like Go's %, where Lua's a%b (a-floor(a/b)*b) rounds.
//
// Numbers cross between Go, Lua and Redis without losing a bit: the arguments and
// the stored state are doubles packed with struct.pack('<d...') (Redis' Lua has the
// struct library), which also spares the scripts most string conversions (a script's
// cost is mostly its calls and conversions), and so are the replies. The sliding
// log's timestamps are decimal integers.
//
// An algorithm's many-decision script makes any number of decisions of it, in order,
// in one EVALSHA: the Redis store merges the decisions of a pipeline that share a
// script, which spares Redis a third of its work per decision (the EVALSHA itself
// and TIME cost about as much as the GET and SET). A script is atomic, so each of
// its decisions still is. A Cluster runs only scripts whose keys share a slot:
// there, and on any client but a standalone or Sentinel one, the store sends one
// decision per script. A call of one decision runs the algorithm's one-decision
// script (see script), the same body without the loop.
//
// ARGV holds one argument per decision i, ARGV[i], packed '<dddddd…':
//
//	n, rate, period (µs), capacity, grace (ms added to every TTL), forgive (1 or 0);
//	then, with an injected clock, now (µs since the Unix epoch), which 48 bytes
//	alone mean the Redis server's TIME instead (read once per script: the
//	decisions of one script are made at one time, and all have a now or none has);
//	then, after now, the bucket's write-back if any (see bucketScript)
//
// and KEYS one key per decision (two for the sliding log). (Each argument costs
// Redis a string to parse and one for Lua: one a decision costs less than three.) A many-decision script
// returns an array with, per decision, packed '<ddddd…': allowed (1/0), remaining, retryAfter
// (µs, -1 for never), resetAfter (µs), now (µs, after clamping), and after a
// rejection the state the over-limit cache needs (see each script); or an error
// about that decision alone (a key holding another type, say): each decision runs
// under pcall. A one-decision script returns the packed string itself, or fails.
// (One packed string costs Redis less to reply, and Go less to read, than an array
// of integers.)
//
// Times are computed so that they stay exact: absolute times are subtracted from
// one another before a period is added (an absolute time plus a long period may
// exceed 2^53), and a time that reaches algo.MaxMicros anyway, exact or not, is as
// long as any (algo.Duration), which the bucket's script, whose drain time may be
// about 2^106 µs, caps in Lua for its TTL (Redis refuses a SET whose PX overflows).
//
// Each key's TTL is at least its decision's resetAfter (rounded up to the
// millisecond) plus the grace, so an idle key vanishes once its state would be a fresh
// key's. The grace keeps the latest time seen a little longer, so a clock that steps
// back by less than the grace still cannot grant quota twice. On the server's clock
// a TTL is set a quarter longer than that and kept while it is long enough, so a key
// may outlive its state by up to a quarter of its TTL more, or for as long as an
// earlier decision on it needed (see luaStore). A bucket's, a fixed window's and a
// sliding counter's state ends with the deadline its TTL was last set to (ms on the
// server's clock, 0 for none); state written without it (before the scripts recorded
// it) is read as having none, and scripts that do not know it read the fields before
// it as ever.

// script is an algorithm's two scripts: many decides any number of decisions, as
// above; one decides exactly one, and returns its packed reply itself rather than
// in an array, or fails with the decision's error. A call of one decision (a lone
// caller, a Cluster) sends one: without the loop, the closure, pcall and the
// array, Redis spends less on it and Go reads it without allocating the array.
type script struct {
	many, one *redis.Script
}

// newScript makes an algorithm's scripts from the body of one decision: the body
// of a Lua function of i, which sees the decision's now and unpacked arguments and
// returns its reply. (Helpers are written out in each body rather than defined as
// Lua functions: calls cost.) A TTL is
// string.format('%d', math.floor(reset / 1000) + 1 + grace).
func newScript(body string) *script {
	return &script{many: redis.NewScript(`
local time, clock
if #ARGV[1] <= 48 then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  time = t[1] * 1000000 + t[2]
  if redis.REDIS_VERSION_NUM then clock = math.floor(time / 1000) - 1 end
end
local function decide(i)
local a = ARGV[i]
local n, rate, period, capacity, grace, forgive = struct.unpack('<dddddd', a)
local now = time
if #a > 48 then now = struct.unpack('<d', a, 49) end
` + body + `
end
local out = {}
for i = 1, #ARGV do
  local ok, res = pcall(decide, i)
  if not ok and (type(res) ~= 'table' or not res.err) then res = {err = tostring(res)} end
  out[i] = res
end
return out
`), one: redis.NewScript(`
local i, a = 1, ARGV[1]
local n, rate, period, capacity, grace, forgive = struct.unpack('<dddddd', a)
local now, clock
if #a > 48 then
  now = struct.unpack('<d', a, 49)
else
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
  if redis.REDIS_VERSION_NUM then clock = math.floor(now / 1000) - 1 end
end
` + body)}
}

// luaNow starts the reservation script: now is ARGV[1], µs, or when it is empty
// the Redis server's TIME.
const luaNow = `
local now = tonumber(ARGV[1])
if not now then
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end`

// bucketScript is algo.State.bucket, for the token and the leaky bucket. KEYS[i]
// holds packed '<ddd': the latest time seen, the level and the TTL's deadline.
// ARGV[i]'s 32 bytes after now, if any, are the over-limit cache's write-back:
// packed '<dddd': the last and level the cache copied from this key, and the last and
// level to use instead if the key still holds those (its state after rejections the
// cache decided without Redis; see overLimitCache).
// Extra results after a rejection: the level.
var bucketScript = newScript(`
local last, level, deadline = 0, 0, 0
local v = redis.call('GET', KEYS[i])
if v then
  if #v < 24 then last, level = struct.unpack('<dd', v) else last, level, deadline = struct.unpack('<ddd', v) end
end
if #a > 56 then
  local casLast, casLevel, newLast, newLevel = struct.unpack('<dddd', a, 57)
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
  retry = math.min(math.ceil(((level + n - capacity) * period) / rate), ` + maxMicrosLua + `)
end
local remaining = math.floor(capacity - level)
local reset = math.min(math.ceil((level * period) / rate), ` + maxMicrosLua + `)
` + luaStore("<ddd", "now, level") + `if allowed == 1 then return struct.pack('<ddddd', 1, remaining, 0, reset, now) end
return struct.pack('<dddddd', 0, remaining, retry, reset, now, level)
`)

// fixedWindowScript is algo.State.fixedWindow. KEYS[i] holds packed '<dddd': the latest
// time seen, the window's start, its count and the TTL's deadline. Extra results after a rejection:
// start, count.
var fixedWindowScript = newScript(`
local last, start, count, deadline = 0, 0, 0, 0
local v = redis.call('GET', KEYS[i])
if v then
  if #v < 32 then last, start, count = struct.unpack('<ddd', v) else last, start, count, deadline = struct.unpack('<dddd', v) end
end
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
  retry = (ws - now) + period
end
local remaining = rate - count
local reset = 0
if count > 0 then reset = (ws - now) + period end
` + luaStore("<dddd", "now, start, count") + `if allowed == 1 then return struct.pack('<ddddd', 1, remaining, 0, reset, now) end
return struct.pack('<ddddddd', 0, remaining, retry, reset, now, start, count)
`)

// slidingCounterScript is algo.State.slidingCounter. KEYS[i] holds packed '<ddddd': the
// latest time seen, the current window's start, its count, the previous window's
// count and the TTL's deadline. Extra results after a rejection: start, count, prev.
var slidingCounterScript = newScript(`
local last, start, count, prev, deadline = 0, 0, 0, 0, 0
local v = redis.call('GET', KEYS[i])
if v then
  if #v < 40 then last, start, count, prev = struct.unpack('<dddd', v) else last, start, count, prev, deadline = struct.unpack('<ddddd', v) end
end
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
  retry = (ws - now) + e
else
  local room = rate - n + 1
  local e = math.max(math.floor(period - (room * period) / count) + 1, 0)
  retry = (ws - now) + period + e
end
local remaining = math.max(rate - used, 0)
local reset = 0
if count > 0 then
  reset = (ws - now) + 2 * period
elseif prev > 0 then
  reset = (ws - now) + period
end
` + luaStore("<ddddd", "now, start, count, prev") + `if allowed == 1 then return struct.pack('<ddddd', 1, remaining, 0, reset, now) end
return struct.pack('<dddddddd', 0, remaining, retry, reset, now, start, count, prev)
`)

// slidingLogScript is algo.State.slidingLog. Its keys are two per decision: list
// (KEYS[2i-1]) is a list of timestamps (decimal µs), oldest first, non-decreasing
// (times are clamped); seen (KEYS[2i]) holds packed '<d': the latest time seen. A request's n timestamps are pushed in chunks (unpack is
// bounded by Lua's C stack) and the list trimmed to the newest rate entries. Extra
// results, for a rejection the cache may remember (ForgiveRejected, finite
// retry-after): the log's size, its newest timestamp and its oldest timestamps, at
// most logPrefix of them.
var slidingLogScript = newScript(`
local list, seen = KEYS[2 * i - 1], KEYS[2 * i]
local last = 0
local v = redis.call('GET', seen)
if v then last = struct.unpack('<d', v) end
if now < last then now = last end
local cutoff = now - period
local size = redis.call('LLEN', list)
if size > 0 then
  if tonumber(redis.call('LINDEX', list, -1)) <= cutoff then
    redis.call('DEL', list)
    size = 0
  else
    while tonumber(redis.call('LINDEX', list, 0)) <= cutoff do
      redis.call('LPOP', list)
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
  for j = 1, math.min(left, 512) do chunk[j] = ts end
  while left > 0 do
    local c = math.min(left, 512)
    redis.call('RPUSH', list, unpack(chunk, 1, c))
    left = left - c
  end
  redis.call('LTRIM', list, string.format('%d', -rate), -1)
  size = redis.call('LLEN', list)
end
local remaining = math.max(rate - size, 0)
if allowed == 0 then
  if n > rate then
    retry = -1
  else
    retry = (tonumber(redis.call('LINDEX', list, string.format('%d', size + n - rate - 1))) - now) + period
  end
end
local reset = 0
local newest = 0
local ttl = string.format('%d', math.floor(reset / 1000) + 1 + grace)
if size > 0 then
  newest = tonumber(redis.call('LINDEX', list, -1))
  reset = (newest - now) + period
  ttl = string.format('%d', math.floor(reset / 1000) + 1 + grace)
  redis.call('PEXPIRE', list, ttl)
end
redis.call('SET', seen, struct.pack('<d', now), 'PX', ttl)
local reply = {allowed, remaining, retry, reset, now}
if allowed == 0 and forgive == 1 and retry >= 0 then
  reply[6] = size
  reply[7] = newest
  local head = redis.call('LRANGE', list, 0, ` + logPrefixLua + ` - 1)
  for j = 1, #head do reply[7 + j] = tonumber(head[j]) end
end
return struct.pack('<' .. string.rep('d', #reply), unpack(reply))
`)

// luaStore writes a bucket's or a window's state, the Lua variables named by fields
// followed by the key's deadline, packed per pack, to KEYS[i], with the TTL of a
// decision whose state becomes a fresh key's after reset (µs): reset rounded up to
// the ms plus the grace. Setting a TTL costs Redis about a fifth of a decision (SET
// without KEEPTTL removes the key's expiry and adds it back), so with the server's
// clock (clock: TIME in ms, less 1 ms) the script sets the TTL a quarter longer than
// needed and records the deadline it set (deadline, ms on the server's clock), and
// while a decision needs no later deadline, it keeps the TTL (KEEPTTL). The recorded
// deadline errs early: Redis counts a TTL from the command's time, which is no earlier
// than the script's start, itself at most 1 ms before TIME's millisecond. With an
// injected clock, or on a server older than Redis 7.0 (whose Lua has no
// redis.REDIS_VERSION_NUM; KEEPTTL came in 6.0), clock is nil: every write sets the
// TTL needed, and records no deadline (0).
func luaStore(pack, fields string) string {
	return `
local ttl = math.floor(reset / 1000) + 1 + grace
if clock and clock + 1 + ttl <= deadline then
  redis.call('SET', KEYS[i], struct.pack('` + pack + `', ` + fields + `, deadline), 'KEEPTTL')
else
  if clock then
    ttl = ttl + math.floor(ttl / 4)
    deadline = clock + ttl
  else
    deadline = 0
  end
  redis.call('SET', KEYS[i], struct.pack('` + pack + `', ` + fields + `, deadline), 'PX', string.format('%d', ttl))
end
`
}

// maxMicrosLua is algo.MaxMicros in Lua.
var maxMicrosLua = strconv.FormatInt(algo.MaxMicros, 10)

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
	buf [11 * 8]byte
}

func (p *packedArgs) MarshalBinary() ([]byte, error) { return p.buf[:p.n], nil }

func (p *packedArgs) reset() { p.n = 0 }

func (p *packedArgs) add(v float64) {
	binary.LittleEndian.PutUint64(p.buf[p.n:], math.Float64bits(v))
	p.n += 8
}
