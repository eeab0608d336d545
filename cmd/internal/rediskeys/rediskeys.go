// Package rediskeys removes the keys a command left in Redis (the simulator's and the
// load tool's counters), so that a tool leaves no litter behind.
package rediskeys

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// batch is how many keys one SCAN step asks for and one UNLINK removes.
const batch = 1000

// Delete removes every key matching pattern from the server client talks to. It
// walks the keys with SCAN and removes them with UNLINK, batch by batch, so a large
// Redis is never blocked.
func Delete(ctx context.Context, client *redis.Client, pattern string) error {
	iter := client.Scan(ctx, 0, pattern, batch).Iterator()
	keys := make([]string, 0, batch)
	flush := func() error {
		if len(keys) == 0 {
			return nil
		}
		err := client.Unlink(ctx, keys...).Err()
		keys = keys[:0]
		if err != nil {
			return fmt.Errorf("deleting %s: %w", pattern, err)
		}
		return nil
	}
	for iter.Next(ctx) {
		if keys = append(keys, iter.Val()); len(keys) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	if err := iter.Err(); err != nil {
		return fmt.Errorf("scanning for %s: %w", pattern, err)
	}
	return flush()
}
