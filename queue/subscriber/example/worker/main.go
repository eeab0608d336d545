// Command worker is a small consumer of a sluice queue with a nats:SUBJECT downstream:
// it reads the orders from the JetStream stream that captures SUBJECT, checks each one
// with the queue's delivery key, "does the work" (logs the order) and replies with a
// result that sluice keeps in the order's ticket.
//
//	SLUICE_DELIVERY_KEY=$(SLUICE_QUEUE_KEY=... sluice queue delivery-key notifications-email) \
//	  go run ./queue/subscriber/example/worker --nats nats://127.0.0.1:4222 \
//	  --queue notifications-email --stream NOTIFICATIONS
//
// The delivery key (base64) comes from SLUICE_DELIVERY_KEY, never from a flag: flags
// show in process listings.
package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/subscriber"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func run() error {
	url := flag.String("nats", nats.DefaultURL, "NATS `URL`")
	queueName := flag.String("queue", "", "the sluice `queue` whose orders this worker takes")
	stream := flag.String("stream", "", "the JetStream `stream` capturing the queue's subject")
	durable := flag.String("durable", "worker", "durable consumer `name` (shared by the worker's replicas)")
	inbox := flag.String("inbox-prefix", "", "the `prefix` of reply subjects, when not _INBOX (_INBOX_worker for the user worker of deploy/nats/accounts.conf)")
	flag.Parse()
	if *queueName == "" || *stream == "" {
		return errors.New("--queue and --stream are required")
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(os.Getenv("SLUICE_DELIVERY_KEY")))
	if err != nil {
		return fmt.Errorf("SLUICE_DELIVERY_KEY: %w", err)
	}
	v, err := subscriber.NewVerifier(*queueName, key)
	if err != nil {
		return fmt.Errorf("SLUICE_DELIVERY_KEY: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var opts []nats.Option
	if *inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(*inbox))
	}
	nc, err := nats.Connect(*url, opts...)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, *stream, jetstream.ConsumerConfig{
		Durable:   *durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		// Orders of one queue one at a time, in their order (see the package
		// documentation on ordering).
		MaxAckPending: 1,
	})
	if err != nil {
		return fmt.Errorf("consumer on %s: %w", *stream, err)
	}
	cc, err := cons.Consume(func(jm jetstream.Msg) {
		if err := v.Handle(ctx, js, jm, work(log)); err != nil {
			log.Warn("order not handled", "err", err)
		}
	})
	if err != nil {
		return err
	}
	log.Info("taking orders", "queue", *queueName, "stream", *stream)
	<-ctx.Done()
	cc.Drain()
	<-cc.Closed()
	return nil
}

// work is the worker's business: here it logs the order and answers with a receipt.
// Real work must be idempotent on the ticket (an order may come twice).
func work(log *slog.Logger) subscriber.Handler {
	return func(_ context.Context, o *subscriber.Order) (*subscriber.Result, error) {
		log.Info("order", "ticket", o.Ticket, "method", o.Method, "path", o.Path, "bytes", len(o.Body), "received_at", o.ReceivedAt)
		body, err := json.Marshal(map[string]any{"ticket": o.Ticket, "handled_bytes": len(o.Body)})
		if err != nil {
			return nil, err
		}
		return &subscriber.Result{
			StatusCode: http.StatusOK,
			Header:     http.Header{"Content-Type": {"application/json"}},
			Body:       body,
		}, nil
	}
}
