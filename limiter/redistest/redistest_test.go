package redistest_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter/redistest"
)

func TestStartStopRestart(t *testing.T) {
	s := redistest.Start(t)
	ctx := context.Background()
	c := s.Client()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a stopped server")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after restart: %v", err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("restarted server is not empty: %d, %v", n, err)
	}
}

func TestCluster(t *testing.T) {
	c := redistest.StartCluster(t, 3)
	if len(c.Addrs()) != 3 {
		t.Fatalf("addrs %v", c.Addrs())
	}
	ctx := context.Background()
	client := c.Client()
	for i := range 100 {
		k := fmt.Sprint("key", i)
		if err := client.Set(ctx, k, i, 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	// The keys are spread over every master.
	var mu sync.Mutex
	var sizes []int64
	err := client.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
		n, err := m.DBSize(ctx).Result()
		mu.Lock()
		sizes = append(sizes, n)
		mu.Unlock()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 3 {
		t.Fatalf("%d masters, want 3", len(sizes))
	}
	for _, n := range sizes {
		if n == 0 {
			t.Fatalf("a master holds no keys: %v", sizes)
		}
	}
}
