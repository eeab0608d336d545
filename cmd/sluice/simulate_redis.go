package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/cmd/internal/rediskeys"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// redisSimulateTimeout bounds each decision of a simulation on Redis. A simulation is
// not on anyone's request path, so it can wait much longer than the store's default;
// anything slower is treated as a failure of the run, not silently decided locally.
const redisSimulateTimeout = 5 * time.Second

// redisSimulation is a Redis store on a unique key prefix, so a simulation never
// touches the keys of a live sluice sharing the Redis, and removes its keys at the end.
type redisSimulation struct {
	*redisstore.Store
	client *redis.Client
	prefix string
}

// newRedisSimulation connects to the Redis at url and returns a store that reads the
// simulated clock.
func newRedisSimulation(ctx context.Context, url string, clock func() time.Time, logTo io.Writer) (*redisSimulation, error) {
	opts, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("parsing the URL: %w", err)
	}
	client := redis.NewClient(opts)
	pingCtx, cancel := context.WithTimeout(ctx, redisSimulateTimeout)
	defer cancel()
	if err := client.Ping(pingCtx).Err(); err != nil {
		client.Close()
		return nil, fmt.Errorf("connecting to %s: %w", opts.Addr, err)
	}
	var id [8]byte
	_, _ = rand.Read(id[:]) // crypto/rand.Read never fails
	prefix := "sluice-simulate:" + hex.EncodeToString(id[:]) + ":"
	store, err := redisstore.New(client,
		redisstore.WithClock(clock),
		redisstore.WithKeyPrefix(prefix),
		redisstore.WithTimeout(redisSimulateTimeout),
		redisstore.WithLogger(slog.New(slog.NewTextHandler(logTo, nil))))
	if err != nil {
		client.Close()
		return nil, err
	}
	return &redisSimulation{Store: store, client: client, prefix: prefix}, nil
}

// check reports whether any decision fell back to the in-process store: the table
// would then not be what Redis decided, and the run must fail rather than mislead.
func (s *redisSimulation) check() error {
	if n := s.Fallbacks(); n > 0 {
		return fmt.Errorf("%d decisions could not be made on Redis", n)
	}
	return nil
}

// close removes the simulation's keys (they would expire anyway, but a tool should
// not leave litter behind) and disconnects.
func (s *redisSimulation) close() error {
	s.Store.Close()
	defer s.client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return rediskeys.Delete(ctx, s.client, s.prefix+"*")
}
