package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cmd/internal/rediskeys"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// redisPoolSize is the connection pool of the benchmark's client unless the URL sets
// pool_size: enough for the most callers measured, so that neither contender waits
// for a connection (go-redis' default, 10 per CPU, would cap redis_rate, which needs a
// connection per concurrent call).
const redisPoolSize = 128

// redisScenarios pits the Redis store against redis_rate on the same Redis and client.
// Every key of the run starts with a unique prefix; cleanup deletes them.
func redisScenarios(ctx context.Context, cfg limiterConfig) ([]scenario, func() error, error) {
	opts, err := redis.ParseURL(cfg.redisURL)
	if err != nil {
		return nil, nil, fmt.Errorf("parsing the URL: %w", err)
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = redisPoolSize
	}
	// As redisstore.New asks: calls bounded by their context's deadline, which lets
	// a lone caller call Redis itself instead of handing its decision to a worker.
	// redis_rate's calls carry no deadline, so this changes nothing for it.
	opts.ContextTimeoutEnabled = true
	client := redis.NewClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("connecting to %s: %w", opts.Addr, err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // never fails
	prefix := "sluice-bench:" + hex.EncodeToString(id[:]) + ":"

	// Each caller has its own keys, used round-robin, built here so that the timed
	// loops do not build strings.
	maxCallers := 0
	for _, c := range cfg.redisCallers {
		maxCallers = max(maxCallers, c)
	}
	keys := make([][]string, maxCallers)
	for c := range keys {
		keys[c] = make([]string, cfg.redisKeys)
		for k := range keys[c] {
			keys[c][k] = "c" + strconv.Itoa(c) + ":k" + strconv.Itoa(k)
		}
	}

	sluiceRedis := contender{name: "sluice redis", setup: func(ctx context.Context, callers int) (func(int) decideFunc, fallbackFunc, error) {
		// The store waits for Redis as long as redis_rate does (go-redis' read
		// timeout, 3s) rather than its own default of 50ms, past which it would
		// decide in memory: on a loaded machine that measures the fallback, not
		// Redis. Decisions that fall back all the same are counted and warned about.
		store, err := redisstore.New(client, redisstore.WithKeyPrefix(prefix), redisstore.WithTimeout(3*time.Second),
			redisstore.WithLogger(slog.New(slog.NewTextHandler(os.Stderr, nil))))
		if err != nil {
			return nil, nil, err
		}
		return func(id int) decideFunc {
				ks, i := keys[id], 0
				return func(ctx context.Context) (bool, error) {
					d, err := store.AllowN(ctx, ks[i], benchLimit, 1)
					if i++; i == len(ks) {
						i = 0
					}
					return d.Allowed, err
				}
			}, func(release bool) int64 {
				if release {
					store.Close()
				}
				return store.Fallbacks()
			}, nil
	}}

	rl := redis_rate.NewLimiter(client)
	peerLimit := redis_rate.Limit{Rate: benchRate, Burst: benchBurst, Period: time.Second}
	redisRate := contender{name: "redis_rate", setup: func(ctx context.Context, callers int) (func(int) decideFunc, fallbackFunc, error) {
		return func(id int) decideFunc {
			ks, i := keys[id], 0
			return func(ctx context.Context) (bool, error) {
				// Same key names as sluice's, under redis_rate's own "rate:" prefix.
				res, err := rl.Allow(ctx, prefix+ks[i], peerLimit)
				if i++; i == len(ks) {
					i = 0
				}
				if err != nil {
					return false, fmt.Errorf("redis_rate: %w", err)
				}
				return res.Allowed > 0, nil
			}
		}, noFallbacks, nil
	}}

	var out []scenario
	for _, c := range cfg.redisCallers {
		out = append(out, scenario{name: fmt.Sprintf("redis, %s keys/caller", count(cfg.redisKeys)), callers: c, batch: 1,
			sluice: sluiceRedis, peer: redisRate})
	}
	cleanup := func() error {
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		for _, pattern := range []string{prefix + "*", "rate:" + prefix + "*"} {
			if err := rediskeys.Delete(ctx, client, pattern); err != nil {
				return err
			}
		}
		return nil
	}
	return out, cleanup, nil
}
