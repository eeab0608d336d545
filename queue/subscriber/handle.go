package subscriber

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Handler does the work of one verified order. It returns the result to keep in the
// order's ticket (nil: none), or an error to have the order delivered again.
type Handler func(ctx context.Context, o *Order) (*Result, error)

// RetryDelay is how long Handle has JetStream wait before it redelivers an order
// whose handler or reply failed.
const RetryDelay = time.Second

// Handle processes a message of a JetStream consumer of the queue's subject the way
// the contract asks (see the package documentation): it decodes and verifies the
// order, terminating a message that is no order of this queue (and returning why);
// calls h; publishes the result, if any, with Reply; and acknowledges the message.
// When h or the reply fails, the message is handed back (NakWithDelay RetryDelay) and
// the error returned. h must be idempotent on the ticket: an order may come again.
func (v *Verifier) Handle(ctx context.Context, js jetstream.JetStream, jm jetstream.Msg, h Handler) error {
	o, err := DecodeJetStream(jm)
	if err == nil {
		err = v.Verify(o)
	}
	if err != nil {
		_ = jm.TermWithReason(err.Error())
		return err
	}
	r, err := h(ctx, o)
	if err == nil && r != nil {
		err = v.Reply(ctx, js, o, *r)
	}
	if err != nil {
		_ = jm.NakWithDelay(RetryDelay)
		return fmt.Errorf("subscriber: order %s: %w", o.Ticket, err)
	}
	if err := jm.Ack(); err != nil {
		return fmt.Errorf("subscriber: order %s: ack: %w", o.Ticket, err)
	}
	return nil
}
