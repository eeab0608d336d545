package queue

import (
	"bytes"
	"errors"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/subscriber"
)

func testMessage() *Message {
	return &Message{
		Request: Request{
			Queue: "orders", Rule: "r", Method: "POST", Path: "/v1/orders", RawQuery: "a=1",
			Header:     http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-1", "r-2"}, "Idempotency-Key": {`"k"`}},
			Body:       []byte(`{"n":1}`),
			Client:     "c-hash",
			ReceivedAt: time.Date(2026, 12, 1, 9, 30, 0, 500, time.UTC), IdempotencyKey: `"k"`,
			Callback:  "https://cb.example/x",
			NotBefore: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC),
		},
		Ticket: "abcdefghijklmnopqrstuvwxyz", Fingerprint: "f00d", Lane: "p1t2",
		TraceParent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", TraceState: "a=b",
	}
}

// sameMessage compares what a parked message's encoding carries (times as instants).
func sameMessage(a, b *Message) bool {
	x, y := *a, *b
	if !x.ReceivedAt.Equal(y.ReceivedAt) || !x.NotBefore.Equal(y.NotBefore) {
		return false
	}
	x.ReceivedAt, y.ReceivedAt, x.NotBefore, y.NotBefore = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}

// A parked message's encoding (subscriber.Encode and the headers only parked
// messages carry) decodes to the same message, and its signature still verifies.
func TestParkedMessageRoundTrip(t *testing.T) {
	s := &Store{opts: options{signingKey: bytes.Repeat([]byte("k"), MinSigningKey)}}
	for _, m := range []*Message{testMessage(), {Request: Request{Queue: "q", Method: "GET", Path: "/", Header: http.Header{}}, Ticket: "bbbbbbbbbbbbbbbbbbbbbbbbbb"}} {
		s.sign(m)
		subject := ReadySubject(m.Queue, m.Lane, m.Ticket)
		msg := m.encode(subject)
		got, err := decode(msg.Subject, msg.Header, msg.Data)
		if err != nil {
			t.Fatal(err)
		}
		want := *m
		want.subject = subject
		if !sameMessage(got, &want) {
			t.Errorf("decoded\n%+v\nwant\n%+v", got, &want)
		}
		if err := s.Verify(got); err != nil {
			t.Errorf("%s: %v", m.Ticket, err)
		}
	}
}

// A message that names a ticket and a queue but is not an order's shape (a path that
// would aim a delivery at another host, no method), made from a genuine one, is read,
// so that the dispatcher dead-letters it, and Verify calls it forged; one with no
// ticket or queue is not a parked request at all.
func TestMalformedOrderIsReadAndForged(t *testing.T) {
	s := &Store{opts: options{signingKey: bytes.Repeat([]byte("k"), MinSigningKey)}}
	for name, f := range map[string]func(*Message){
		"path":      func(m *Message) { m.Path = "@evil.example/steal" },
		"no path":   func(m *Message) { m.Path = "" },
		"no method": func(m *Message) { m.Method = "" },
	} {
		m := testMessage()
		s.sign(m)
		f(m)
		msg := m.encode(ReadySubject(m.Queue, m.Lane, m.Ticket))
		got, err := decode(msg.Subject, msg.Header, msg.Data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got.Path != m.Path || got.Method != m.Method {
			t.Errorf("%s: read %q %q, want %q %q", name, got.Method, got.Path, m.Method, m.Path)
		}
		if err := s.Verify(got); !errors.Is(err, ErrForged) {
			t.Errorf("%s: Verify = %v, want ErrForged", name, err)
		}
		// Signed with the key, it is no forgery: the dispatcher refuses it as invalid.
		s.sign(got)
		if err := s.Verify(got); err != nil {
			t.Errorf("%s, signed: %v", name, err)
		}
		if err := got.order(got.subject).Check(); !errors.Is(err, subscriber.ErrNotOrder) {
			t.Errorf("%s: Check = %v", name, err)
		}
	}
	for name, f := range map[string]func(*Message){
		"ticket":     func(m *Message) { m.Ticket = "short" },
		"queue":      func(m *Message) { m.Queue = "" },
		"queue name": func(m *Message) { m.Queue = "a b" },
		"lane":       func(m *Message) { m.Lane = "x" },
	} {
		m := testMessage()
		f(m)
		msg := m.encode("sluice.q.orders.x")
		if got, err := decode(msg.Subject, msg.Header, msg.Data); err == nil {
			t.Errorf("%s: decoded %+v", name, got)
		}
	}
}

// FuzzParkedDecode: decoding any parked message never panics; an encoded message
// decodes to itself.
func FuzzParkedDecode(f *testing.F) {
	f.Add("abcdefghijklmnopqrstuvwxyz", "orders", "POST", "/x", "p1t2", "2026-12-01T10:00:00Z", "https://cb", "X-A", "1", []byte("b"))
	f.Add("", "", "", "", "", "bad", "", "", "", []byte(nil))
	f.Fuzz(func(t *testing.T, ticket, queue, method, path, lane, notBefore, callback, hk, hv string, body []byte) {
		m := testMessage()
		m.Ticket, m.Queue, m.Method, m.Path, m.Lane, m.Callback, m.Body = ticket, queue, method, path, lane, callback, body
		m.NotBefore, _ = time.Parse(time.RFC3339, notBefore)
		m.NotBefore = m.NotBefore.UTC()
		msg := m.encode("s")
		msg.Header.Add(hk, hv)
		got, err := decode(msg.Subject, msg.Header, msg.Data)
		if err != nil || hk != "" {
			return
		}
		want := *m
		want.subject = "s"
		if !sameMessage(got, &want) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, &want)
		}
	})
}

// TestHeaderSizeIsEncoded: headerSize is the header block of encode's message, byte
// for byte as NATS counts it, with every field set, with none of the optional ones,
// and with values that NATS trims (blanks at either end) or keeps empty.
func TestHeaderSizeIsEncoded(t *testing.T) {
	full := testMessage()
	full.Signature, full.FlowKey = "sig", "f-1"
	// Every string field of the message and of its request is set: a field added to
	// encode (and to the message) without headerSize fails here.
	for _, v := range []reflect.Value{reflect.ValueOf(*full), reflect.ValueOf(full.Request)} {
		for i := range v.NumField() {
			if f := v.Field(i); f.Kind() == reflect.String && f.String() == "" && v.Type().Field(i).Name != "subject" &&
				v.Type().Field(i).Name != "Tenant" && v.Type().Field(i).Name != "Flow" && v.Type().Field(i).Name != "Priority" {
				t.Fatalf("testMessage leaves %s.%s empty", v.Type().Name(), v.Type().Field(i).Name)
			}
		}
	}
	bare := &Message{Request: Request{Queue: "q", Method: "GET", Path: "/"}, Ticket: "abcdefghijklmnopqrstuvwxyz"}
	blanks := testMessage()
	blanks.Header = http.Header{"X-A": {" padded\t", "", "\t"}, "X-Empty": {}, "X-B": {"v"}}
	blanks.Rule, blanks.Client = " r ", "\tc"
	late := testMessage()
	late.ReceivedAt = time.Date(2026, 12, 1, 9, 30, 0, 0, time.FixedZone("x", 3600)) // whole seconds, not UTC
	late.NotBefore = time.Date(2026, 12, 1, 11, 0, 0, 0, time.FixedZone("y", -7200))
	for name, m := range map[string]*Message{"full": full, "bare": bare, "blanks": blanks, "late": late} {
		subject := ReadySubject(m.Queue, m.Lane, m.Ticket)
		msg := m.encode(subject)
		if got, want := m.headerSize(subject), msg.Size()-len(msg.Subject)-len(msg.Data); got != want {
			t.Errorf("%s: headerSize %d, encoded %d", name, got, want)
		}
	}
}

// TestSizingValuesHaveTheLengths: BodyLimit sizes an order with a ticket and a
// fingerprint of the lengths Park's have.
func TestSizingValuesHaveTheLengths(t *testing.T) {
	if len(sizingTicket) != len(newTicket()) || !ValidTicket(sizingTicket) {
		t.Errorf("sizingTicket %q: not a ticket's shape (%d bytes; a ticket has %d)", sizingTicket, len(sizingTicket), len(newTicket()))
	}
	if fp := Fingerprint(&testMessage().Request); len(sizingFingerprint) != len(fp) {
		t.Errorf("sizingFingerprint: %d bytes, a fingerprint %d", len(sizingFingerprint), len(fp))
	}
}

// TestKeptHeaderSize: keptHeaderSize is what the kept header adds to the encoded
// header block, with a Connection header and without, names to drop, values NATS
// trims and values never kept.
func TestKeptHeaderSize(t *testing.T) {
	for name, h := range map[string]http.Header{
		"plain":      {"Content-Type": {"application/json"}, "X-Id": {"1", "2"}, "x-lower": {" a\t"}, "X-Empty": {""}},
		"dropped":    {"Authorization": {"s"}, "Host": {"h"}, "Content-Length": {"3"}, "X-Crlf": {"a\r\nb", "ok"}, "Bad Name": {"v"}},
		"connection": {"Connection": {"x-named, keep-alive"}, "X-Named": {"n"}, "Keep-Alive": {"5"}, "X-Other": {"o"}},
		"none":       {},
	} {
		m := testMessage()
		m.Header = nil
		subject := ReadySubject(m.Queue, m.Lane, m.Ticket)
		without := m.headerSize(subject)
		m.Header = KeptHeader(h, []string{"authorization"})
		if got, want := keptHeaderSize(h, []string{"authorization"}), m.headerSize(subject)-without; got != want {
			t.Errorf("%s: keptHeaderSize %d, the kept header adds %d", name, got, want)
		}
	}
}
