// Package redispace shares a pacing schedule between processes through Redis: every
// pace.Transport configured with the same Schedule key keeps, together with the
// others, to one rate. It is a separate package so that a program pacing in-process
// links no Redis client.
//
//	sched, err := redispace.New(rdb, "pace:{partner-api}")
//	tr, err := pace.NewTransport(nil, limiter.PerSecond(5), pace.WithShared(sched))
package redispace

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/limiter"
)

// Schedule is a pace.Shared kept in one Redis key. A Lua script hands out the next
// start time atomically on Redis server time, so processes need no clock agreement;
// each then sleeps until its start. The starts obey the pacer's bound (in any interval
// Δt at most ceil(rate × Δt) + 1) on Redis time; the actual sends add each process's
// round trip to Redis as jitter.
type Schedule struct {
	client redis.UniversalClient
	key    string
}

// New returns the schedule kept under key. The key holds a small hash with a TTL;
// hash-tag it for Redis Cluster if it must sit next to other keys. It fails with
// pace.ErrInvalidOption for a nil client or an empty key.
func New(client redis.UniversalClient, key string) (*Schedule, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil Redis client", pace.ErrInvalidOption)
	}
	if key == "" {
		return nil, fmt.Errorf("%w: empty Redis key", pace.ErrInvalidOption)
	}
	return &Schedule{client: client, key: key}, nil
}

// Reserve implements pace.Shared. The interval of rate is rounded up to the
// nanosecond (never faster than rate); the tolerance is a pace.Pacer's default, half
// the interval at most pace.DefaultTolerance.
func (s *Schedule) Reserve(ctx context.Context, rate limiter.Rate) (time.Duration, error) {
	if !rate.Valid() {
		return 0, fmt.Errorf("%w: pacing rate %d/%s must be positive", pace.ErrInvalidOption, rate.Count, rate.Period)
	}
	ivNS := rate.Period / time.Duration(rate.Count)
	if ivNS*time.Duration(rate.Count) < rate.Period {
		ivNS++
	}
	tol := min(ivNS/2, pace.DefaultTolerance)
	waitUS, err := reserveSlotScript.Run(ctx, s.client, []string{s.key}, micros(ivNS), micros(tol)).Int64()
	if err != nil {
		return 0, fmt.Errorf("redispace: reserve a start: %w", err)
	}
	return time.Duration(waitUS) * time.Microsecond, nil
}

// Pause implements pace.Shared.
func (s *Schedule) Pause(ctx context.Context, d time.Duration) error {
	if err := pauseScript.Run(ctx, s.client, []string{s.key}, d.Microseconds()).Err(); err != nil {
		return fmt.Errorf("redispace: pause: %w", err)
	}
	return nil
}

// micros writes d in µs with its nanoseconds as three decimals (exact).
func micros(d time.Duration) string {
	return strconv.FormatInt(int64(d/time.Microsecond), 10) + "." + fmt.Sprintf("%03d", int64(d%time.Microsecond))
}

// reserveSlotScript hands out the next start time of a shared schedule, atomically and
// on Redis server time. The key is a hash: last, the latest start handed out, and
// hold, the end of a pause, both in µs since the epoch. The next start is one interval
// (the caller's: a process that slows down spaces its own start from the previous
// one) after last, not before hold; a slot late by more than the tolerance is not
// caught up: the schedule restarts at now − tolerance (the same rules as pace.Pacer).
//
// KEYS[1] schedule key; ARGV[1] interval µs (fractional); ARGV[2] tolerance µs.
// Returns how long the caller waits for its slot, in whole µs (0: start now).
var reserveSlotScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local tol = tonumber(ARGV[2])
local st = redis.call('HMGET', KEYS[1], 'last', 'hold')
local slot = now - tol
if st[1] then
  slot = math.max(slot, tonumber(st[1]) + interval)
end
local hold = tonumber(st[2] or '0')
slot = math.max(slot, hold)
redis.call('HSET', KEYS[1], 'last', string.format('%.3f', slot))
redis.call('PEXPIRE', KEYS[1], math.ceil((math.max(slot + interval, hold) - now) / 1000) + 60000)
return math.ceil(math.max(slot - now, 0))
`)

// pauseScript holds every start of a shared schedule for a while (never shortening an
// earlier pause). KEYS[1] schedule key; ARGV[1] pause in µs.
var pauseScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local untilus = now + tonumber(ARGV[1])
local hold = tonumber(redis.call('HGET', KEYS[1], 'hold') or '0')
if untilus > hold then
  redis.call('HSET', KEYS[1], 'hold', string.format('%.3f', untilus))
  local ttl = redis.call('PTTL', KEYS[1])
  local want = math.ceil((untilus - now) / 1000) + 60000
  if ttl < want then
    redis.call('PEXPIRE', KEYS[1], want)
  end
end
return 1
`)
