package queue_test

import (
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// On replicated streams a direct get may be answered by a follower that has not
// applied the latest writes, so Status must not call a ticket unknown on the
// followers' word: before ErrNotFound it asks the leaders of the ticket bucket's and
// the queue's streams.
func TestStatusConfirmsAMissWithTheLeaders(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	s, err := queue.Open(ctxT(t), nc, queue.WithReplicas(3), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("orders")
	cfg.Replicas = 3
	if _, err := s.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}

	// The watch is on nc's own server: a server delivers a request to its own
	// subscribers as it reads it, where the watch's interest would reach another
	// server over the routes only some time after its Flush.
	watch, err := nats.Connect(nc.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	var mu sync.Mutex
	var asked []string
	sub, err := watch.Subscribe("$JS.API.STREAM.MSG.GET.>", func(m *nats.Msg) {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, strings.TrimPrefix(m.Subject, "$JS.API.STREAM.MSG.GET."))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}

	const unknown = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	if !queue.ValidTicket(unknown) {
		t.Fatalf("%q is not a valid ticket: the test asks nothing", unknown)
	}
	if _, err := s.Status(ctxT(t), unknown); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("Status of an unknown ticket: %v, want ErrNotFound", err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
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
