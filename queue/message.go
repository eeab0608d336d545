package queue

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"iter"
	"net/http"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/subscriber"
)

// NATS header names of a parked message. The message data is the request body; the
// request line, the metadata and the kept request headers travel as NATS headers:
//
//	Nats-Msg-Id             the ticket, or "k."+scoped key for an order with an idempotency
//	                        key (JetStream's duplicate window dedupes republishes)
//	Sluice-Ticket           the ticket
//	Sluice-Queue            queue name
//	Sluice-Rule             name of the rule that deferred the request
//	Sluice-Method           HTTP method
//	Sluice-Path             escaped path ("/v1/orders")
//	Sluice-Query            raw query without '?'
//	Sluice-Received-At      when ingress received the request, RFC 3339 with nanoseconds
//	Sluice-Client           hash of the client key (never a raw key or IP)
//	Sluice-Idempotency-Key  the client's Idempotency-Key, if any
//	Sluice-Fingerprint      hex SHA-256 payload fingerprint (see Fingerprint)
//	Sluice-Callback         the URL to call when the order ends (see Request.Callback)
//	Sluice-Lane             the order's lane in a laned queue (see ReadySubject)
//	Sluice-Flow-Key         the keyed hash of the order's flow_by value (see Message.FlowKey)
//	Sluice-Not-Before       a scheduled order's due time, RFC 3339 in whole seconds (absent
//	                        for an order delivered as soon as its turn comes)
//	Sluice-Traceparent      W3C trace context of the park (see Message.TraceParent)
//	Sluice-Tracestate       its tracestate, if any
//	Sluice-Signature        HMAC of all the above, the headers and the body (see Store.Verify)
//	Sluice-H-{Name}         each kept request header, canonical name, every value
//
// Headers not kept: hop-by-hop headers (Connection and those it names, Keep-Alive,
// Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE, Trailer,
// Transfer-Encoding, Upgrade), Host, Content-Length, Expect and the queue's
// DropHeaders. The client's Idempotency-Key is kept as sent (Sluice-H-Idempotency-Key),
// so a delivery carries the same key as a proxied request of the same order.
const (
	HeaderMsgID          = jetstream.MsgIDHeader
	HeaderTicket         = "Sluice-Ticket"
	HeaderQueue          = "Sluice-Queue"
	HeaderRule           = "Sluice-Rule"
	HeaderMethod         = "Sluice-Method"
	HeaderPath           = "Sluice-Path"
	HeaderQuery          = "Sluice-Query"
	HeaderReceivedAt     = "Sluice-Received-At"
	HeaderClient         = "Sluice-Client"
	HeaderIdempotencyKey = "Sluice-Idempotency-Key"
	HeaderFingerprint    = "Sluice-Fingerprint"
	HeaderLane           = "Sluice-Lane"
	HeaderFlowKey        = "Sluice-Flow-Key"
	HeaderNotBefore      = "Sluice-Not-Before"
	HeaderTraceParent    = "Sluice-Traceparent"
	HeaderTraceState     = "Sluice-Tracestate"
	HeaderPrefix         = "Sluice-H-"

	// Headers added to dead letters.
	HeaderDeadReason   = "Sluice-Dead-Reason"
	HeaderDeadAttempts = "Sluice-Dead-Attempts"
	HeaderDeadAt       = "Sluice-Dead-At"
	HeaderDeadSeq      = "Sluice-Dead-Stream-Seq"
)

// Request is what ingress hands over when it defers a request.
type Request struct {
	// Queue is the queue to park in (required).
	Queue string
	// Rule names the rule that deferred the request (for status and logs).
	Rule string
	// Method, Path (escaped, starting with "/") and RawQuery (without '?') of the
	// original request. Method and Path are required.
	Method   string
	Path     string
	RawQuery string
	// Header holds the request headers; Park drops the ones that must not be kept.
	Header http.Header
	// Body is the request body (ingress enforces its size cap).
	Body []byte
	// Client is the client identity as a hash (ingress never passes raw keys or IPs).
	// Idempotency keys are scoped by it.
	Client string
	// IdempotencyKey is the client's Idempotency-Key header value, if any.
	IdempotencyKey string
	// ReceivedAt is when ingress received the request (default: now).
	ReceivedAt time.Time
	// Callback is a URL to tell when the order ends (done, failed or dead), from the
	// client's Sluice-Callback header. Park refuses one the queue does not allow
	// (queueconfig.Config.CheckCallback).
	Callback string
	// Priority is the value of the route's priority source: a level of the queue's
	// Priorities (another value, or none, is the queue's default level). Ignored by a
	// queue without priorities.
	Priority string
	// Tenant is the value of the queue's fair_by source (ignored by a queue without
	// it). It is never stored: Park keeps only the lane it hashes to.
	Tenant string
	// Flow is the value of the queue's flow_by source (ignored by a queue without
	// it). It is never stored: Park keeps only its hash (Message.FlowKey).
	Flow string
	// NotBefore asks that the order be delivered no sooner than this (zero: as soon as
	// its turn comes). It must lie within the queue's MaxDelay of ReceivedAt (else
	// ErrSchedule). A parked Message holds its effective due time here: the later of
	// NotBefore and ReceivedAt plus the queue's Delay, rounded up to a whole second
	// (JetStream schedules count whole seconds), or zero when that was not in the
	// future at parking.
	NotBefore time.Time
}

// Message is a parked request as stored in (and read back from) a queue.
type Message struct {
	Request
	// Ticket is the unguessable identifier given to the client: 128 random bits,
	// base32 (lower case, no padding), 26 characters.
	Ticket string
	// Fingerprint is the payload fingerprint used for idempotency (see Fingerprint).
	Fingerprint string
	// TraceParent and TraceState are the W3C trace context (traceparent, tracestate)
	// of the park: Park's span (see WithTracerProvider), else the span of the context
	// Park was given; empty when neither was valid. The dispatcher's delivery span
	// links to it. They are covered by the signature like the rest, though a forged
	// one could do no harm: it only names the span a delivery links to.
	TraceParent, TraceState string
	// Signature is the value of HeaderSignature: set by Park, kept as it is by dead
	// letters and re-queueing, checked by Store.Verify.
	Signature string
	// Lane is where the order waits in a laned queue (see ReadySubject): "" in a queue
	// without priorities and fair_by.
	Lane string
	// FlowKey is the key whose own outflow the order waits for in a queue with
	// flow_by (queueconfig.FlowBy): 32 hex digits of an HMAC of Request.Flow with the
	// signing key, so that neither the stream, nor logs and metrics, hold the value
	// itself ("" in a queue without flow_by).
	FlowKey string

	// Set when the message is read back from JetStream.
	Seq       uint64    // stream sequence
	Delivered uint64    // JetStream delivery count (counts pauses and crash redeliveries too)
	StoredAt  time.Time // when JetStream stored it
	subject   string    // where it was read from
}

var ticketEncoding = base32.StdEncoding.WithPadding(base32.NoPadding)

// newTicket returns a fresh ticket: 128 bits from crypto/rand, base32 lower case.
func newTicket() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand panics on failure)
	return strings.ToLower(ticketEncoding.EncodeToString(b[:]))
}

// ValidTicket reports whether s has the shape of a ticket.
func ValidTicket(s string) bool {
	if len(s) != 26 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// Fingerprint is the hex SHA-256 of the parts of a request that make it "the same
// payload" for idempotency: method, path, raw query, the Content-Type and
// Content-Encoding headers, and the body. Other headers (tracing ids, dates, user agents)
// may differ between retries of the same request and are not part of it.
func Fingerprint(r *Request) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	field([]byte(strings.ToUpper(r.Method)))
	field([]byte(r.Path))
	field([]byte(r.RawQuery))
	field([]byte(strings.Join(r.Header.Values("Content-Type"), ",")))
	field([]byte(strings.Join(r.Header.Values("Content-Encoding"), ",")))
	field(r.Body)
	return hex.EncodeToString(h.Sum(nil))
}

var hopByHop = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade",
	"Host", "Content-Length", "Expect",
	HeaderCallback, // an instruction to sluice, kept as the message's own header
	HeaderTicket,   // the dispatcher's to set on a delivery: a client's own is never kept
}

// KeptHeader returns a copy of h without the headers that are never stored: hop-by-hop
// headers (including those named in Connection), Host, Content-Length, Expect and the
// names in dropHeaders (a queue's DropHeaders). Values with CR or LF are dropped, the
// others lose the blanks around them.
func KeptHeader(h http.Header, dropHeaders []string) http.Header {
	out := make(http.Header, len(h))
	for ck, v := range keptFields(h, dropHeaders) {
		out[ck] = append(out[ck], v)
	}
	return out
}

// keptHeaderSize is what KeptHeader(h, dropHeaders) adds to a parked message's
// header block (see Message.headerSize), computed without copying h.
func keptHeaderSize(h http.Header, dropHeaders []string) int {
	n := 0
	for ck, v := range keptFields(h, dropHeaders) {
		n += subscriber.HeaderValueSize(ck, v)
	}
	return n
}

// keptFields yields the canonical name and the value of each value KeptHeader keeps
// of h.
func keptFields(h http.Header, dropHeaders []string) iter.Seq2[string, string] {
	return func(yield func(string, string) bool) {
		// The names to drop are looked up where they are, but for those a Connection
		// header names (rare: the front door has dropped it already), which go into a
		// set with the others.
		var drop map[string]bool
		if conn := h.Values("Connection"); len(conn) > 0 {
			drop = make(map[string]bool, len(hopByHop)+len(dropHeaders))
			for _, k := range hopByHop {
				drop[k] = true
			}
			for _, k := range dropHeaders {
				drop[textproto.CanonicalMIMEHeaderKey(k)] = true
			}
			for _, v := range conn {
				for _, f := range strings.Split(v, ",") {
					if f = strings.TrimSpace(f); f != "" {
						drop[textproto.CanonicalMIMEHeaderKey(f)] = true
					}
				}
			}
		}
		for k, vs := range h {
			ck := textproto.CanonicalMIMEHeaderKey(k)
			if dropped(ck, drop, dropHeaders) || !queueconfig.ValidHeaderName(ck) {
				continue
			}
			for _, v := range vs {
				if strings.ContainsAny(v, "\r\n") {
					continue
				}
				// Blanks around a value are not part of it (RFC 9110 section 5.5), and
				// NATS drops those in front when it decodes the message: kept, they would
				// make the signed header differ from the one read back, and the order
				// forged.
				if !yield(ck, strings.Trim(v, " \t")) {
					return
				}
			}
		}
	}
}

// dropped reports whether KeptHeader drops the header of canonical name ck: by the set
// drop when there is one, else when ck is hop-by-hop or in dropHeaders.
func dropped(ck string, drop map[string]bool, dropHeaders []string) bool {
	if drop != nil {
		return drop[ck]
	}
	if slices.Contains(hopByHop, ck) {
		return true
	}
	for _, k := range dropHeaders {
		if textproto.CanonicalMIMEHeaderKey(k) == ck {
			return true
		}
	}
	return false
}

func (r *Request) validate() error {
	switch {
	case r.Queue == "":
		return fmt.Errorf("%w: no queue", ErrInvalidRequest)
	case r.Method == "" || strings.ContainsAny(r.Method, " \t\r\n"):
		return fmt.Errorf("%w: bad method %q", ErrInvalidRequest, r.Method)
	case strings.ContainsAny(r.Rule+r.Client+r.IdempotencyKey+r.Callback, "\r\n"):
		return fmt.Errorf("%w: rule, client and idempotency key must not hold CR or LF", ErrInvalidRequest)
	}
	if err := CheckTarget(r.Path, r.RawQuery); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidRequest, err)
	}
	return nil
}

// CheckTarget reports whether an escaped path and a raw query can be delivered: the
// path starts with a single '/' (so "@host/x", "//host/x" and "http://host/x" are
// refused) and is validly escaped; the query holds no spaces, control characters or
// '#'. Park refuses anything else, and the dispatcher refuses such a parked message,
// so no parked path or query can send a delivery to another host.
func CheckTarget(path, rawQuery string) error {
	if !strings.HasPrefix(path, "/") || strings.HasPrefix(path, "//") {
		return fmt.Errorf("path %q does not start with a single '/'", path)
	}
	if i := strings.IndexFunc(path, func(c rune) bool { return c <= ' ' || c == 0x7f }); i >= 0 {
		return fmt.Errorf("path holds %q", path[i])
	}
	if _, err := url.PathUnescape(path); err != nil {
		return fmt.Errorf("path %q: %w", path, err)
	}
	if i := strings.IndexFunc(rawQuery, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '#' }); i >= 0 {
		return fmt.Errorf("query holds %q", rawQuery[i])
	}
	return nil
}

// readyFilter matches every ready subject of a queue (ReadySubject, laned or not): the
// filter of the queue's consumer in an unlaned queue. The schedule subjects lie outside.
func readyFilter(queue string) string { return "sluice.q." + queue + ".>" }

// scheduleSubjectFor is the subject of a scheduled order's JetStream schedule message
// until it is due: sluice.s.{queue}.{ticket}. Outside readyFilter, so the dispatch
// consumers never see it.
func scheduleSubjectFor(queue, ticket string) string { return "sluice.s." + queue + "." + ticket }

// scheduleFilter matches every schedule subject of a queue.
func scheduleFilter(queue string) string { return scheduleSubjectFor(queue, "*") }

// order returns the fields m shares with a delivered order (package subscriber's
// wire format, which parked messages share), read from subject.
func (m *Message) order(subject string) *subscriber.Order {
	return &subscriber.Order{
		Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, Method: m.Method, Path: m.Path, RawQuery: m.RawQuery,
		Header: m.Header, Body: m.Body, ReceivedAt: m.ReceivedAt, Client: m.Client,
		IdempotencyKey: m.IdempotencyKey, Fingerprint: m.Fingerprint, Subject: subject,
	}
}

// encode turns m into the NATS message parked on subject: subscriber.Encode's
// message of the order, with the headers only parked messages carry.
func (m *Message) encode(subject string) *nats.Msg {
	msg := subscriber.Encode(m.order(subject))
	h := msg.Header
	m.stringFields(func(k, v string) { setIf(h, k, v) })
	if !m.NotBefore.IsZero() {
		h.Set(HeaderNotBefore, m.NotBefore.UTC().Format(time.RFC3339))
	}
	return msg
}

// stringFields calls field with the name and value of each header field encode adds
// to the order's (subscriber.Encode) from a string of m, empty or not (encode leaves
// the empty ones out): every field it adds but the due time.
func (m *Message) stringFields(field func(k, v string)) {
	field(HeaderCallback, m.Callback)
	field(HeaderLane, m.Lane)
	field(HeaderFlowKey, m.FlowKey)
	field(HeaderTraceParent, m.TraceParent)
	field(HeaderTraceState, m.TraceState)
	field(HeaderSignature, m.Signature)
}

func setIf(h nats.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

// headerSize is the size in bytes of the header block of m.encode(subject) as NATS
// counts it (see subscriber.HeaderSize), computed without encoding m.
func (m *Message) headerSize(subject string) int {
	n := subscriber.HeaderSize(m.order(subject))
	m.stringFields(func(k, v string) { n += subscriber.FieldSize(k, v) })
	if !m.NotBefore.IsZero() {
		var ts [len(time.RFC3339)]byte
		n += subscriber.FieldSize(HeaderNotBefore, string(m.NotBefore.UTC().AppendFormat(ts[:0], time.RFC3339)))
	}
	return n
}

// Decode reads a parked message delivered by a JetStream consumer.
func Decode(jm jetstream.Msg) (*Message, error) {
	m, err := decode(jm.Subject(), jm.Headers(), jm.Data())
	if err != nil {
		return nil, err
	}
	if md, err := jm.Metadata(); err == nil {
		m.Seq = md.Sequence.Stream
		m.Delivered = md.NumDelivered
		m.StoredAt = md.Timestamp
	}
	return m, nil
}

func decodeRaw(rm *jetstream.RawStreamMsg) (*Message, error) {
	m, err := decode(rm.Subject, rm.Header, rm.Data)
	if err != nil {
		return nil, err
	}
	m.Seq = rm.Sequence
	m.StoredAt = rm.Time
	return m, nil
}

// decode reads a parked message with subscriber.ReadOrder, the decoder of delivered
// orders, and the headers only parked messages carry. A message without a ticket's
// shape, a valid queue name or a valid lane, or with a malformed timestamp, is not a
// parked request (an error): there is no dead letter to put it in. Any other field,
// however malformed, is read as it is, so that the consumer dead-letters the message
// as forged (Verify refuses it) instead of dropping it.
func decode(subject string, h nats.Header, data []byte) (*Message, error) {
	o, err := subscriber.ReadOrder(subject, h, data)
	if err != nil {
		return nil, fmt.Errorf("queue: message is not a parked request (ticket %q): %w", h.Get(HeaderTicket), err)
	}
	m := &Message{
		Ticket:      o.Ticket,
		Fingerprint: o.Fingerprint,
		Signature:   h.Get(HeaderSignature),
		Lane:        h.Get(HeaderLane),
		FlowKey:     h.Get(HeaderFlowKey),
		TraceParent: h.Get(HeaderTraceParent),
		TraceState:  h.Get(HeaderTraceState),
		Request: Request{
			Queue:          o.Queue,
			Rule:           o.Rule,
			Method:         o.Method,
			Path:           o.Path,
			RawQuery:       o.RawQuery,
			Client:         o.Client,
			IdempotencyKey: o.IdempotencyKey,
			Callback:       h.Get(HeaderCallback),
			ReceivedAt:     o.ReceivedAt,
			Body:           o.Body,
			Header:         o.Header,
		},
		subject: subject,
	}
	if !ValidTicket(m.Ticket) || !queueconfig.ValidName(m.Queue) || (m.Lane != "" && !validLane(m.Lane)) ||
		(m.FlowKey != "" && !ValidFlowKey(m.FlowKey)) {
		return nil, fmt.Errorf("queue: message is not a parked request (ticket %q)", m.Ticket)
	}
	if ts := h.Get(HeaderNotBefore); ts != "" {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return nil, fmt.Errorf("queue: message %s: bad %s: %w", m.Ticket, HeaderNotBefore, err)
		}
		m.NotBefore = t
	}
	return m, nil
}

// Headers returns the metadata headers of m, as published to nats:SUBJECT downstreams
// (without Nats-Msg-Id, which the publisher sets, without sluice's own signature,
// which only holders of the signing key could check: Forward adds the delivery
// signature a consumer checks with its queue's key, and without the park's trace
// context: Forward sends the delivery's as traceparent).
func (m *Message) Headers() nats.Header {
	msg := m.encode("_")
	msg.Header.Del(HeaderMsgID)
	msg.Header.Del(HeaderSignature)
	msg.Header.Del(HeaderCallback)
	msg.Header.Del(HeaderTraceParent)
	msg.Header.Del(HeaderTraceState)
	return msg.Header
}
