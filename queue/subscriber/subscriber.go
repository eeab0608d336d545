package subscriber

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Header names of a delivered order (the same names sluice parks with; see
// queue.HeaderTicket and the others).
const (
	HeaderMsgID          = jetstream.MsgIDHeader // Nats-Msg-Id: the ticket
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
	HeaderPrefix         = "Sluice-H-"
	// HeaderDeliverySignature authenticates a delivered order: "v1=" + base64
	// (standard, padded) of its HMAC-SHA256 under the queue's delivery key.
	HeaderDeliverySignature = "Sluice-Delivery-Signature"

	// Headers of a result (see Reply).
	HeaderResultStatus    = "Sluice-Result-Status"
	HeaderResultTruncated = "Sluice-Result-Truncated"
	HeaderResultPrefix    = "Sluice-Result-H-"
	HeaderResultSignature = "Sluice-Result-Signature"
)

// Bounds of a result. Reply truncates a longer body (and says so); sluice refuses a
// result over any of them.
const (
	// MaxResultBody is the most body bytes a result carries (queue.MaxResultBody).
	MaxResultBody = 64 << 10
	// MaxResultHeaderBytes bounds the names and values of a result's headers together.
	MaxResultHeaderBytes = 8 << 10
	// MaxResultHeaderValues bounds the count of a result's header values.
	MaxResultHeaderValues = 32
)

// MinDeliveryKey is the length of a delivery key (DeliveryKey), in bytes.
const MinDeliveryKey = sha256.Size

// ResultPrefix starts every result subject: ResultPrefix + queue + "." + ticket.
const ResultPrefix = "sluice.result."

// Errors. Each error of this package wraps one of them.
var (
	// ErrNotOrder: the message is not an order sluice delivered (missing or malformed
	// metadata headers).
	ErrNotOrder = errors.New("subscriber: not a sluice order")
	// ErrForged: the signature is missing or is not the queue's delivery key's.
	ErrForged = errors.New("subscriber: forged")
	// ErrInvalidResult: a result outside the bounds, or malformed.
	ErrInvalidResult = errors.New("subscriber: invalid result")
	// ErrInvalidKey: a delivery key of the wrong length, or no queue name.
	ErrInvalidKey = errors.New("subscriber: invalid delivery key")
)

const sigVersion = "v1="

// DeliveryKey derives the delivery key of a queue from sluice's signing key (the
// --queue-key): HMAC-SHA256(signingKey, "sluice delivery key" || queue), each part
// length-prefixed. Hand a queue's consumers its delivery key, never the signing key:
// with it they can check the orders of that queue and sign its results, and nothing
// else — not another queue's orders or results, not parked orders, ticket records or
// idempotency records, which the signing key itself signs.
func DeliveryKey(signingKey []byte, queue string) []byte {
	return mac(signingKey, "sluice delivery key", []byte(queue))
}

// mac returns HMAC-SHA256 under key over a domain label and the fields, each prefixed
// by its length (8 bytes, big endian), so that no two field lists share an encoding.
func mac(key []byte, domain string, fields ...[]byte) []byte {
	h := hmac.New(sha256.New, key)
	var n [8]byte
	for _, f := range append([][]byte{[]byte(domain)}, fields...) {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

// headerFields is the canonical encoding of a header: its count of names, then for
// each name in sorted order the name, its count of values and the values in order.
func headerFields(h http.Header) [][]byte {
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	fields := [][]byte{binary.BigEndian.AppendUint64(nil, uint64(len(names)))}
	for _, k := range names {
		vs := h[k]
		fields = append(fields, []byte(k), binary.BigEndian.AppendUint64(nil, uint64(len(vs))))
		for _, v := range vs {
			fields = append(fields, []byte(v))
		}
	}
	return fields
}

func encodeSig(sum []byte) string { return sigVersion + base64.StdEncoding.EncodeToString(sum) }

func checkSig(sig string, want []byte) bool {
	enc, ok := strings.CutPrefix(sig, sigVersion)
	if !ok {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(enc)
	return err == nil && hmac.Equal(got, want)
}

// Order is an order as delivered to a nats:SUBJECT downstream.
type Order struct {
	// Ticket is the order's ticket (26 characters, base32 lower case): the key to
	// deduplicate by, the same on every redelivery.
	Ticket string
	// Queue is the queue the order was parked in; Rule the rule that deferred it.
	Queue string
	Rule  string
	// Method, Path (escaped, starting with "/") and RawQuery (without '?') of the
	// client's request.
	Method   string
	Path     string
	RawQuery string
	// Header holds the client's request headers that sluice kept (canonical names).
	Header http.Header
	// Body is the request body.
	Body []byte
	// ReceivedAt is when sluice received the request.
	ReceivedAt time.Time
	// Client is a hash of the client's identity (never a raw key or address).
	Client string
	// IdempotencyKey is the client's Idempotency-Key, if it sent one.
	IdempotencyKey string
	// Fingerprint is the hex SHA-256 payload fingerprint sluice dedupes by.
	Fingerprint string
	// Subject is the subject the order was read from.
	Subject string
	// Signature is the value of HeaderDeliverySignature (checked by Verifier.Verify).
	Signature string
}

// Decode reads an order from a message of a nats:SUBJECT downstream (a core NATS
// subscription's message, or a JetStream one's: see DecodeJetStream): ReadOrder, then
// Order.Check. It checks the shape only: Verify the order before acting on it. A
// message without the metadata headers of an order wraps ErrNotOrder.
func Decode(msg *nats.Msg) (*Order, error) {
	if msg == nil {
		return nil, fmt.Errorf("%w: no message", ErrNotOrder)
	}
	return decode(msg.Subject, msg.Header, msg.Data)
}

// DecodeJetStream is Decode for a message of a JetStream consumer.
func DecodeJetStream(jm jetstream.Msg) (*Order, error) {
	return decode(jm.Subject(), jm.Headers(), jm.Data())
}

func decode(subject string, h nats.Header, data []byte) (*Order, error) {
	o, err := ReadOrder(subject, h, data)
	if err != nil {
		return nil, err
	}
	if err := o.Check(); err != nil {
		return nil, err
	}
	return o, nil
}

// ReadOrder reads the fields of an order from the subject, headers and body of a
// message as they are, checking nothing but the syntax of Sluice-Received-At (an
// error wrapping ErrNotOrder): an absent header reads as the empty string. It is the
// one decoder of the wire format: Decode is ReadOrder and Check, and sluice reads the
// orders it parks with it (parked orders carry a few headers more, never delivered),
// so that a message that is not an order's shape is still read and then refused as
// forged, not lost. Kept headers (Sluice-H-{Name}) whose names differ only in case
// (never sluice's: it writes canonical names) join under the canonical name in byte
// order of the names, so that every read of a message gives the same order.
func ReadOrder(subject string, h nats.Header, data []byte) (*Order, error) {
	o := &Order{
		Ticket:         h.Get(HeaderTicket),
		Queue:          h.Get(HeaderQueue),
		Rule:           h.Get(HeaderRule),
		Method:         h.Get(HeaderMethod),
		Path:           h.Get(HeaderPath),
		RawQuery:       h.Get(HeaderQuery),
		Client:         h.Get(HeaderClient),
		IdempotencyKey: h.Get(HeaderIdempotencyKey),
		Fingerprint:    h.Get(HeaderFingerprint),
		Signature:      h.Get(HeaderDeliverySignature),
		Subject:        subject,
		Body:           data,
		Header:         make(http.Header),
	}
	if ts := h.Get(HeaderReceivedAt); ts != "" {
		t, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			return nil, fmt.Errorf("%w: bad %s: %w", ErrNotOrder, HeaderReceivedAt, err)
		}
		o.ReceivedAt = t.UTC()
	}
	var names []string
	for k := range h {
		if name, ok := strings.CutPrefix(k, HeaderPrefix); ok && name != "" {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		ck := textproto.CanonicalMIMEHeaderKey(strings.TrimPrefix(k, HeaderPrefix))
		o.Header[ck] = append(o.Header[ck], h[k]...)
	}
	return o, nil
}

// Check reports whether o has the shape of an order sluice delivers: a ticket's shape,
// a valid queue name, a method, and a path starting with "/". Errors wrap ErrNotOrder.
// sluice parks nothing else, so an order that fails is not sluice's.
func (o *Order) Check() error {
	if !validTicket(o.Ticket) || !queueconfig.ValidName(o.Queue) || o.Method == "" || !strings.HasPrefix(o.Path, "/") {
		return fmt.Errorf("%w: missing or malformed %s, %s, %s or %s", ErrNotOrder, HeaderTicket, HeaderQueue, HeaderMethod, HeaderPath)
	}
	return nil
}

// Encode returns the message of o: on o.Subject, the body as data, the ticket as
// Nats-Msg-Id, each field as its header (Sluice-Received-At always, in UTC with
// nanoseconds; the other fields only when not empty), each value of o.Header as
// Sluice-H-{Name}, and o.Signature, when set, as Sluice-Delivery-Signature. It is the
// one encoder of the wire format (sluice parks and forwards with it) and checks
// nothing. ReadOrder(Encode(o)) equals o when every header name of o is canonical and
// has a value, and ReceivedAt is in UTC; on the wire, header values must also hold no
// CR, LF or NUL and no blanks at either end (NATS drops those), as sluice's do.
func Encode(o *Order) *nats.Msg {
	msg := nats.NewMsg(o.Subject)
	msg.Data = o.Body
	h := msg.Header
	o.stringFields(func(k, v string) { setIf(h, k, v) })
	h.Set(HeaderReceivedAt, o.ReceivedAt.UTC().Format(time.RFC3339Nano))
	for k, vs := range o.Header {
		if len(vs) > 0 {
			h[HeaderPrefix+k] = slices.Clone(vs)
		}
	}
	return msg
}

// stringFields calls field with the name and value of each header field Encode sets
// from a string of o, empty or not (Encode leaves the empty ones out): every field
// but the time received and o.Header's.
func (o *Order) stringFields(field func(k, v string)) {
	field(HeaderMsgID, o.Ticket)
	field(HeaderTicket, o.Ticket)
	field(HeaderQueue, o.Queue)
	field(HeaderRule, o.Rule)
	field(HeaderMethod, o.Method)
	field(HeaderPath, o.Path)
	field(HeaderQuery, o.RawQuery)
	field(HeaderClient, o.Client)
	field(HeaderIdempotencyKey, o.IdempotencyKey)
	field(HeaderFingerprint, o.Fingerprint)
	field(HeaderDeliverySignature, o.Signature)
}

func setIf(h nats.Header, k, v string) {
	if v != "" {
		h.Set(k, v)
	}
}

// HeaderSize is the size in bytes of the header block of Encode(o) as NATS counts it
// (nats.Msg.Size less the subject, reply and data), computed without encoding o: a
// field counts its name, its value without the blanks at either end (as NATS writes
// it) and 4 bytes (": " and CRLF), the block its first line and last CRLF.
func HeaderSize(o *Order) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	o.stringFields(func(k, v string) { n += FieldSize(k, v) })
	var ts [len(time.RFC3339Nano)]byte
	n += fieldSize(HeaderReceivedAt, len(o.ReceivedAt.UTC().AppendFormat(ts[:0], time.RFC3339Nano)))
	for k, vs := range o.Header {
		for _, v := range vs {
			n += HeaderValueSize(k, v)
		}
	}
	return n
}

// HeaderValueSize is what one value v of a header k of Order.Header adds to
// HeaderSize (as Sluice-H-{k}).
func HeaderValueSize(k, v string) int {
	return len(HeaderPrefix) + fieldSize(k, len(textproto.TrimString(v)))
}

// FieldSize is what a header field of name k and value v that Encode sets (a value
// not empty) adds to HeaderSize: 0 for an empty v, which it does not set.
func FieldSize(k, v string) int {
	if v == "" {
		return 0
	}
	return fieldSize(k, len(textproto.TrimString(v)))
}

func fieldSize(k string, trimmed int) int { return len(k) + trimmed + len(": \r\n") }

// validTicket reports whether s has the shape of a ticket (queue.ValidTicket).
func validTicket(s string) bool {
	if len(s) != 26 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; (c < 'a' || c > 'z') && (c < '2' || c > '7') {
			return false
		}
	}
	return true
}

// orderMAC covers every field of an order a consumer acts on: ticket, queue, rule,
// method, path, query, received-at, client, idempotency key, fingerprint, the kept
// headers and the body. The subject is not covered: a queue's orders may move to
// another subject when its downstream changes.
func orderMAC(key []byte, o *Order) []byte {
	fields := [][]byte{
		[]byte(o.Ticket), []byte(o.Queue), []byte(o.Rule), []byte(o.Method), []byte(o.Path),
		[]byte(o.RawQuery), []byte(o.ReceivedAt.UTC().Format(time.RFC3339Nano)), []byte(o.Client),
		[]byte(o.IdempotencyKey), []byte(o.Fingerprint),
	}
	fields = append(fields, headerFields(o.Header)...)
	fields = append(fields, o.Body)
	return mac(key, "sluice delivery", fields...)
}

// SignOrder returns the delivery signature of o under key (the value of
// HeaderDeliverySignature). sluice signs what it forwards with it; consumers need it
// only to build test orders.
func SignOrder(key []byte, o *Order) string { return encodeSig(orderMAC(key, o)) }

// Verifier checks the orders of one queue and signs its results, with the queue's
// delivery key. It is safe for concurrent use.
type Verifier struct {
	queue string
	key   []byte
}

// NewVerifier returns the Verifier of a queue, given its delivery key (DeliveryKey;
// `sluice queue delivery-key` prints it). Errors wrap ErrInvalidKey.
func NewVerifier(queue string, deliveryKey []byte) (*Verifier, error) {
	if !queueconfig.ValidName(queue) {
		return nil, fmt.Errorf("%w: bad queue name %q", ErrInvalidKey, queue)
	}
	if len(deliveryKey) != MinDeliveryKey {
		return nil, fmt.Errorf("%w: %d bytes, want %d", ErrInvalidKey, len(deliveryKey), MinDeliveryKey)
	}
	return &Verifier{queue: queue, key: slices.Clone(deliveryKey)}, nil
}

// Queue returns the name of the verifier's queue.
func (v *Verifier) Queue() string { return v.queue }

// Verify checks that o is an order of the verifier's queue that sluice signed, field
// for field as decoded. Errors wrap ErrForged.
func (v *Verifier) Verify(o *Order) error {
	if o.Queue != v.queue {
		return fmt.Errorf("%w: order %s of queue %q, want %q", ErrForged, o.Ticket, o.Queue, v.queue)
	}
	if !checkSig(o.Signature, orderMAC(v.key, o)) {
		return fmt.Errorf("%w: order %s: missing or wrong %s", ErrForged, o.Ticket, HeaderDeliverySignature)
	}
	return nil
}

// Result is a consumer's answer to an order, kept in the order's ticket record as its
// result (GET /sluice/v1/deferred/{ticket} shows it).
type Result struct {
	// StatusCode is an HTTP-like status, 100 to 599 (200: done as asked).
	StatusCode int
	// Header holds headers to keep with the result. sluice keeps the subset its queue's
	// result headers allow (queueconfig.DefaultResultHeaders and result_headers).
	Header http.Header
	// Body is the answer's body; Reply keeps at most MaxResultBody bytes of it.
	Body []byte
	// Truncated says Body is an excerpt (Reply sets it when it cuts the body).
	Truncated bool
}

// ResultSubject is where the result of a ticket of a queue is published:
// sluice.result.{queue}.{ticket}.
func ResultSubject(queue, ticket string) string { return ResultPrefix + queue + "." + ticket }

// ResultMsgID is the Nats-Msg-Id of a ticket's result: JetStream keeps the first
// result of a ticket published within its duplicate window and drops repeats.
func ResultMsgID(ticket string) string { return "result." + ticket }

func resultMAC(key []byte, queue, ticket string, r *Result) []byte {
	fields := [][]byte{[]byte(queue), []byte(ticket), []byte(strconv.Itoa(r.StatusCode)), []byte(strconv.FormatBool(r.Truncated))}
	fields = append(fields, headerFields(r.Header)...)
	fields = append(fields, r.Body)
	return mac(key, "sluice result", fields...)
}

// checkResult checks r against the bounds of a result.
func checkResult(r *Result) error {
	if r.StatusCode < 100 || r.StatusCode > 599 {
		return fmt.Errorf("%w: status %d, want 100 to 599", ErrInvalidResult, r.StatusCode)
	}
	if len(r.Body) > MaxResultBody {
		return fmt.Errorf("%w: body of %d bytes, at most %d", ErrInvalidResult, len(r.Body), MaxResultBody)
	}
	size, count := 0, 0
	for k, vs := range r.Header {
		if !queueconfig.ValidHeaderName(k) || k != textproto.CanonicalMIMEHeaderKey(k) {
			return fmt.Errorf("%w: header name %q (canonical names only)", ErrInvalidResult, k)
		}
		for _, v := range vs {
			if strings.ContainsAny(v, "\r\n\x00") {
				return fmt.Errorf("%w: header %s holds CR, LF or NUL", ErrInvalidResult, k)
			}
			size += len(k) + len(v)
			count++
		}
	}
	if size > MaxResultHeaderBytes || count > MaxResultHeaderValues {
		return fmt.Errorf("%w: %d header values of %d bytes, at most %d of %d", ErrInvalidResult, count, size, MaxResultHeaderValues, MaxResultHeaderBytes)
	}
	return nil
}

// ReplyMsg returns the message that carries r as the result of order o (which must be
// of the verifier's queue): on ResultSubject, with the ticket's ResultMsgID, the status,
// each header value as Sluice-Result-H-{Name}, the body, and the result signature. A
// body over MaxResultBody is cut to it and marked truncated; other results outside the
// bounds wrap ErrInvalidResult.
func (v *Verifier) ReplyMsg(o *Order, r Result) (*nats.Msg, error) {
	if o.Queue != v.queue || !validTicket(o.Ticket) {
		return nil, fmt.Errorf("%w: order %q of queue %q, verifier of %q", ErrInvalidResult, o.Ticket, o.Queue, v.queue)
	}
	if len(r.Body) > MaxResultBody {
		r.Body, r.Truncated = r.Body[:MaxResultBody], true
	}
	if err := checkResult(&r); err != nil {
		return nil, err
	}
	msg := nats.NewMsg(ResultSubject(o.Queue, o.Ticket))
	msg.Data = r.Body
	msg.Header.Set(HeaderMsgID, ResultMsgID(o.Ticket))
	msg.Header.Set(HeaderResultStatus, strconv.Itoa(r.StatusCode))
	if r.Truncated {
		msg.Header.Set(HeaderResultTruncated, "true")
	}
	for k, vs := range r.Header {
		msg.Header[HeaderResultPrefix+k] = slices.Clone(vs)
	}
	msg.Header.Set(HeaderResultSignature, encodeSig(resultMAC(v.key, o.Queue, o.Ticket, &r)))
	return msg, nil
}

// Reply publishes r as the result of order o through JetStream and waits for the
// stream's acknowledgement (sluice's result stream captures sluice.result.>). Reply
// before acknowledging the order: a consumer that dies between the two gets the order
// again and replies again, and the repeat is dropped (ResultMsgID). An error wrapping
// jetstream.ErrNoStreamResponse says no sluice dispatcher created the result stream
// yet.
func (v *Verifier) Reply(ctx context.Context, js jetstream.JetStream, o *Order, r Result) error {
	msg, err := v.ReplyMsg(o, r)
	if err != nil {
		return err
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		return fmt.Errorf("subscriber: reply to %s: %w", o.Ticket, err)
	}
	return nil
}

// ParseResultSubject splits a result subject into its queue and ticket.
func ParseResultSubject(subject string) (queue, ticket string, ok bool) {
	rest, ok := strings.CutPrefix(subject, ResultPrefix)
	if !ok {
		return "", "", false
	}
	queue, ticket, ok = strings.Cut(rest, ".")
	return queue, ticket, ok && queueconfig.ValidName(queue) && validTicket(ticket)
}

// DecodeResult reads and verifies a result published on subject with headers h and
// body data, under the delivery key of the subject's queue (keyOf returns it; sluice
// derives it with DeliveryKey). It returns the queue, the ticket and the result.
// Errors wrap ErrInvalidResult (malformed or out of bounds) or ErrForged (not signed
// with the queue's key, or signed for another ticket).
func DecodeResult(subject string, h nats.Header, data []byte, keyOf func(queue string) []byte) (queue, ticket string, r *Result, err error) {
	queue, ticket, ok := ParseResultSubject(subject)
	if !ok {
		return "", "", nil, fmt.Errorf("%w: subject %q is not %s{queue}.{ticket}", ErrInvalidResult, subject, ResultPrefix)
	}
	r = &Result{Body: data}
	st := h.Get(HeaderResultStatus)
	if r.StatusCode, err = strconv.Atoi(st); err != nil {
		return queue, ticket, nil, fmt.Errorf("%w: %s %q", ErrInvalidResult, HeaderResultStatus, st)
	}
	switch tr := h.Get(HeaderResultTruncated); tr {
	case "":
	case "true":
		r.Truncated = true
	default:
		return queue, ticket, nil, fmt.Errorf("%w: %s %q", ErrInvalidResult, HeaderResultTruncated, tr)
	}
	for k, vs := range h {
		if name, ok := strings.CutPrefix(k, HeaderResultPrefix); ok {
			if r.Header == nil {
				r.Header = make(http.Header)
			}
			r.Header[name] = slices.Clone(vs)
		}
	}
	if err := checkResult(r); err != nil {
		return queue, ticket, nil, err
	}
	if !checkSig(h.Get(HeaderResultSignature), resultMAC(keyOf(queue), queue, ticket, r)) {
		return queue, ticket, nil, fmt.Errorf("%w: result of %s: missing or wrong %s", ErrForged, ticket, HeaderResultSignature)
	}
	return queue, ticket, r, nil
}
