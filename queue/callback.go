package queue

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/dispatcher/webhook"
)

// Completion callbacks. A client that parks an order with a callback URL (Request.Callback,
// allowed by its queue's CallbackHosts) is told when the order ends: settling the order
// (Lease.Done, Fail, Dead) writes a callback job to the stream CallbackStream before the
// order's message is acknowledged, and a sender (the dispatcher's) POSTs it, signed
// with the queue's CallbackSecret, retrying with backoff. A job that cannot be written
// is counted (sluice_callbacks_lost_total) and logged; the order is settled all the
// same: callbacks never hold up a queue.
const (
	// CallbackStream holds the callback jobs of every queue, on
	// sluice.cb.{queue}.{ticket}: work-queue retention, kept at most CallbackMaxAge.
	CallbackStream = "SLUICE_CALLBACKS"
	// CallbackMaxAge is how long a callback job may wait for its receiver.
	CallbackMaxAge = 72 * time.Hour
	// HeaderCallback carries a parked order's callback URL (covered by its signature).
	HeaderCallback = "Sluice-Callback"
	// headerEventID is a job's webhook-id.
	headerEventID = "Sluice-Event-Id"

	callbackConsumer = "callbacks"
	callbackMaxBytes = 256 << 20
)

func callbackSubject(queue, ticket string) string { return "sluice.cb." + queue + "." + ticket }

// CallbackEvent is the JSON body of a callback: the Standard Webhooks shape, with the
// order's final state as data.
type CallbackEvent struct {
	// Type is order.done, order.failed or order.dead.
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      Event     `json:"data"`
}

func (s *Store) ensureCallbackStream(ctx context.Context) (jetstream.Stream, error) {
	st, err := s.ensureStream(ctx, jetstream.StreamConfig{
		Name:        CallbackStream,
		Description: "sluice completion callbacks waiting to be sent",
		Subjects:    []string{"sluice.cb.>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Discard:     jetstream.DiscardNew,
		MaxBytes:    callbackMaxBytes,
		MaxAge:      CallbackMaxAge,
		Replicas:    s.opts.replicas,
		// A settle repeated after a crash (the order came back before its ack) writes
		// the same job again: the event id dedupes it.
		Duplicates: 10 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: callback stream: %v", ErrUnavailable, err)
	}
	return st, nil
}

// callbackMAC covers a job's queue, URL, event id and body.
func (s *Store) callbackMAC(queue, url, id string, body []byte) []byte {
	return s.mac("sluice callback", []byte(queue), []byte(url), []byte(id), body)
}

// enqueueCallback writes the callback job of a settled order whose message asked for
// one. Failures are counted and logged, never returned: see the comment at the top.
func (s *Store) enqueueCallback(ctx context.Context, m *Message, ev Event) {
	if m.Callback == "" {
		return
	}
	ce := CallbackEvent{Type: "order." + string(ev.Status), Timestamp: ev.At, Data: ev}
	body, err := json.Marshal(ce)
	if err == nil {
		id := "evt_" + m.Ticket + "_" + string(ev.Status)
		msg := nats.NewMsg(callbackSubject(m.Queue, m.Ticket))
		msg.Data = body
		msg.Header.Set(HeaderMsgID, id)
		msg.Header.Set(headerEventID, id)
		msg.Header.Set(HeaderQueue, m.Queue)
		msg.Header.Set(HeaderCallback, m.Callback)
		msg.Header.Set(HeaderSignature, sigVersion+base64.StdEncoding.EncodeToString(s.callbackMAC(m.Queue, m.Callback, id, body)))
		pctx, cancel := context.WithTimeout(ctx, s.opts.publishTimeout)
		_, err = s.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(CallbackStream))
		cancel()
	}
	if err != nil {
		s.metrics.callbacksLost.Inc()
		s.log.Error("cannot store the completion callback; it will not be sent", "ticket", m.Ticket, "queue", m.Queue, "err", err)
	}
}

// Callback is one completion callback to send.
type Callback struct {
	// ID is the event's webhook-id, the same on every attempt.
	ID    string
	Queue string
	URL   string
	Body  []byte
	// Secret signs it: the queue's CallbackSecret as declared now.
	Secret webhook.Secret
	// Attempt counts the attempts, this one included (from 1).
	Attempt int
	jm      jetstream.Msg
}

// Done acknowledges a callback its receiver accepted.
func (c *Callback) Done() error { return c.jm.Ack() }

// Retry hands the callback back for another attempt after `after`.
func (c *Callback) Retry(after time.Duration) error {
	return c.jm.NakWithDelay(max(after, time.Millisecond))
}

// Drop gives the callback up for good.
func (c *Callback) Drop(reason string) error { return c.jm.TermWithReason(reason) }

// ErrDropped is returned by CallbackConsumer.Next for a job it dropped (forged, or its
// queue no longer allows it); the error says why.
var ErrDropped = errors.New("queue: callback dropped")

// CallbackConsumer hands out the callbacks to send: a durable pull consumer shared by
// every sender.
type CallbackConsumer struct {
	s    *Store
	cons jetstream.Consumer
}

// CallbackConsumer returns the consumer of the callback jobs, creating the stream and
// the consumer when needed. ackWait bounds one attempt (a sender that dies mid-attempt
// gives it back after that long); maxInFlight caps attempts at once across senders.
func (s *Store) CallbackConsumer(ctx context.Context, ackWait time.Duration, maxInFlight int) (*CallbackConsumer, error) {
	st, err := s.ensureCallbackStream(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       callbackConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: maxInFlight,
		MaxDeliver:    -1, // the sender counts attempts and drops
	})
	if err != nil {
		return nil, fmt.Errorf("%w: callback consumer: %v", ErrUnavailable, err)
	}
	return &CallbackConsumer{s: s, cons: cons}, nil
}

// Next waits up to wait for a callback. It returns (nil, nil) when none came. A job
// that does not verify, or whose queue no longer takes callbacks to its URL, is
// terminated and reported as an error wrapping ErrDropped.
func (c *CallbackConsumer) Next(ctx context.Context, wait time.Duration) (*Callback, error) {
	fctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	batch, err := c.cons.Fetch(1, jetstream.FetchContext(fctx))
	if err != nil {
		return nil, fmt.Errorf("%w: fetch callbacks: %v", ErrUnavailable, err)
	}
	var jm jetstream.Msg
	for m := range batch.Messages() {
		jm = m
	}
	if jm == nil {
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return nil, fmt.Errorf("%w: fetch callbacks: %v", ErrUnavailable, err)
		}
		return nil, nil
	}
	h := jm.Headers()
	cb := &Callback{ID: h.Get(headerEventID), Queue: h.Get(HeaderQueue), URL: h.Get(HeaderCallback), Body: jm.Data(), jm: jm}
	if md, err := jm.Metadata(); err == nil {
		cb.Attempt = int(md.NumDelivered)
	}
	drop := func(reason string) (*Callback, error) {
		_ = jm.TermWithReason(reason)
		return nil, fmt.Errorf("%w: %s %s: %s", ErrDropped, cb.Queue, cb.ID, reason)
	}
	// A genuine job copied to another subject is still the same job to the same URL.
	if !checkSig(h.Get(HeaderSignature), c.s.callbackMAC(cb.Queue, cb.URL, cb.ID, cb.Body)) {
		return drop("forged: missing or wrong signature")
	}
	q, err := c.s.Queue(cb.Queue)
	if err != nil {
		return drop("its queue is not declared")
	}
	cfg := q.Config()
	if _, err := cfg.CheckCallback(cb.URL); err != nil {
		return drop(err.Error())
	}
	if cb.Secret, err = webhook.ParseSecret(cfg.CallbackSecret); err != nil {
		return drop("the queue has no usable callback_secret")
	}
	return cb, nil
}
