package queue

import (
	"context"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// watchInactive is how long the server keeps a record watch's consumer once nobody
// pulls from it (a process that died without deleting it).
const watchInactive = time.Minute

// WatchRecords tells changed the ticket of every ticket record written from its
// return on, by any process (a dispatcher settling an order, a cancel, a requeue):
// through one ordered consumer on TicketsBucket that carries headers only, never a
// record's body, and is resumed where it left off after a reconnect. It is how the
// ingress learns that a ticket someone waits for has changed without reading NATS per
// waiting client: the cost is one small message per record written in the whole
// cluster, whatever the number of waiters. changed runs on the watch's goroutine
// and must not block. Records a dispatcher could not write yet (see Lease) are told
// when they are written. stop ends the watch, deletes its consumer and returns once
// changed is no longer called. An error wraps ErrUnavailable.
func (s *Store) WatchRecords(ctx context.Context, changed func(ticket string)) (stop func(), err error) {
	prefix := jsproto.KVSubject(TicketsBucket, "")
	oc, err := s.js.OrderedConsumer(ctx, jsproto.KVStream(TicketsBucket), jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{jsproto.KVSubject(TicketsBucket, ">")},
		DeliverPolicy:     jetstream.DeliverNewPolicy,
		HeadersOnly:       true,
		InactiveThreshold: watchInactive,
	})
	if err != nil {
		return nil, unavailable("watch ticket records", err)
	}
	cc, err := oc.Consume(func(m jetstream.Msg) {
		if ticket, ok := strings.CutPrefix(m.Subject(), prefix); ok && ValidTicket(ticket) {
			changed(ticket)
		}
	})
	if err != nil {
		return nil, unavailable("watch ticket records", err)
	}
	return func() {
		cc.Stop()
		<-cc.Closed()
		// Stop leaves the consumer to its inactive threshold; a process whose waits come
		// and go would pile them up on the server.
		dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if info := oc.CachedInfo(); info != nil {
			_ = s.js.DeleteConsumer(dctx, jsproto.KVStream(TicketsBucket), info.Name)
		}
	}, nil
}
