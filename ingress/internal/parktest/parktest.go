// Package parktest sets up, for the tests of ingress's packages, what a deferred
// request is parked in: a rules set parsed from YAML, a NATS server of the test's own
// (natstest.Start) and a queue store on it with the queues declared.
package parktest

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
)

// Orders is a rules file with one route, POST /v1/orders, allowed once an hour and
// deferred past that to the queue orders (10 a second, at most 3 waiting, its
// downstream a closed port).
const Orders = `
domain: shop
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
queues:
  orders:
    outflow: {rate: 10/s}
    max_depth: 3
    downstream: http://127.0.0.1:1
`

// Rules parses yaml as the rules file shop.yaml; t fails at once when it does not.
func Rules(t testing.TB, yaml string) *rules.Set {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(yaml)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// Store starts a NATS server for t and opens a queue store on it, signed with
// natstest.SigningKey, whose Park waits at most 5 s for JetStream's acknowledgement,
// and declares cfgs in it; t fails at once when any of that fails. The server stops
// when t ends.
func Store(t testing.TB, cfgs ...queueconfig.Config) (*natstest.Server, *queue.Store) {
	t.Helper()
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	store, err := queue.Open(ctx, srv.Conn, queue.WithPublishTimeout(5*time.Second), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	for _, cfg := range cfgs {
		if _, err := store.Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	return srv, store
}

// Open parses yaml (Rules) and opens a store with every queue of the set declared
// (Store).
func Open(t testing.TB, yaml string) (*rules.Set, *natstest.Server, *queue.Store) {
	t.Helper()
	set := Rules(t, yaml)
	var cfgs []queueconfig.Config
	for _, q := range set.Queues() {
		cfgs = append(cfgs, q.Config)
	}
	srv, store := Store(t, cfgs...)
	return set, srv, store
}
