package queue_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Parking an order that a defer rule found over its limit, and following its ticket.
// Park returns only once JetStream has stored the order; a repeat with the same
// client scope, idempotency key and payload gets the same ticket back. A dispatcher
// (see package dispatcher) would deliver it at the queue's outflow rate; here the
// ticket holder cancels it while it is queued.
func ExampleStore_Park() {
	dir, _ := os.MkdirTemp("", "sluice-example-")
	defer os.RemoveAll(dir)
	srv, err := embedded.Start(embedded.Config{DataDir: dir})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Shutdown()
	nc, _ := srv.Connect()
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Every process sharing the queues signs with the same key (sluice's --queue-key).
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(key))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := store.Declare(ctx, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), Downstream: "http://orders-api:8080"}); err != nil {
		fmt.Println(err)
		return
	}
	order := &queue.Request{
		Queue: "orders", Rule: "create-order", Method: "POST", Path: "/v1/orders",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"sku":"a-1"}`),
		Client: "c1f0", IdempotencyKey: "order-17",
	}
	rc, err := store.Park(ctx, order)
	if err != nil {
		fmt.Println(err) // a *queue.FullError when the queue is full
		return
	}
	fmt.Println("parked:", rc.Status, "position", rc.Position, "valid ticket:", queue.ValidTicket(rc.Ticket))

	again, _ := store.Park(ctx, order)
	fmt.Println("repeat:", again.Duplicate, "same ticket:", again.Ticket == rc.Ticket)

	rec, _ := store.Status(ctx, rc.Ticket)
	fmt.Println("status:", rec.Status, "final:", rec.Status.Final())

	if err := store.Cancel(ctx, rc.Ticket); err != nil {
		fmt.Println(err)
		return
	}
	rec, _ = store.Status(ctx, rc.Ticket)
	fmt.Println("status:", rec.Status, "final:", rec.Status.Final())
	// Output:
	// parked: queued position 1 valid ticket: true
	// repeat: true same ticket: true
	// status: queued final: false
	// status: cancelled final: true
}
