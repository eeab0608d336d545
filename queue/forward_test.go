package queue_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/subscriber"
)

// A forwarded order carries a delivery signature a consumer checks with its queue's
// delivery key; any change to what it decodes, and any other queue's key, fails.
func TestForwardSignsForSubscribers(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	out, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: "PAID", Subjects: []string{"orders.paid"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("pay")
	cfg.Downstream = "nats:orders.paid"
	s := openStore(t, srv, cfg)
	m := &queue.Message{
		Request: queue.Request{
			Queue: "pay", Rule: "r", Method: "POST", Path: "/v1/pay", RawQuery: "a=1",
			Header:     http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-1", "r-2"}},
			Body:       []byte(`{"amount":5}`),
			Client:     "c-hash",
			ReceivedAt: time.Date(2026, 11, 30, 10, 0, 0, 123000, time.UTC),
			// Never forwarded, so never covered.
			Callback: "https://cb.example/x",
		},
		Ticket:      "aaaaaaaaaaaaaaaaaaaaaaaaaa",
		Fingerprint: "f00d",
		Signature:   "v1=internal",
	}
	m.IdempotencyKey = "k-1"
	seq, err := s.Forward(ctxT(t), "orders.paid", m)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := out.GetMsg(ctxT(t), seq)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get(queue.HeaderSignature) != "" || raw.Header.Get(queue.HeaderCallback) != "" {
		t.Errorf("internal headers forwarded: %v", raw.Header)
	}
	if raw.Header.Get(queue.HeaderMsgID) != m.Ticket {
		t.Errorf("Nats-Msg-Id %q", raw.Header.Get(queue.HeaderMsgID))
	}
	v, err := subscriber.NewVerifier("pay", s.DeliveryKey("pay"))
	if err != nil {
		t.Fatal(err)
	}
	msgOf := func() *nats.Msg {
		h := nats.Header{}
		for k, vs := range raw.Header {
			h[k] = append([]string(nil), vs...)
		}
		return &nats.Msg{Subject: raw.Subject, Header: h, Data: append([]byte(nil), raw.Data...)}
	}
	o, err := subscriber.Decode(msgOf())
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(o); err != nil {
		t.Fatalf("genuine order: %v", err)
	}
	if o.Ticket != m.Ticket || o.Queue != "pay" || o.Rule != "r" || o.Method != "POST" || o.Path != "/v1/pay" ||
		o.RawQuery != "a=1" || string(o.Body) != `{"amount":5}` || !o.ReceivedAt.Equal(m.ReceivedAt) ||
		o.Client != "c-hash" || o.IdempotencyKey != "k-1" || o.Fingerprint != "f00d" || o.Subject != "orders.paid" ||
		len(o.Header["X-Request-Id"]) != 2 || o.Header.Get("Content-Type") != "application/json" {
		t.Errorf("decoded %+v", o)
	}

	tamper := map[string]func(*nats.Msg){
		"body":              func(m *nats.Msg) { m.Data = []byte(`{"amount":5000}`) },
		"path":              func(m *nats.Msg) { m.Header.Set(subscriber.HeaderPath, "/v1/refund") },
		"query":             func(m *nats.Msg) { m.Header.Set(subscriber.HeaderQuery, "a=2") },
		"method":            func(m *nats.Msg) { m.Header.Set(subscriber.HeaderMethod, "DELETE") },
		"ticket":            func(m *nats.Msg) { m.Header.Set(subscriber.HeaderTicket, "bbbbbbbbbbbbbbbbbbbbbbbbbb") },
		"received at":       func(m *nats.Msg) { m.Header.Set(subscriber.HeaderReceivedAt, "2026-11-30T10:00:01Z") },
		"idempotency key":   func(m *nats.Msg) { m.Header.Set(subscriber.HeaderIdempotencyKey, "k-2") },
		"kept header":       func(m *nats.Msg) { m.Header.Set(subscriber.HeaderPrefix+"Content-Type", "text/plain") },
		"added header":      func(m *nats.Msg) { m.Header.Set(subscriber.HeaderPrefix+"X-Admin", "1") },
		"added value":       func(m *nats.Msg) { m.Header.Add(subscriber.HeaderPrefix+"X-Request-Id", "r-3") },
		"header case":       func(m *nats.Msg) { m.Header.Set(subscriber.HeaderPrefix+"x-request-id", "r-0") },
		"no signature":      func(m *nats.Msg) { m.Header.Del(subscriber.HeaderDeliverySignature) },
		"signature garbage": func(m *nats.Msg) { m.Header.Set(subscriber.HeaderDeliverySignature, "v1=AAAA") },
	}
	for name, f := range tamper {
		msg := msgOf()
		f(msg)
		o, err := subscriber.Decode(msg)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := v.Verify(o); !errors.Is(err, subscriber.ErrForged) {
			t.Errorf("%s: Verify = %v, want ErrForged", name, err)
		}
	}
	// Another queue's key, or the queue name changed to match it, or a key from
	// another signing key: forged.
	other, _ := subscriber.NewVerifier("other", s.DeliveryKey("other"))
	if err := other.Verify(o); !errors.Is(err, subscriber.ErrForged) {
		t.Errorf("other queue's verifier: %v", err)
	}
	moved := *o
	moved.Queue = "other"
	if err := other.Verify(&moved); !errors.Is(err, subscriber.ErrForged) {
		t.Errorf("order relabelled to another queue: %v", err)
	}
	wrongKey := append([]byte(nil), natstest.SigningKey()...)
	wrongKey[0] ^= 1
	stranger, _ := subscriber.NewVerifier("pay", subscriber.DeliveryKey(wrongKey, "pay"))
	if err := stranger.Verify(o); !errors.Is(err, subscriber.ErrForged) {
		t.Errorf("another signing key's delivery key: %v", err)
	}
}

// The client's Idempotency-Key travels twice in a parked order and in a forwarded
// one, both covered by the signatures: as Sluice-Idempotency-Key (what sluice dedupes
// by) and, as sent, as the kept header Sluice-H-Idempotency-Key (what a proxied
// request of the order carries, and what HTTP deliveries send). The documentation
// says so (queue's NATS downstreams, subscriber's Delivery).
func TestIdempotencyKeyIsKeptAsSent(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	out, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: "PAID", Subjects: []string{"orders.paid"}})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("pay")
	cfg.Downstream = "nats:orders.paid"
	s := openStore(t, srv, cfg)
	req := order("pay", `{"n":1}`)
	req.IdempotencyKey = `"k"`
	rc, err := s.Park(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := s.Queue("pay")
	raw, err := q.Stream().GetLastMsgForSubject(ctxT(t), "sluice.q.pay."+rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get(queue.HeaderIdempotencyKey) != `"k"` || raw.Header.Get(queue.HeaderPrefix+"Idempotency-Key") != `"k"` {
		t.Fatalf("parked headers %v", raw.Header)
	}
	cons, err := q.Stream().CreateOrUpdateConsumer(ctxT(t), jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	jm, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	m, err := queue.Decode(jm)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(m); err != nil {
		t.Fatal(err)
	}
	seq, err := s.Forward(ctxT(t), "orders.paid", m)
	if err != nil {
		t.Fatal(err)
	}
	fwd, err := out.GetMsg(ctxT(t), seq)
	if err != nil {
		t.Fatal(err)
	}
	o, err := subscriber.Decode(&nats.Msg{Subject: fwd.Subject, Header: fwd.Header, Data: fwd.Data})
	if err != nil {
		t.Fatal(err)
	}
	v, _ := subscriber.NewVerifier("pay", s.DeliveryKey("pay"))
	if err := v.Verify(o); err != nil || o.IdempotencyKey != `"k"` || o.Header.Get("Idempotency-Key") != `"k"` {
		t.Errorf("forwarded order: key %q, kept header %q, %v", o.IdempotencyKey, o.Header.Get("Idempotency-Key"), err)
	}
}
