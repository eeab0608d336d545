package queue

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/webhook"
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
	// headerCallbackAttempts is how many attempts a job's earlier copies made (absent: none),
	// headerCallbackDue when it is to be tried next (RFC 3339; absent: at once). Neither is
	// covered by the job's signature: whoever could forge them could as well publish the
	// genuine job again, which sends it again.
	headerCallbackAttempts = "Sluice-Callback-Attempts"
	headerCallbackDue      = "Sluice-Callback-Due"

	callbackConsumer = "callbacks"
	callbackMaxBytes = 256 << 20
	// CallbackMaxJobs caps the jobs of the callback stream, and is the pending limit of its
	// consumer: however many callbacks wait for their receivers, the pending limit cannot
	// be what holds up another one.
	CallbackMaxJobs = 100_000
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
		MaxMsgs:     CallbackMaxJobs,
		MaxAge:      CallbackMaxAge,
		Replicas:    s.opts.replicas,
		// A settle repeated after a crash (the order came back before its ack) writes
		// the same job again: the event id dedupes it.
		Duplicates: 10 * time.Minute,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: callback stream: %w", ErrUnavailable, err)
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
	// Private is the queue's CallbackPrivate as declared now: the URL's host may
	// resolve to any address.
	Private bool
	// Attempt is the number of the attempt it is fetched for, from 1: the attempts
	// its earlier copies recorded, plus one. (An attempt whose sender died before it
	// could record it is not counted.)
	Attempt int
	// Due is when it is to be tried (zero: at once). One fetched sooner goes back
	// untried with Wait.
	Due time.Time
	jm  jetstream.Msg
	s   *Store
}

// Done acknowledges a callback its receiver accepted.
func (c *Callback) Done() error { return c.jm.Ack() }

// Retry hands the callback back to be tried again at due, the attempt it was fetched
// for counted.
func (c *Callback) Retry(ctx context.Context, due time.Time) error {
	return c.again(ctx, c.Attempt, due)
}

// Defer hands the callback back untried, to be tried at due.
func (c *Callback) Defer(ctx context.Context, due time.Time) error {
	return c.again(ctx, c.Attempt-1, due)
}

// Wait puts a callback fetched before its Due back until then, untried.
func (c *Callback) Wait(d time.Duration) error {
	return c.jm.NakWithDelay(min(max(d, time.Millisecond), CallbackMaxAge))
}

// again stores a copy of the job that records attempts and due, then acknowledges this
// one: a job waiting for its receiver is a stored message like a new one, not a
// delivery held in the consumer's pending set. The copy is fetched at once and waits
// out its due there (Wait), as every job of the stream may (the pending limit is
// CallbackMaxJobs). When the copy cannot be stored (the stream full, NATS down), the
// job itself waits until due, its attempts not advanced. A crash between the two
// leaves both, so the receiver may see the callback once more: it drops repeats by
// webhook-id.
func (c *Callback) again(ctx context.Context, attempts int, due time.Time) error {
	msg := nats.NewMsg(c.jm.Subject())
	msg.Data = c.jm.Data()
	for k, v := range c.jm.Headers() {
		msg.Header[k] = v
	}
	msg.Header.Set(HeaderMsgID, c.ID+"."+strconv.Itoa(attempts)+"."+strconv.FormatInt(due.UnixNano(), 10))
	msg.Header.Set(headerCallbackAttempts, strconv.Itoa(attempts))
	msg.Header.Set(headerCallbackDue, due.UTC().Format(time.RFC3339Nano))
	pctx, cancel := context.WithTimeout(ctx, c.s.opts.publishTimeout)
	_, err := c.s.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(CallbackStream))
	cancel()
	if err != nil {
		if nerr := c.Wait(time.Until(due)); nerr != nil {
			return fmt.Errorf("%w: keep callback %s: %w", ErrUnavailable, c.ID, nerr)
		}
		return nil
	}
	return c.jm.Ack()
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
// gives it back after that long). Its pending limit is CallbackMaxJobs, the stream's
// own cap, not the senders' count: a callback waiting for its retry waits in the
// consumer's pending set (see Callback.Wait), and however many do, none holds up a
// callback to another receiver. The senders bound the attempts at once. (Measured:
// 5,000 callbacks waiting, a new one is fetched in 0.1 to 1 ms on the test server.)
func (s *Store) CallbackConsumer(ctx context.Context, ackWait time.Duration) (*CallbackConsumer, error) {
	st, err := s.ensureCallbackStream(ctx)
	if err != nil {
		return nil, err
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:       callbackConsumer,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       ackWait,
		MaxAckPending: CallbackMaxJobs,
		MaxDeliver:    -1, // the sender counts attempts and drops
	})
	if err != nil {
		return nil, fmt.Errorf("%w: callback consumer: %w", ErrUnavailable, err)
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
		return nil, fmt.Errorf("%w: fetch callbacks: %w", ErrUnavailable, err)
	}
	var jm jetstream.Msg
	for m := range batch.Messages() {
		jm = m
	}
	if jm == nil {
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			return nil, fmt.Errorf("%w: fetch callbacks: %w", ErrUnavailable, err)
		}
		return nil, nil
	}
	h := jm.Headers()
	cb := &Callback{ID: h.Get(headerEventID), Queue: h.Get(HeaderQueue), URL: h.Get(HeaderCallback), Body: jm.Data(), jm: jm, s: c.s}
	if n, err := strconv.Atoi(h.Get(headerCallbackAttempts)); err == nil && n > 0 && n < 1<<20 {
		cb.Attempt = n
	}
	cb.Attempt++
	if due, err := time.Parse(time.RFC3339Nano, h.Get(headerCallbackDue)); err == nil {
		cb.Due = due
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
	cb.Private = cfg.CallbackPrivate
	if cb.Secret, err = webhook.ParseSecret(cfg.CallbackSecret); err != nil {
		return drop("the queue has no usable callback_secret")
	}
	return cb, nil
}
