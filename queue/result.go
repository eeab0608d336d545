package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/subscriber"
)

// Results of nats:SUBJECT deliveries. A consumer of a queue's subject may answer an
// order by publishing a result, signed with the queue's delivery key, on
// sluice.result.{queue}.{ticket} (package subscriber, Verifier.Reply). The stream
// ResultStream keeps them until a dispatcher (ResultConsumer) writes each into its
// ticket's record, as the Result an HTTP downstream's answer would be.
const (
	// ResultStream holds the results waiting to be written, on sluice.result.>:
	// work-queue retention, at most one per ticket, kept at most ResultMaxAge.
	ResultStream = "SLUICE_RESULTS"
	// ResultMaxAge is how long a result may wait for a dispatcher.
	ResultMaxAge = 24 * time.Hour

	resultConsumer = "results"
	resultMaxBytes = 64 << 20
	// resultMaxMsg bounds one result message: body, headers and the metadata.
	resultMaxMsg = subscriber.MaxResultBody + subscriber.MaxResultHeaderBytes + 4<<10
	// resultMaxWaits is how many times a result that came before its ticket's done
	// record (the consumer answered before the dispatcher wrote it) is retried.
	resultMaxWaits = 20
)

// ErrResultRefused is returned by ResultConsumer.Next for a result it dropped: forged,
// out of bounds, of a queue without a nats: downstream, or of a ticket that is not a
// delivered nats: order. The error says why.
var ErrResultRefused = errors.New("queue: result refused")

func (s *Store) ensureResultStream(ctx context.Context) (jetstream.Stream, error) {
	st, err := s.ensureStream(ctx, jetstream.StreamConfig{
		Name:        ResultStream,
		Description: "sluice results of nats: deliveries, waiting to be written into their tickets",
		Subjects:    []string{subscriber.ResultPrefix + ">"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		// A full stream refuses new results (the consumer's publish fails and it can
		// retry), and a ticket holds one result: a second one is refused, not queued.
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    1,
		MaxBytes:             resultMaxBytes,
		MaxMsgSize:           resultMaxMsg,
		MaxAge:               ResultMaxAge,
		Replicas:             s.opts.replicas,
		Duplicates:           10 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: result stream: %w", ErrUnavailable, err)
	}
	return st, nil
}

// ResultConsumer writes the results of nats: deliveries into their ticket records: a
// durable pull consumer shared by every dispatcher.
type ResultConsumer struct {
	s    *Store
	cons jetstream.Consumer
}

// ResultConsumer returns the consumer of the results, creating the stream and the
// consumer when needed.
func (s *Store) ResultConsumer(ctx context.Context) (*ResultConsumer, error) {
	st, err := s.ensureResultStream(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:    resultConsumer,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    30 * time.Second,
		MaxDeliver: -1, // Next counts the waits and drops
	})
	if err != nil {
		return nil, fmt.Errorf("%w: result consumer: %w", ErrUnavailable, err)
	}
	return &ResultConsumer{s: s, cons: cons}, nil
}

// Next waits up to wait for a result and writes it into its ticket record: the
// status, the headers the queue keeps in results (queueconfig.Config.ResultHeader),
// the body and whether it was truncated; the subject and sequence of the delivery
// stay. It returns the ticket written, "" when no result came.
//
// A result is written only when it verifies under its queue's delivery key, its queue
// is declared here with a nats: downstream, and its ticket is done after a nats:
// delivery without a result yet (the first result wins). One that comes before the
// done record is retried for a while; anything else is dropped and reported as an
// error wrapping ErrResultRefused.
func (c *ResultConsumer) Next(ctx context.Context, wait time.Duration) (string, error) {
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := c.cons.Fetch(1, jetstream.FetchContext(fctx))
	if err != nil {
		return "", fmt.Errorf("%w: fetch results: %w", ErrUnavailable, err)
	}
	var jm jetstream.Msg
	for m := range batch.Messages() {
		jm = m
	}
	if jm == nil {
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return "", fmt.Errorf("%w: fetch results: %w", ErrUnavailable, err)
		}
		return "", nil
	}
	return c.apply(ctx, jm)
}

func (c *ResultConsumer) apply(ctx context.Context, jm jetstream.Msg) (string, error) {
	drop := func(ticket, reason string) (string, error) {
		_ = jm.TermWithReason(reason)
		return "", fmt.Errorf("%w: %s: %s", ErrResultRefused, ticket, reason)
	}
	qname, ticket, r, err := subscriber.DecodeResult(jm.Subject(), jm.Headers(), jm.Data(), c.s.DeliveryKey)
	if err != nil {
		return drop(ticket, err.Error())
	}
	q, err := c.s.Queue(qname)
	if err != nil || q.Config().NATSSubject() == "" {
		return drop(ticket, fmt.Sprintf("queue %q has no nats: downstream here", qname))
	}
	// The done record is written after the publish was acknowledged: a quick consumer
	// answers before it. Wait for it a while.
	notYet := func(why string) (string, error) {
		if md, err := jm.Metadata(); err == nil && md.NumDelivered >= resultMaxWaits {
			return drop(ticket, why)
		}
		_ = jm.NakWithDelay(time.Second)
		return "", nil
	}
	rec, err := c.s.Record(ctx, ticket)
	switch {
	case errors.Is(err, ErrNotFound):
		return notYet("no such ticket")
	case err != nil:
		_ = jm.NakWithDelay(time.Second)
		return "", err
	case rec.Queue != qname:
		return drop(ticket, fmt.Sprintf("the ticket is of queue %q", rec.Queue))
	case !rec.Status.Final():
		return notYet(fmt.Sprintf("the ticket stayed %s", rec.Status))
	case rec.Status != StatusDone || rec.Result == nil || rec.Result.Subject == "":
		return drop(ticket, fmt.Sprintf("the ticket is %s, not done after a nats: delivery", rec.Status))
	case rec.Result.StatusCode != 0:
		_ = jm.Ack() // answered already: the first result stays
		return "", fmt.Errorf("%w: %s: the ticket has a result already", ErrResultRefused, ticket)
	}
	res := *rec.Result
	res.StatusCode, res.Header, res.Body, res.Truncated = r.StatusCode, q.Config().ResultHeader(r.Header), r.Body, r.Truncated
	rec.Result = &res
	var opts []jetstream.PublishOpt
	if rec.rev != 0 {
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(rec.rev))
	}
	if err := c.s.saveRecord(ctx, rec, opts...); err != nil {
		_ = jm.NakWithDelay(time.Second) // changed meanwhile, or JetStream is away: again
		return "", err
	}
	if err := jm.Ack(); err != nil {
		// Written; a redelivery finds the result there and is acknowledged.
		c.s.log.Warn("cannot acknowledge a written result", "ticket", ticket, "err", err)
	}
	return ticket, nil
}
