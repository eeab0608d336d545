package queue

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// MinSigningKey is the shortest signing key Open accepts, in bytes.
const MinSigningKey = 32

// HeaderSignature carries a parked message's HMAC: "v1=" + base64 (standard, padded)
// of HMAC-SHA256 over the message's canonical encoding (see Store.Verify). The "v1"
// names the encoding, so that it can change without ambiguity.
const HeaderSignature = "Sluice-Signature"

const sigVersion = "v1="

// WithSigningKey sets the secret that signs and verifies parked messages, ticket records
// and idempotency records (HMAC-SHA256). Every process sharing the queues (ingress,
// dispatchers, `sluice dlq`) must use the same key; at least MinSigningKey bytes,
// required by Open.
func WithSigningKey(key []byte) Option {
	return func(o *options) { o.signingKey = append([]byte(nil), key...) }
}

// mac returns HMAC-SHA256 over a domain label and the fields, each prefixed by its
// length (8 bytes, big endian), so that no two field lists share an encoding.
func (s *Store) mac(domain string, fields ...[]byte) []byte {
	h := hmac.New(sha256.New, s.opts.signingKey)
	var n [8]byte
	for _, f := range append([][]byte{[]byte(domain)}, fields...) {
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)
}

// messageMAC covers what decides a message's delivery and identity: ticket, queue,
// rule, method, path, query, received-at, client, idempotency key, fingerprint, every
// kept header (sorted names, each with its count of values, then the values in order),
// the body and, only when they are set (so that the signatures of older orders stay
// what they were), a laned order's lane (so it cannot be moved to a better lane), the
// callback URL, a scheduled order's due time (so that nobody without the key can move
// it) and the park's trace context; the lists stay apart because the body before them
// is length-prefixed.
func (s *Store) messageMAC(m *Message) []byte {
	names := make([]string, 0, len(m.Header))
	for k := range m.Header {
		names = append(names, k)
	}
	slices.Sort(names)
	fields := [][]byte{
		[]byte(m.Ticket), []byte(m.Queue), []byte(m.Rule), []byte(m.Method), []byte(m.Path),
		[]byte(m.RawQuery), []byte(m.ReceivedAt.UTC().Format(time.RFC3339Nano)), []byte(m.Client),
		[]byte(m.IdempotencyKey), []byte(m.Fingerprint),
		binary.BigEndian.AppendUint64(nil, uint64(len(names))),
	}
	for _, k := range names {
		vs := m.Header[k]
		fields = append(fields, []byte(k), binary.BigEndian.AppendUint64(nil, uint64(len(vs))))
		for _, v := range vs {
			fields = append(fields, []byte(v))
		}
	}
	fields = append(fields, m.Body)
	if m.Lane != "" {
		// Only laned orders sign a lane: the signatures of unlaned ones (all orders
		// parked before lanes existed) stay what they were.
		fields = append(fields, []byte("lane"), []byte(m.Lane))
	}
	if m.FlowKey != "" {
		// Likewise: so that an order cannot be moved to another key's outflow.
		fields = append(fields, []byte("flow"), []byte(m.FlowKey))
	}
	// Appended only when set, so that messages parked before callbacks existed verify.
	if m.Callback != "" {
		fields = append(fields, []byte("callback"), []byte(m.Callback))
	}
	if !m.NotBefore.IsZero() {
		fields = append(fields, []byte(m.NotBefore.UTC().Format(time.RFC3339)))
	}
	// Likewise for messages parked before tracing. Covered although a forged trace
	// context would be harmless (it names only the span a delivery links to): every
	// header sluice reads back is signed, so none needs an argument of its own.
	if m.TraceParent != "" || m.TraceState != "" {
		fields = append(fields, []byte("trace"), []byte(m.TraceParent), []byte(m.TraceState))
	}
	return s.mac("sluice message", fields...)
}

// sign sets m's signature.
func (s *Store) sign(m *Message) {
	m.Signature = sigVersion + base64.StdEncoding.EncodeToString(s.messageMAC(m))
}

// Verify checks a parked message read from a queue or the dead letters: its signature
// must be this store's HMAC of the message, and the subject it was read from must be
// the one of its queue and ticket (a genuine message copied to another queue is
// forged there; a schedule subject only for a scheduled order). Errors wrap ErrForged.
// Only a verified message may be delivered. decode reads a message with any method,
// path or query, so that one without an order's shape is forged here when it is not
// signed (the dispatcher refuses a signed one that cannot be delivered as invalid).
func (s *Store) Verify(m *Message) error {
	if m.subject != "" && m.subject != ReadySubject(m.Queue, m.Lane, m.Ticket) && m.subject != deadSubjectFor(m.Queue, m.Ticket) &&
		(m.NotBefore.IsZero() || m.subject != scheduleSubjectFor(m.Queue, m.Ticket)) {
		return fmt.Errorf("%w: message of queue %q, ticket %s read from subject %q", ErrForged, m.Queue, m.Ticket, m.subject)
	}
	if !checkSig(m.Signature, s.messageMAC(m)) {
		return fmt.Errorf("%w: message %s: missing or wrong %s", ErrForged, m.Ticket, HeaderSignature)
	}
	// A scheduled order reaches its ready subject only when the server fires it, so it
	// is stored there (server time) at or after its due time: an earlier copy is a
	// genuine schedule message replayed early. A second's slack covers rounding.
	if !m.NotBefore.IsZero() && !m.StoredAt.IsZero() && m.subject == ReadySubject(m.Queue, m.Lane, m.Ticket) &&
		m.StoredAt.Add(time.Second).Before(m.NotBefore) {
		return fmt.Errorf("%w: message %s: on its ready subject at %s, before its due time %s", ErrForged, m.Ticket,
			m.StoredAt.UTC().Format(time.RFC3339), m.NotBefore.UTC().Format(time.RFC3339))
	}
	return nil
}

func checkSig(sig string, want []byte) bool {
	enc, ok := strings.CutPrefix(sig, sigVersion)
	if !ok {
		return false
	}
	got, err := base64.StdEncoding.DecodeString(enc)
	return err == nil && hmac.Equal(got, want)
}

// sealed is the stored form of a record in a key-value bucket: the record's JSON and
// its signature over the kind of record, the bucket key and those exact bytes (so a
// genuine record copied to another key does not verify).
type sealed struct {
	Sig    string          `json:"sig"`
	Record json.RawMessage `json:"record"`
}

// seal returns the signed value of a record of the given kind stored under key.
func (s *Store) seal(kind, key string, v any) ([]byte, error) {
	rec, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	sig := sigVersion + base64.StdEncoding.EncodeToString(s.mac("sluice "+kind, []byte(key), rec))
	return json.Marshal(sealed{Sig: sig, Record: rec})
}

// unseal verifies a value written by seal and decodes its record into v. A value
// without a valid signature (forged, written with another key, or not sealed) wraps
// ErrForged.
func (s *Store) unseal(kind, key string, val []byte, v any) error {
	var env sealed
	if err := json.Unmarshal(val, &env); err != nil || len(env.Record) == 0 ||
		!checkSig(env.Sig, s.mac("sluice "+kind, []byte(key), env.Record)) {
		return fmt.Errorf("%w: %s record %s: missing or wrong signature", ErrForged, kind, key)
	}
	if err := json.Unmarshal(env.Record, v); err != nil {
		return fmt.Errorf("queue: corrupt %s record %s: %w", kind, key, err)
	}
	return nil
}

func checkKey(key []byte) error {
	if len(key) < MinSigningKey {
		return fmt.Errorf("%w: signing key of %d bytes (WithSigningKey), want at least %d", ErrInvalidConfig, len(key), MinSigningKey)
	}
	return nil
}
