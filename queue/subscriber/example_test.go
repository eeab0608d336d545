package subscriber_test

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
	"github.com/sluicehq/sluice/queue/subscriber"
)

// A worker of a queue with a nats:SUBJECT downstream: it checks each order with the
// queue's delivery key, does the work, and replies; the reply becomes the result of
// the order's ticket.
func Example() {
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
	js, _ := jetstream.New(nc)

	// sluice's side: a queue delivering to payments.requested, a dispatcher, an order.
	signingKey := make([]byte, 32) // sluice's --queue-key
	_, _ = rand.Read(signingKey)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "PAYMENTS", Subjects: []string{"payments.requested"}}); err != nil {
		fmt.Println(err)
		return
	}
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(signingKey))
	if err != nil {
		fmt.Println(err)
		return
	}
	cfg := queueconfig.Config{Name: "payments", Outflow: limiter.PerSecond(10), Downstream: "nats:payments.requested", ResultHeaders: []string{"X-Payment-Id"}}
	if _, err := store.Declare(ctx, cfg); err != nil {
		fmt.Println(err)
		return
	}
	rc, _ := store.Park(ctx, &queue.Request{
		Queue: "payments", Method: "POST", Path: "/v1/payments",
		Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"amount":1250}`),
	})
	d, _ := dispatcher.New(store)
	dctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = d.Run(dctx) }()
	defer func() { stop(); <-done }()

	// The worker's side: it holds the queue's delivery key, never the signing key
	// (`sluice queue delivery-key payments` prints it).
	v, err := subscriber.NewVerifier("payments", subscriber.DeliveryKey(signingKey, "payments"))
	if err != nil {
		fmt.Println(err)
		return
	}
	cons, _ := js.CreateOrUpdateConsumer(ctx, "PAYMENTS", jetstream.ConsumerConfig{Durable: "payer", AckPolicy: jetstream.AckExplicitPolicy})
	var paid string
	pay := func(_ context.Context, o *subscriber.Order) (*subscriber.Result, error) {
		// The work, idempotent on o.Ticket: it may run again for the same order.
		paid = fmt.Sprintf("paid %s %s: %s", o.Method, o.Path, o.Body)
		return &subscriber.Result{
			StatusCode: http.StatusCreated,
			Header:     http.Header{"Content-Type": {"application/json"}, "X-Payment-Id": {"pay_1"}},
			Body:       []byte(`{"paid":true}`),
		}, nil
	}
	for handled := false; !handled && ctx.Err() == nil; {
		batch, _ := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		for jm := range batch.Messages() {
			// A reply fails until a dispatcher made the result stream: Handle hands
			// the order back, and it comes again.
			handled = v.Handle(ctx, js, jm, pay) == nil
		}
	}
	fmt.Println(paid)

	// What GET /sluice/v1/deferred/{ticket} shows.
	for ctx.Err() == nil {
		if st, err := store.Status(ctx, rc.Ticket); err == nil && st.Result != nil && st.Result.StatusCode != 0 {
			fmt.Println(st.Status, st.Result.StatusCode, st.Result.Header.Get("X-Payment-Id"), string(st.Result.Body))
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Output:
	// paid POST /v1/payments: {"amount":1250}
	// done 201 pay_1 {"paid":true}
}
