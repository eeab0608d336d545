package queue

import (
	"math"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
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
// ingress asks before it reads the body. Errors: ErrUnknownQueue, ErrHeaderTooLarge
// (a *HeaderLimitError: req's headers cannot be stored whatever the body).
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
	// Its size is computed, not encoded: a ticket's and a fingerprint's lengths stand
	// for the values Park draws.
	m := &Message{Request: *req, Ticket: sizingTicket, Fingerprint: sizingFingerprint}
	m.Body, m.ReceivedAt = nil, time.Date(2000, 1, 1, 0, 0, 0, 111_111_111, time.UTC)
	m.Header = nil // counted from req.Header, as KeptHeader would keep it
	m.Lane = s.laneFor(cfg, req.Priority, req.Tenant)
	subject := ReadySubject(q.name, m.Lane, m.Ticket)
	hdr := int64(m.headerSize(subject) + keptHeaderSize(req.Header, cfg.DropHeaders))
	if err := s.headerBlockFits(hdr, MetadataRoom); err != nil {
		return BodyLimit{}, err
	}
	size := int64(len(subject)) + hdr
	if cfg.MaxBytes > 0 && size+storeRoom > cfg.MaxBytes {
		// Even an empty queue could not hold it: "full" would be retried forever.
		return BodyLimit{}, &HeaderLimitError{Size: hdr, Limit: cfg.MaxBytes - storeRoom - int64(len(subject)), By: "max_bytes"}
	}
	if cfg.MaxBytes > 0 && cfg.MaxBytes-size-storeRoom < limit.Bytes {
		limit = BodyLimit{Bytes: cfg.MaxBytes - size - storeRoom, By: "max_bytes"}
	}
	if payload := s.nc.MaxPayload(); payload > 0 && payload-size-MetadataRoom < limit.Bytes {
		limit = BodyLimit{Bytes: payload - size - MetadataRoom, By: "the NATS server's max payload"}
	}
	limit.Bytes = max(limit.Bytes, 0)
	return limit, nil
}

// sizingTicket and sizingFingerprint have the lengths of a ticket (newTicket) and of a
// fingerprint (Fingerprint): BodyLimit sizes an order with them.
const (
	sizingTicket      = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	sizingFingerprint = "0000000000000000000000000000000000000000000000000000000000000000"
)

// MaxHeaderBytes is the longest header block JetStream stores with a message: the
// server writes its length in 16 bits and refuses a longer one ("header size exceeds
// maximum allowed of 64k"). The server does not announce it: it is no setting.
const MaxHeaderBytes = math.MaxUint16

// HeaderLimitError is returned (wrapped) when a request's headers cannot be stored:
// errors.Is(err, ErrHeaderTooLarge) holds for it.
type HeaderLimitError struct {
	// Size is the parked message's header block in bytes: the request's headers, each
	// name prefixed with HeaderPrefix, and sluice's own.
	Size int64
	// Limit is the most the block may take: the smaller of MaxHeaderBytes and the
	// connected server's max payload, less MetadataRoom for BodyLimit; or what the
	// queue's max_bytes leaves of a message beside its subject.
	Limit int64
	// By names the binding limit for the client's 431: "JetStream's 64 KiB header
	// limit", "the NATS server's max payload", or (from BodyLimit) "max_bytes", the
	// queue's, which such headers alone exceed.
	By string
}

func (e *HeaderLimitError) Error() string {
	return ErrHeaderTooLarge.Error() + ": " + strconv.FormatInt(e.Size, 10) + " bytes stored, more than " +
		strconv.FormatInt(e.Limit, 10) + " (" + e.By + ")"
}

func (e *HeaderLimitError) Unwrap() error { return ErrHeaderTooLarge }

// headerFits reports whether msg's headers can be stored with room bytes to spare.
// BodyLimit keeps MetadataRoom for the headers sluice adds later (a dead letter's, a
// requeue's); publish keeps none: it refuses only what the server would, so that a
// message the server can never take is refused as too large rather than retried as if
// NATS were down.
func (s *Store) headerFits(msg *nats.Msg, room int64) error {
	return s.headerBlockFits(int64(msg.Size()-len(msg.Subject)-len(msg.Reply)-len(msg.Data)), room)
}

// headerBlockFits is headerFits for a message whose header block takes hdr bytes.
func (s *Store) headerBlockFits(hdr, room int64) error {
	limit, by := int64(MaxHeaderBytes), "JetStream's 64 KiB header limit"
	if p := s.nc.MaxPayload(); p > 0 && p < limit {
		limit, by = p, "the NATS server's max payload"
	}
	if hdr+room > limit {
		return &HeaderLimitError{Size: hdr, Limit: limit - room, By: by}
	}
	return nil
}
