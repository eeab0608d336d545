package queue_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// BenchmarkKeyedParkCluster parks keyed orders on a three-node cluster (nats-server
// processes, every write synced, as sluice's shipped clusters), R3 queues, with the key
// slots in memory (as sluice declares them) and on file (synced, as on a server that
// refuses memory streams), beside raw synchronous publishes of the same body to an R3
// work-queue stream: 1 caller, and 16 (RunParallel). Compare ns/op side by side:
//
//	go test -run '^$' -bench KeyedParkCluster -count 3 ./queue/
func BenchmarkKeyedParkCluster(b *testing.B) {
	c := natstest.StartCluster(b, 3)
	nc := c.Connect(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	// On file before it is declared: the store keeps a key stream where it is.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: queue.KeyStreamName("file"),
		Subjects: []string{"sluice.keys.file.slot.*"}, Storage: jetstream.FileStorage, Replicas: 3}); err != nil {
		b.Fatal(err)
	}
	s, err := queue.Open(ctx, nc, queue.WithSigningKey(natstest.SigningKey()), queue.WithReplicas(3))
	if err != nil {
		b.Fatal(err)
	}
	for _, name := range []string{"memory", "file"} {
		cfg := testConfig(name)
		cfg.Replicas, cfg.MaxDepth, cfg.MaxIdempotencyKeys = 3, -1, 10_000_000
		if _, err := s.Declare(ctx, cfg); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw"},
		Retention: jetstream.WorkQueuePolicy, Replicas: 3}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 512)
	var seq atomic.Int64
	park := func(q string) error {
		i := seq.Add(1)
		req := order(q, string(body))
		req.Client, req.IdempotencyKey = fmt.Sprint("c", i%16), fmt.Sprint("k", i)
		_, err := s.Park(ctx, req)
		return err
	}
	contenders := []struct {
		name string
		op   func() error
	}{
		{"raw", func() error { _, err := js.Publish(ctx, "raw", body); return err }},
		{"slots=memory", func() error { return park("memory") }},
		{"slots=file", func() error { return park("file") }},
	}
	for _, callers := range []int{1, 16} {
		for _, c := range contenders {
			b.Run(fmt.Sprintf("%s/callers=%d", c.name, callers), func(b *testing.B) {
				if callers == 1 {
					for range b.N {
						if err := c.op(); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(max(callers/runtime.GOMAXPROCS(0), 1))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := c.op(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
