package queue_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestCheckDurability: on a single server that syncs every write, from an account
// that cannot ask the servers' configuration, nothing is wrong and the sync setting is
// said to be unknown; a stream of sluice in memory is a problem, and so are R1 queues
// on a cluster (TestCheckDurabilityCluster).
func TestCheckDurability(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	srv := natstest.Start(t)
	d, err := queue.CheckDurability(ctx, srv.Conn, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Problems) != 0 || d.Version == "" || d.Cluster != "" || d.Servers != 1 {
		t.Errorf("a single syncing server: %+v", d)
	}
	if !slices.ContainsFunc(d.Unknown, func(s string) bool { return strings.Contains(s, "sync_interval") }) {
		t.Errorf("the sync setting is not said to be unknown: %q", d.Unknown)
	}
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: queue.StreamPrefix + "mem", Subjects: []string{"mem.>"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	d, err = queue.CheckDurability(ctx, srv.Conn, 1)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Problems) != 1 || !strings.Contains(d.Problems[0], "in memory") {
		t.Errorf("a queue stream in memory: problems %q", d.Problems)
	}
}

// TestCheckDurabilityCluster: R1 queues on a cluster are a problem.
func TestCheckDurabilityCluster(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	d, err := queue.CheckDurability(ctx, nc, 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Cluster == "" || d.Servers != 3 || len(d.Problems) != 1 || !strings.Contains(d.Problems[0], "one replica") {
		t.Errorf("R1 on a 3-node cluster: %+v", d)
	}
	if d, err = queue.CheckDurability(ctx, nc, 3); err != nil || len(d.Problems) != 0 {
		t.Errorf("R3 on a 3-node cluster: %+v, %v", d, err)
	}
}
