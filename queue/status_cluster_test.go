package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// openR3 opens a store on nc, a connection to a cluster, with R3 queues, and declares
// cfg (with 3 replicas) in it.
func openR3(t *testing.T, nc *nats.Conn, cfg queueconfig.Config) (*queue.Store, *queue.Queue) {
	t.Helper()
	s, err := queue.Open(ctxT(t), nc, queue.WithReplicas(3), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Replicas = 3
	q, err := s.Declare(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, q
}

// On replicated streams a direct get may be answered by a follower that has not
// applied the latest writes, so Status must not call a ticket unknown on the
// followers' word: before ErrNotFound it asks the leaders of the ticket bucket's and
// the queue's streams.
func TestStatusConfirmsAMissWithTheLeaders(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	s, _ := openR3(t, nc, testConfig("orders"))

	const unknown = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	if !queue.ValidTicket(unknown) {
		t.Fatalf("%q is not a valid ticket: the test asks nothing", unknown)
	}
	var asked []string
	for _, subj := range natstest.PublishedDuring(t, nc, "$JS.API.STREAM.MSG.GET.>", func() {
		if _, err := s.Status(ctxT(t), unknown); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("Status of an unknown ticket: %v, want ErrNotFound", err)
		}
	}) {
		asked = append(asked, strings.TrimPrefix(subj, "$JS.API.STREAM.MSG.GET."))
	}
	for _, stream := range []string{"KV_" + queue.TicketsBucket, queue.StreamName("orders")} {
		found := false
		for _, a := range asked {
			found = found || a == stream
		}
		if !found {
			t.Errorf("no leader message get on %s before ErrNotFound (asked %v)", stream, asked)
		}
	}
}

// Only a stream's leader answers a stream info request, and a stopped leader drops it
// without a word. Park reads stream info (a receipt's position) that may be a second
// old: with an older value at hand, a refresh without an answer falls back to it after
// jsproto.LeaderWait rather than holding the caller, whose order is already stored,
// until its own deadline.
func TestStreamInfoFallsBackWhenTheLeaderIsSilent(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	_, q := openR3(t, c.Connect(t), testConfig("orders"))
	// A new stream may still change leaders: an answer from a leader other than the one
	// stopped means the leadership moved first, and the test starts over.
	for attempt := 1; ; attempt++ {
		cached, err := q.StreamInfo(ctxT(t), 0)
		if err != nil || cached.Cluster == nil || cached.Cluster.Leader == "" {
			t.Fatalf("stream info: %+v %v, want one with a leader", cached, err)
		}
		leader := c.Node(cached.Cluster.Leader)
		c.Pause(leader)
		ctx, cancel := context.WithTimeout(context.Background(), 5*jsproto.LeaderWait)
		got, err := q.StreamInfo(ctx, time.Nanosecond)
		late := ctx.Err()
		cancel()
		c.Resume(leader)
		switch {
		case err == nil && got != cached && got.Cluster != nil && got.Cluster.Leader != cached.Cluster.Leader && attempt < 5:
			t.Logf("the leadership moved from %s to %s before the stop; again", cached.Cluster.Leader, got.Cluster.Leader)
			continue
		case err != nil || got != cached:
			t.Fatalf("stream info with the leader stopped: %+v %v, want the cached value", got, err)
		case late != nil:
			t.Errorf("the refresh held its caller until the caller's deadline (%v)", late)
		}
		return
	}
}
