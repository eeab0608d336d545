package queue

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// NewTicket lets the external tests make tickets as Park does.
var NewTicket = newTicket

// Conn, JetStream and Stream let the external tests look at and change the server state
// the store keeps to itself.
func (s *Store) Conn() *nats.Conn               { return s.nc }
func (s *Store) JetStream() jetstream.JetStream { return s.js }
func (q *Queue) Stream() jetstream.Stream       { return q.stream }

// WriterBatches tells how Park's writers of q's stream and key stream batch (see
// directWrites); -1 for a writer there is not.
func (q *Queue) WriterBatches() (orders, slots int) {
	orders, slots = -1, -1
	if w := q.orders.Load(); w != nil {
		orders = w.direct
	}
	if w := q.slots.Load(); w != nil {
		slots = w.direct
	}
	return orders, slots
}

// HeldTickets is how many tickets the handle holds leases of (see Consumer.hold).
func (c *Consumer) HeldTickets() int {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	return len(c.leased)
}

// InProgress resets the lease's ack wait on the server, as a dispatcher that works on
// its order for long would.
func (l *Lease) InProgress() error { return l.jm.InProgress() }

// KeepRecord, MarkDelivering, PublishEvent, SaveRecord and DeadLetter let the
// external tests drive the bookkeeping a Lease does; LaneFor tells them the lane Park
// gives an order.
func (s *Store) KeepRecord(rec *Record) error { return s.keepRecord(rec) }
func (s *Store) MarkDelivering(ctx context.Context, rec *Record) error {
	return s.markDelivering(ctx, rec)
}
func (s *Store) PublishEvent(subject string, ev Event) error       { return s.publishEvent(subject, ev) }
func (s *Store) SaveRecord(ctx context.Context, rec *Record) error { return s.saveRecord(ctx, rec) }
func (s *Store) DeadLetter(ctx context.Context, m *Message, attempts int, reason string) error {
	return s.deadLetter(ctx, m, attempts, reason)
}
func (s *Store) LaneFor(cfg queueconfig.Config, priority, tenant string) string {
	return s.laneFor(cfg.WithDefaults(), priority, tenant)
}

// StreamInfo is q's stream info at most maxAge old, as Park reads it (see streamInfo).
func (q *Queue) StreamInfo(ctx context.Context, maxAge time.Duration) (*jetstream.StreamInfo, error) {
	return q.streamInfo(ctx, maxAge)
}
