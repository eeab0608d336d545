package dispatcher_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// A service consuming the orders a queue with a nats:SUBJECT downstream delivers. The
// consumer owns a JetStream stream capturing the subject (sluice refuses to declare the
// queue without one): each order is stored there before sluice marks it done, and the
// consumer acknowledges it once processed. The request travels as the message body and
// Sluice-* headers; Nats-Msg-Id is the ticket, so a repeat within the stream's
// duplicate window is dropped.
func ExampleDispatcher_natsSubscriber() {
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

	// The consumer's side: a stream for the subject, and a durable consumer on it.
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.accepted"}}); err != nil {
		fmt.Println(err)
		return
	}
	cons, _ := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy})

	// sluice's side: a queue delivering to the subject, one order parked in it.
	// Every process sharing the queues signs with the same key (sluice's --queue-key).
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(key))
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := store.Declare(ctx, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), Downstream: "nats:orders.accepted"}); err != nil {
		fmt.Println(err)
		return
	}
	rc, _ := store.Park(ctx, &queue.Request{
		Queue: "orders", Rule: "create-order", Method: "POST", Path: "/v1/orders", RawQuery: "dry=0",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"sku":"a-1"}`),
		IdempotencyKey: "order-17",
	})
	d, _ := dispatcher.New(store)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(dctx) }()

	batch, _ := cons.Fetch(1, jetstream.FetchMaxWait(20*time.Second))
	for msg := range batch.Messages() {
		h := msg.Headers()
		fmt.Println("ticket matches:", h.Get(queue.HeaderTicket) == rc.Ticket && h.Get("Nats-Msg-Id") == rc.Ticket)
		fmt.Println(h.Get(queue.HeaderMethod), h.Get(queue.HeaderPath)+"?"+h.Get(queue.HeaderQuery))
		fmt.Println("queue:", h.Get(queue.HeaderQueue), "rule:", h.Get(queue.HeaderRule))
		fmt.Println("idempotency key:", h.Get(queue.HeaderIdempotencyKey))
		fmt.Println("content type:", h.Get(queue.HeaderPrefix+"Content-Type"))
		_, err := time.Parse(time.RFC3339Nano, h.Get(queue.HeaderReceivedAt))
		fmt.Println("received at parses:", err == nil)
		fmt.Println("body:", string(msg.Data()))
		_ = msg.Ack() // processed: the consumer's own stream may now drop it
	}
	stop()
	<-done
	// Output:
	// ticket matches: true
	// POST /v1/orders?dry=0
	// queue: orders rule: create-order
	// idempotency key: order-17
	// content type: application/json
	// received at parses: true
	// body: {"sku":"a-1"}
}
