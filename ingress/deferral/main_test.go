package deferral

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// openRules parses a rules file and opens a store on a NATS server of its own with
// every queue of the rules declared.
func openRules(t *testing.T, yaml string) (*rules.Set, *natstest.Server, *queue.Store) {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store, err := queue.Open(ctx, srv.Conn, queue.WithPublishTimeout(5*time.Second), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range set.Queues() {
		if _, err := store.Declare(ctx, q.Config); err != nil {
			t.Fatal(err)
		}
	}
	return set, srv, store
}

// newMiddleware returns the front door's middleware deciding set on a memory limiter.
func newMiddleware(t *testing.T, set *rules.Set, opts ...ingress.Option) *ingress.Middleware {
	t.Helper()
	m, err := ingress.New(ingress.StaticRules{S: set}, limiter.NewMemory(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
