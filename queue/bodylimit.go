package queue

import (
	"fmt"
	"strconv"
	"time"
)

// MetadataRoom is what a parked message keeps free, beside the request's body and
// headers, under the NATS server's max payload: for the headers sluice adds after the
// body limit is known (a dead letter's reason, time and TTL; a requeue's message id).
const MetadataRoom = 4 << 10

// storeRoom is what a message takes in a stream beside its subject, headers and body:
// JetStream's file store frames each record with 34 bytes; the rest is a margin for a
// header added after encoding.
const storeRoom = 512

// BodyLimit is the largest request body a queue can store for one request, and the
// setting that makes it so.
type BodyLimit struct {
	Bytes int64
	// By names the binding setting for the client's 413: "max_body", "max_bytes" or
	// "the NATS server's max payload".
	By string
}

func (l BodyLimit) String() string {
	return strconv.FormatInt(l.Bytes, 10) + " bytes (" + l.By + ")"
}

// BodyLimit returns the largest body req can carry and still be stored in its queue:
// the smallest of the queue's MaxBody, its MaxBytes (a body larger than the whole queue
// can never fit, however empty it is) and the NATS server's max payload, the last two
// less what req's headers and MetadataRoom take. req.Body is not looked at: the
// ingress asks before it reads the body. Errors: ErrUnknownQueue.
func (s *Store) BodyLimit(req *Request) (BodyLimit, error) {
	q, err := s.Queue(req.Queue)
	if err != nil {
		return BodyLimit{}, err
	}
	cfg := q.Config()
	limit := BodyLimit{Bytes: cfg.MaxBody, By: "max_body"}
	// The message as Park would encode it, without a body: its subject and headers
	// count against the stream's bytes and the server's max payload.
	// The time is one of the longest in RFC 3339 with nanoseconds (which drops
	// trailing zeros), so the limit does not depend on the clock.
	m := &Message{Request: *req, Ticket: newTicket(), Fingerprint: fmt.Sprintf("%064x", 0)}
	m.Body, m.ReceivedAt = nil, time.Date(2000, 1, 1, 0, 0, 0, 111_111_111, time.UTC)
	m.Header = KeptHeader(req.Header, cfg.DropHeaders)
	m.Lane = s.laneFor(cfg, req.Priority, req.Tenant)
	size := int64(m.encode(ReadySubject(q.name, m.Lane, m.Ticket)).Size())
	if cfg.MaxBytes > 0 && cfg.MaxBytes-size-storeRoom < limit.Bytes {
		limit = BodyLimit{Bytes: cfg.MaxBytes - size - storeRoom, By: "max_bytes"}
	}
	if payload := s.nc.MaxPayload(); payload > 0 && payload-size-MetadataRoom < limit.Bytes {
		limit = BodyLimit{Bytes: payload - size - MetadataRoom, By: "the NATS server's max payload"}
	}
	limit.Bytes = max(limit.Bytes, 0)
	return limit, nil
}
