//go:build unix

package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestStuckNATSNodeIsLeft: a sluice connection (openNATS) to a 3-node cluster goes on
// parking orders into an R3 queue while one node is frozen (SIGSTOP: connections up,
// nothing answered) — first the follower the connection is on, then the queue's stream
// leader. Once the stuck node is detected (the first park accepted after the freeze;
// the connection's pings leave it within seconds), at least 95 of the next 100 parks
// (half of them with an Idempotency-Key, which reads the key bucket) are accepted,
// while the node is still frozen.
func TestStuckNATSNodeIsLeft(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	conn, err := openNATS(natsConfig{url: c.URL(), signKey: natstest.SigningKey(), replicas: 3}, log, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.nc.Close)
	ctx := context.Background()
	store, err := queue.Open(ctx, conn.nc, queue.WithReplicas(3), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := queueconfig.Config{Name: "stuck", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1", Replicas: 3}
	if _, err := store.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(conn.nc)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	park := func() error {
		n++
		req := &queue.Request{Queue: "stuck", Rule: "r", Method: http.MethodPost, Path: "/v1/orders",
			Body: []byte(fmt.Sprintf(`{"n":%d}`, n)), Client: "client-1"}
		if n%2 == 0 {
			req.IdempotencyKey = fmt.Sprintf("key-%d", n)
		}
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second) // as a front door's wait for the ack
		defer cancel()
		_, err := store.Park(pctx, req)
		return err
	}
	leader := func() int {
		lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		s, err := js.Stream(lctx, queue.StreamName("stuck"))
		if err != nil {
			return -1
		}
		info, err := s.Info(lctx)
		if err != nil || info.Cluster == nil {
			return -1
		}
		return c.Node(info.Cluster.Leader)
	}
	for _, tc := range []struct {
		name   string
		frozen func() int
	}{
		{"the follower the connection is on", func() int {
			on := c.Node(conn.nc.ConnectedServerName())
			for on == leader() {
				// Move the stream's leader away, so that the node is a follower only.
				sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, _ = conn.nc.RequestWithContext(sctx, "$JS.API.STREAM.LEADER.STEPDOWN."+queue.StreamName("stuck"), nil)
				cancel()
				time.Sleep(time.Second)
			}
			return on
		}},
		{"the stream leader", leader},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The cluster works before the fault (after the previous one, once the
			// resumed node caught up): 20 parks accepted in a row.
			deadline := time.Now().Add(2 * time.Minute)
			for ok := 0; ok < 20; {
				if err := park(); err != nil {
					ok = 0
					if time.Now().After(deadline) {
						t.Fatalf("park before the fault: %v", err)
					}
					continue
				}
				ok++
			}
			node := tc.frozen()
			if node < 0 {
				t.Fatal("no node to freeze")
			}
			c.Pause(node)
			frozenAt := time.Now()
			resumed := false
			resume := func() {
				if !resumed {
					resumed = true
					c.Resume(node)
				}
			}
			defer resume()
			failed := 0
			for park() != nil {
				failed++
				if time.Since(frozenAt) > 90*time.Second {
					t.Fatalf("no park accepted within 90s of freezing node %d (%d refused)", node, failed)
				}
			}
			detected := time.Since(frozenAt)
			accepted := 0
			for range 100 {
				start := time.Now()
				if err := park(); err == nil {
					accepted++
				} else {
					t.Logf("park %d refused after %s (%s since the freeze): %v", n, time.Since(start).Round(time.Millisecond), time.Since(frozenAt).Round(time.Second), err)
				}
			}
			t.Logf("node %d frozen: first park accepted after %s (%d refused before); then %d of 100 accepted, connection on %s",
				node, detected.Round(100*time.Millisecond), failed, accepted, conn.nc.ConnectedServerName())
			if accepted < 95 {
				t.Errorf("%d of 100 parks accepted after the stuck node was detected, want at least 95", accepted)
			}
			resume()
			c.WaitReady()
		})
	}
}
