package queue

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/subscriber"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// ForwardOption configures Store.Forward.
type ForwardOption func(*forwardOptions)

type forwardOptions struct{ atMostOnce bool }

// ForwardAtMostOnce publishes with core NATS and a flush instead of through JetStream
// (a queue with delivery at_most_once): done once the server has it, subscribers or not.
func ForwardAtMostOnce() ForwardOption { return func(o *forwardOptions) { o.atMostOnce = true } }

// Forward publishes a parked order to a NATS subject (a nats:SUBJECT downstream): the
// body with the metadata headers (Message.Headers), the ticket as Nats-Msg-Id and the
// order's delivery signature (subscriber.HeaderDeliverySignature, under the queue's
// DeliveryKey), which consumers check with package subscriber, and the span context
// of ctx, if valid, as a W3C traceparent (and tracestate) header.
// By default through JetStream: done once a stream acknowledged it (at least once;
// Declare made sure a stream captures the subject); seq is its stream sequence.
//
// Errors that say the subject cannot be reached at all (no responders, no stream, the
// connection closed or down) wrap ErrUnavailable; those that say no answer came in time
// wrap context.DeadlineExceeded. Either way the text is the publish's own.
func (s *Store) Forward(ctx context.Context, subject string, m *Message, opts ...ForwardOption) (seq uint64, err error) {
	var o forwardOptions
	for _, opt := range opts {
		opt(&o)
	}
	msg := nats.NewMsg(subject)
	msg.Header = m.Headers()
	msg.Header.Set(HeaderMsgID, m.Ticket)
	telemetry.Inject(ctx, http.Header(msg.Header))
	msg.Data = m.Body
	// Signed as the consumer decodes it, so that both sides cover the same fields.
	ord, err := subscriber.Decode(msg)
	if err != nil {
		return 0, fmt.Errorf("%w: cannot forward %s: %w", ErrInvalidRequest, m.Ticket, err)
	}
	msg.Header.Set(subscriber.HeaderDeliverySignature, subscriber.SignOrder(s.DeliveryKey(m.Queue), ord))
	if !o.atMostOnce {
		ack, err := s.js.PublishMsg(ctx, msg)
		if err != nil {
			return 0, forwardError(fmt.Errorf("publish to %s: %w", subject, err))
		}
		return ack.Sequence, nil
	}
	if err := s.nc.PublishMsg(msg); err != nil {
		return 0, forwardError(fmt.Errorf("publish to %s: %w", subject, err))
	}
	if err := s.nc.FlushWithContext(ctx); err != nil {
		return 0, forwardError(fmt.Errorf("flush to %s: %w", subject, err))
	}
	return 0, nil
}

// DeliveryKey returns the delivery key of a queue: the key its nats:SUBJECT consumers
// check its orders and sign its results with (subscriber.DeliveryKey of the signing
// key). It cannot sign anything of another queue, nor anything sluice keeps.
func (s *Store) DeliveryKey(queue string) []byte {
	return subscriber.DeliveryKey(s.opts.signingKey, queue)
}

// forwardError adds to err the class callers branch on (see Forward), keeping its text.
func forwardError(err error) error {
	switch {
	case errors.Is(err, nats.ErrNoResponders), errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, nats.ErrConnectionClosed), errors.Is(err, nats.ErrDisconnected):
		return classed{err, ErrUnavailable}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return classed{err, context.DeadlineExceeded}
	}
	return err
}

// classed is err that also matches class (errors.Is), with err's text.
type classed struct{ err, class error }

func (c classed) Error() string   { return c.err.Error() }
func (c classed) Unwrap() []error { return []error{c.err, c.class} }
