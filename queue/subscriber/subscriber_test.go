package subscriber_test

import (
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/limiter/linktest"
	"github.com/sluicehq/sluice/queue/subscriber"
)

var signingKey = bytes.Repeat([]byte("k"), 32)

func testOrder() *subscriber.Order {
	return &subscriber.Order{
		Ticket: "abcdefghijklmnopqrstuvwxyz", Queue: "pay", Method: "POST", Path: "/v1/pay",
		Header:     http.Header{"Content-Type": {"application/json"}},
		Body:       []byte(`{"amount":5}`),
		ReceivedAt: time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC),
	}
}

func mustVerifier(t *testing.T, queue string, key []byte) *subscriber.Verifier {
	t.Helper()
	v, err := subscriber.NewVerifier(queue, key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

func TestDeliveryKeysDifferPerQueue(t *testing.T) {
	a, b := subscriber.DeliveryKey(signingKey, "a"), subscriber.DeliveryKey(signingKey, "b")
	if len(a) != subscriber.MinDeliveryKey || bytes.Equal(a, b) || bytes.Equal(a, subscriber.DeliveryKey(bytes.Repeat([]byte("j"), 32), "a")) {
		t.Errorf("keys %x %x", a, b)
	}
	if !bytes.Equal(a, subscriber.DeliveryKey(signingKey, "a")) {
		t.Error("not deterministic")
	}
	for _, c := range []struct {
		queue string
		key   []byte
	}{{"", a}, {"a.b", a}, {"a", a[:16]}, {"a", nil}} {
		if _, err := subscriber.NewVerifier(c.queue, c.key); !errors.Is(err, subscriber.ErrInvalidKey) {
			t.Errorf("NewVerifier(%q, %d bytes) = %v", c.queue, len(c.key), err)
		}
	}
}

func TestDecodeRefusesWhatIsNoOrder(t *testing.T) {
	good := func() *nats.Msg {
		m := nats.NewMsg("orders.paid")
		m.Header.Set(subscriber.HeaderTicket, "abcdefghijklmnopqrstuvwxyz")
		m.Header.Set(subscriber.HeaderQueue, "pay")
		m.Header.Set(subscriber.HeaderMethod, "POST")
		m.Header.Set(subscriber.HeaderPath, "/x")
		return m
	}
	if _, err := subscriber.Decode(good()); err != nil {
		t.Fatal(err)
	}
	for name, f := range map[string]func(*nats.Msg){
		"no ticket":       func(m *nats.Msg) { m.Header.Del(subscriber.HeaderTicket) },
		"bad ticket":      func(m *nats.Msg) { m.Header.Set(subscriber.HeaderTicket, "ABCDEFGHIJKLMNOPQRSTUVWXYZ") },
		"bad queue":       func(m *nats.Msg) { m.Header.Set(subscriber.HeaderQueue, "a.b") },
		"no method":       func(m *nats.Msg) { m.Header.Del(subscriber.HeaderMethod) },
		"relative path":   func(m *nats.Msg) { m.Header.Set(subscriber.HeaderPath, "x") },
		"bad received at": func(m *nats.Msg) { m.Header.Set(subscriber.HeaderReceivedAt, "yesterday") },
		"no headers":      func(m *nats.Msg) { m.Header = nil },
	} {
		m := good()
		f(m)
		if _, err := subscriber.Decode(m); !errors.Is(err, subscriber.ErrNotOrder) {
			t.Errorf("%s: %v", name, err)
		}
	}
	if _, err := subscriber.Decode(nil); !errors.Is(err, subscriber.ErrNotOrder) {
		t.Errorf("nil: %v", err)
	}
}

// A result signed with a queue's key decodes as sent; anything changed, or signed with
// another queue's key, does not.
func TestReplyRoundTripAndForgeries(t *testing.T) {
	keyOf := func(q string) []byte { return subscriber.DeliveryKey(signingKey, q) }
	v := mustVerifier(t, "pay", keyOf("pay"))
	o := testOrder()
	res := subscriber.Result{StatusCode: 201, Header: http.Header{"Content-Type": {"text/plain"}, "X-Receipt": {"r-9"}}, Body: []byte("paid")}
	msg, err := v.ReplyMsg(o, res)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Subject != "sluice.result.pay."+o.Ticket || msg.Header.Get(subscriber.HeaderMsgID) != "result."+o.Ticket {
		t.Fatalf("subject %q, headers %v", msg.Subject, msg.Header)
	}
	q, tk, got, err := subscriber.DecodeResult(msg.Subject, msg.Header, msg.Data, keyOf)
	if err != nil {
		t.Fatal(err)
	}
	if q != "pay" || tk != o.Ticket || got.StatusCode != 201 || string(got.Body) != "paid" || got.Truncated ||
		got.Header.Get("X-Receipt") != "r-9" || got.Header.Get("Content-Type") != "text/plain" {
		t.Errorf("decoded %s %s %+v", q, tk, got)
	}

	clone := func() (string, nats.Header, []byte) {
		h := nats.Header{}
		for k, vs := range msg.Header {
			h[k] = append([]string(nil), vs...)
		}
		return msg.Subject, h, append([]byte(nil), msg.Data...)
	}
	for name, f := range map[string]func(subj *string, h nats.Header, body *[]byte){
		"status":        func(_ *string, h nats.Header, _ *[]byte) { h.Set(subscriber.HeaderResultStatus, "200") },
		"body":          func(_ *string, _ nats.Header, b *[]byte) { *b = []byte("refunded") },
		"header":        func(_ *string, h nats.Header, _ *[]byte) { h.Set(subscriber.HeaderResultPrefix+"X-Receipt", "r-1") },
		"added header":  func(_ *string, h nats.Header, _ *[]byte) { h.Set(subscriber.HeaderResultPrefix+"Location", "/x") },
		"truncated":     func(_ *string, h nats.Header, _ *[]byte) { h.Set(subscriber.HeaderResultTruncated, "true") },
		"other ticket":  func(s *string, _ nats.Header, _ *[]byte) { *s = "sluice.result.pay.bbbbbbbbbbbbbbbbbbbbbbbbbb" },
		"other queue":   func(s *string, _ nats.Header, _ *[]byte) { *s = "sluice.result.ship." + o.Ticket },
		"no signature":  func(_ *string, h nats.Header, _ *[]byte) { h.Del(subscriber.HeaderResultSignature) },
		"old signature": func(_ *string, h nats.Header, _ *[]byte) { h.Set(subscriber.HeaderResultSignature, "v0=x") },
	} {
		subj, h, body := clone()
		f(&subj, h, &body)
		if _, _, _, err := subscriber.DecodeResult(subj, h, body, keyOf); !errors.Is(err, subscriber.ErrForged) {
			t.Errorf("%s: %v, want ErrForged", name, err)
		}
	}
	// The consumer of queue "ship" signs a result of "pay": its key is not pay's.
	ship := mustVerifier(t, "ship", keyOf("ship"))
	shipOrder := testOrder()
	shipOrder.Queue = "ship"
	forged, err := ship.ReplyMsg(shipOrder, res)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := subscriber.DecodeResult("sluice.result.pay."+o.Ticket, forged.Header, forged.Data, keyOf); !errors.Is(err, subscriber.ErrForged) {
		t.Errorf("ship's result as pay's: %v", err)
	}
	// And a verifier never signs for another queue's order.
	if _, err := ship.ReplyMsg(o, res); !errors.Is(err, subscriber.ErrInvalidResult) {
		t.Errorf("ship's verifier replying to pay's order: %v", err)
	}
}

func TestReplyBounds(t *testing.T) {
	keyOf := func(q string) []byte { return subscriber.DeliveryKey(signingKey, q) }
	v := mustVerifier(t, "pay", keyOf("pay"))
	o := testOrder()
	long := bytes.Repeat([]byte("x"), subscriber.MaxResultBody+10)
	msg, err := v.ReplyMsg(o, subscriber.Result{StatusCode: 200, Body: long})
	if err != nil {
		t.Fatal(err)
	}
	_, _, got, err := subscriber.DecodeResult(msg.Subject, msg.Header, msg.Data, keyOf)
	if err != nil || len(got.Body) != subscriber.MaxResultBody || !got.Truncated {
		t.Fatalf("long body: %d bytes, truncated %v, %v", len(got.Body), got.Truncated, err)
	}
	many := http.Header{}
	for i := range subscriber.MaxResultHeaderValues + 1 {
		many.Add("X-N", strings.Repeat("v", i))
	}
	for name, r := range map[string]subscriber.Result{
		"status 0":      {StatusCode: 0},
		"status 600":    {StatusCode: 600},
		"too many":      {StatusCode: 200, Header: many},
		"too big":       {StatusCode: 200, Header: http.Header{"X-Big": {strings.Repeat("v", subscriber.MaxResultHeaderBytes)}}},
		"CRLF":          {StatusCode: 200, Header: http.Header{"X-A": {"a\r\nSet-Cookie: x"}}},
		"non-canonical": {StatusCode: 200, Header: http.Header{"x-a": {"1"}}},
		"bad name":      {StatusCode: 200, Header: http.Header{"X A": {"1"}}},
	} {
		if _, err := v.ReplyMsg(o, r); !errors.Is(err, subscriber.ErrInvalidResult) {
			t.Errorf("%s: %v", name, err)
		}
	}
	// sluice refuses an oversize body it is sent, signed or not.
	h := nats.Header{}
	h.Set(subscriber.HeaderResultStatus, "200")
	if _, _, _, err := subscriber.DecodeResult("sluice.result.pay."+o.Ticket, h, long, keyOf); !errors.Is(err, subscriber.ErrInvalidResult) {
		t.Errorf("oversize body: %v", err)
	}
	for _, subj := range []string{"sluice.result.pay", "sluice.result.pay.x", "sluice.result.a.b." + o.Ticket, "other.pay." + o.Ticket} {
		if _, _, _, err := subscriber.DecodeResult(subj, h, nil, keyOf); !errors.Is(err, subscriber.ErrInvalidResult) {
			t.Errorf("subject %q: %v", subj, err)
		}
	}
}

// TestLightDependencies: a consumer links the NATS client, not the server, nor
// Prometheus, nor sluice's queue internals.
func TestLightDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	linktest.CheckDeps(t, "github.com/sluicehq/sluice/queue/subscriber",
		[]string{"github.com/nats-io/nats-server/", "github.com/prometheus/", "github.com/sluicehq/sluice/queue\n", "github.com/redis/"},
		[]string{"github.com/nats-io/nats.go/jetstream\n"})
}

func FuzzDecode(f *testing.F) {
	f.Add("abcdefghijklmnopqrstuvwxyz", "pay", "POST", "/x", "2026-11-30T10:00:00Z", "Sluice-H-X-A", "1", []byte("body"))
	f.Add("", "", "", "", "", "", "", []byte(nil))
	f.Add("abcdefghijklmnopqrstuvwxyz", "pay", "GET", "/", "bad", "sluice-h-x", "\r\n", []byte{0})
	key := subscriber.DeliveryKey(signingKey, "pay")
	v, err := subscriber.NewVerifier("pay", key)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, ticket, queue, method, path, at, hk, hv string, body []byte) {
		m := nats.NewMsg("s")
		m.Header.Set(subscriber.HeaderTicket, ticket)
		m.Header.Set(subscriber.HeaderQueue, queue)
		m.Header.Set(subscriber.HeaderMethod, method)
		m.Header.Set(subscriber.HeaderPath, path)
		m.Header.Set(subscriber.HeaderReceivedAt, at)
		m.Header.Add(hk, hv)
		m.Data = body
		o, err := subscriber.Decode(m)
		if err != nil {
			if !errors.Is(err, subscriber.ErrNotOrder) {
				t.Fatalf("error %v does not wrap ErrNotOrder", err)
			}
			return
		}
		if err := v.Verify(o); !errors.Is(err, subscriber.ErrForged) {
			t.Fatalf("unsigned order verified: %v", err)
		}
		// Signed with its queue's key, it verifies.
		o.Signature = subscriber.SignOrder(key, o)
		if o.Queue == "pay" {
			if err := v.Verify(o); err != nil {
				t.Fatal(err)
			}
		}
	})
}

func FuzzDecodeResult(f *testing.F) {
	f.Add("sluice.result.pay.abcdefghijklmnopqrstuvwxyz", "200", "", "Sluice-Result-H-X-A", "1", "v1=AAAA", []byte("ok"))
	f.Add("sluice.result.", "x", "false", "", "", "", []byte(nil))
	keyOf := func(q string) []byte { return subscriber.DeliveryKey(signingKey, q) }
	f.Fuzz(func(t *testing.T, subject, status, truncated, hk, hv, sig string, body []byte) {
		h := nats.Header{}
		h.Set(subscriber.HeaderResultStatus, status)
		if truncated != "" {
			h.Set(subscriber.HeaderResultTruncated, truncated)
		}
		h.Add(hk, hv)
		h.Set(subscriber.HeaderResultSignature, sig)
		_, _, r, err := subscriber.DecodeResult(subject, h, body, keyOf)
		if err == nil {
			t.Fatalf("a fuzzed result verified: %+v", r)
		}
		if !errors.Is(err, subscriber.ErrForged) && !errors.Is(err, subscriber.ErrInvalidResult) {
			t.Fatalf("error %v wraps neither ErrForged nor ErrInvalidResult", err)
		}
	})
}

// BenchmarkDecodeVerify measures what a consumer (and Forward, which decodes and signs
// each order) spends per order of 1 KiB with a few headers.
func BenchmarkDecodeVerify(b *testing.B) {
	key := subscriber.DeliveryKey(signingKey, "pay")
	v, err := subscriber.NewVerifier("pay", key)
	if err != nil {
		b.Fatal(err)
	}
	o := testOrder()
	o.Body = bytes.Repeat([]byte("x"), 1<<10)
	msg := nats.NewMsg("orders.paid")
	msg.Header.Set(subscriber.HeaderTicket, o.Ticket)
	msg.Header.Set(subscriber.HeaderQueue, o.Queue)
	msg.Header.Set(subscriber.HeaderMethod, o.Method)
	msg.Header.Set(subscriber.HeaderPath, o.Path)
	msg.Header.Set(subscriber.HeaderReceivedAt, o.ReceivedAt.Format(time.RFC3339Nano))
	msg.Header.Set(subscriber.HeaderPrefix+"Content-Type", "application/json")
	msg.Data = o.Body
	first, err := subscriber.Decode(msg)
	if err != nil {
		b.Fatal(err)
	}
	msg.Header.Set(subscriber.HeaderDeliverySignature, subscriber.SignOrder(key, first))
	b.ReportAllocs()
	for b.Loop() {
		o, err := subscriber.Decode(msg)
		if err != nil {
			b.Fatal(err)
		}
		if err := v.Verify(o); err != nil {
			b.Fatal(err)
		}
	}
}

// TestHeaderSize: HeaderSize is the header block of Encode's message as NATS counts
// it, for orders with every field, with the fewest, and with values NATS trims.
func TestHeaderSize(t *testing.T) {
	at := time.Date(2026, 12, 1, 9, 30, 0, 1500, time.UTC)
	for _, tc := range []struct {
		name string
		o    subscriber.Order
	}{
		{"every field", subscriber.Order{Ticket: "abcdefghijklmnopqrstuvwxyz", Queue: "pay", Rule: "r", Method: "POST",
			Path: "/v1/pay", RawQuery: "a=1&b=2", Client: "c", IdempotencyKey: "k-1", Fingerprint: "f00d", Signature: "sig",
			Header: http.Header{"Content-Type": {"application/json"}, "X-Id": {"1", "2"}}, Body: []byte("{}"), ReceivedAt: at,
			Subject: "sluice.q.pay.abcdefghijklmnopqrstuvwxyz"}},
		{"fewest", subscriber.Order{Ticket: "abcdefghijklmnopqrstuvwxyz", Queue: "pay", Method: "GET", Path: "/", Subject: "s"}},
		{"trimmed and empty values", subscriber.Order{Ticket: "abcdefghijklmnopqrstuvwxyz", Queue: "pay", Method: "GET", Path: "/",
			Rule: " r\t", Header: http.Header{"X-A": {" a ", "", "\t"}, "X-None": {}}, ReceivedAt: at.In(time.FixedZone("z", 3600)),
			Subject: "s"}},
	} {
		msg := subscriber.Encode(&tc.o)
		if got, want := subscriber.HeaderSize(&tc.o), msg.Size()-len(msg.Subject)-len(msg.Data); got != want {
			t.Errorf("%s: HeaderSize %d, encoded %d", tc.name, got, want)
		}
	}
}
