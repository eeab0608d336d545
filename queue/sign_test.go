package queue_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

func TestOpenWantsASigningKey(t *testing.T) {
	srv := natstest.Start(t)
	for _, key := range [][]byte{nil, bytes.Repeat([]byte{1}, queue.MinSigningKey-1)} {
		if _, err := queue.Open(ctxT(t), srv.Conn, queue.WithSigningKey(key)); !errors.Is(err, queue.ErrInvalidConfig) {
			t.Errorf("key of %d bytes: %v", len(key), err)
		}
	}
	if _, err := queue.Open(ctxT(t), srv.Conn); !errors.Is(err, queue.ErrInvalidConfig) {
		t.Errorf("no key: %v", err)
	}
}

// next fetches the next message of the test consumer and decodes it.
func next(t *testing.T, cons jetstream.Consumer) *queue.Message {
	t.Helper()
	jm, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := jm.Ack(); err != nil {
		t.Fatal(err)
	}
	m, err := queue.Decode(jm)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// copyMsg returns a plain NATS message with the subject, headers and data of a stored
// one, without its Nats-Msg-Id (a republish is not dropped as a duplicate) and the
// expected stream of the original publish.
func copyMsg(raw *jetstream.RawStreamMsg) *nats.Msg {
	msg := nats.NewMsg(raw.Subject)
	for k, vs := range raw.Header {
		msg.Header[k] = append([]string(nil), vs...)
	}
	msg.Header.Del(queue.HeaderMsgID)
	msg.Header.Del(jetstream.ExpectedStreamHeader)
	msg.Data = bytes.Clone(raw.Data)
	return msg
}

// Whoever can publish on sluice.q.> but does not hold the key cannot make a message
// that verifies: not from scratch, not by changing one byte of a genuine one, not by
// moving a genuine one to another queue or ticket.
func TestVerifyRefusesForgedMessages(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"), testConfig("other"))
	ctx := ctxT(t)
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, order("orders", `{"sku":1}`))
	if err != nil {
		t.Fatal(err)
	}
	// Read before the consumer acknowledges it: the work-queue stream then removes it.
	raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.orders."+rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	genuine := next(t, cons)
	if err := s.Verify(genuine); err != nil {
		t.Fatalf("genuine message: %v", err)
	}
	if len(genuine.Signature) < 10 || genuine.Signature[:3] != "v1=" {
		t.Fatalf("signature %q", genuine.Signature)
	}
	other := queue.NewTicket()
	otherKey, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(bytes.Repeat([]byte("k"), 32)))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name   string
		tamper func(m *nats.Msg)
	}{
		{"unchanged", func(*nats.Msg) {}},
		{"no signature", func(m *nats.Msg) { m.Header.Del(queue.HeaderSignature) }},
		{"garbage signature", func(m *nats.Msg) { m.Header.Set(queue.HeaderSignature, "v1=AAAA") }},
		{"unknown version", func(m *nats.Msg) {
			m.Header.Set(queue.HeaderSignature, "v2="+m.Header.Get(queue.HeaderSignature)[3:])
		}},
		{"body byte", func(m *nats.Msg) { m.Data[2]++ }},
		{"body appended", func(m *nats.Msg) { m.Data = append(m.Data, ' ') }},
		{"header value", func(m *nats.Msg) { m.Header.Set(queue.HeaderPrefix+"Content-Type", "text/plain") }},
		{"header added", func(m *nats.Msg) { m.Header.Set(queue.HeaderPrefix+"X-Admin", "1") }},
		{"header removed", func(m *nats.Msg) { m.Header.Del(queue.HeaderPrefix + "X-Request-Id") }},
		{"header value added", func(m *nats.Msg) { m.Header.Add(queue.HeaderPrefix+"X-Request-Id", "r-2") }},
		{"path", func(m *nats.Msg) { m.Header.Set(queue.HeaderPath, "/v1/orderz") }},
		{"path to another host", func(m *nats.Msg) { m.Header.Set(queue.HeaderPath, "@evil.example/x") }},
		{"query", func(m *nats.Msg) { m.Header.Set(queue.HeaderQuery, "dry=1") }},
		{"method", func(m *nats.Msg) { m.Header.Set(queue.HeaderMethod, "DELETE") }},
		{"client", func(m *nats.Msg) { m.Header.Set(queue.HeaderClient, "someone-else") }},
		{"idempotency key", func(m *nats.Msg) { m.Header.Set(queue.HeaderIdempotencyKey, `"k2"`) }},
		{"received at", func(m *nats.Msg) {
			m.Header.Set(queue.HeaderReceivedAt, time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano))
		}},
		{"rule", func(m *nats.Msg) { m.Header.Set(queue.HeaderRule, "other-rule") }},
		{"trace context added", func(m *nats.Msg) {
			m.Header.Set(queue.HeaderTraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		}},
		{"ticket", func(m *nats.Msg) {
			m.Header.Set(queue.HeaderTicket, other)
			m.Subject = "sluice.q.orders." + other
		}},
		{"moved to another ticket's subject", func(m *nats.Msg) { m.Subject = "sluice.q.orders." + other }},
		{"moved to another queue", func(m *nats.Msg) { m.Subject = "sluice.q.other." + rc.Ticket }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			msg := copyMsg(raw)
			c.tamper(msg)
			if _, err := s.JetStream().PublishMsg(ctx, msg); err != nil {
				t.Fatal(err)
			}
			var m *queue.Message
			if msg.Subject == "sluice.q.other."+rc.Ticket {
				oq, _ := s.Queue("other")
				oc, err := oq.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
				if err != nil {
					t.Fatal(err)
				}
				m = next(t, oc)
			} else {
				m = next(t, cons)
			}
			err := s.Verify(m)
			if c.name == "unchanged" {
				if err != nil {
					t.Fatalf("a genuine copy: %v", err)
				}
				return
			}
			if !errors.Is(err, queue.ErrForged) {
				t.Fatalf("Verify = %v, want ErrForged", err)
			}
		})
	}

	// Signed with another key: forged here.
	if _, err := otherKey.Declare(ctx, testConfig("orders")); err != nil {
		t.Fatal(err)
	}
	if _, err := otherKey.Park(ctx, order("orders", `{"sku":2}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(next(t, cons)); !errors.Is(err, queue.ErrForged) {
		t.Fatalf("message signed with another key: %v", err)
	}
}

// A dead letter keeps its signature: a genuine order re-queued with `sluice dlq
// requeue` verifies again; a forged one stays forged.
func TestRequeueKeepsSignature(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, order("orders", "genuine"))
	if err != nil {
		t.Fatal(err)
	}
	genuine := next(t, cons)
	forged := nats.NewMsg("sluice.q.orders." + queue.NewTicket())
	forged.Header = genuine.Headers() // a plausible message, signature stripped
	forged.Header.Set(queue.HeaderTicket, forged.Subject[len("sluice.q.orders."):])
	forged.Data = []byte("forged")
	if _, err := s.JetStream().PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	bad := next(t, cons)
	if err := s.Verify(bad); !errors.Is(err, queue.ErrForged) {
		t.Fatalf("forged: %v", err)
	}
	for _, m := range []*queue.Message{genuine, bad} {
		reason := "downstream answered 500"
		if m == bad {
			reason = "forged: no valid signature"
		}
		if err := s.DeadLetter(ctx, m, 0, reason); err != nil {
			t.Fatal(err)
		}
	}
	dls, err := s.DeadLetters(ctx, "orders", 0)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %v %v", dls, err)
	}
	if err := s.Verify(dls[0].Message); err != nil {
		t.Errorf("genuine dead letter: %v", err)
	}
	if err := s.Verify(dls[1].Message); !errors.Is(err, queue.ErrForged) || dls[1].Reason != "forged: no valid signature" {
		t.Errorf("forged dead letter: %v %q", err, dls[1].Reason)
	}
	if n, err := s.Requeue(ctx, "orders"); err != nil || n != 2 {
		t.Fatalf("requeue %d %v", n, err)
	}
	for range 2 {
		m := next(t, cons)
		err := s.Verify(m)
		switch m.Ticket {
		case rc.Ticket:
			if err != nil || string(m.Body) != "genuine" {
				t.Errorf("requeued genuine order: %v", err)
			}
		default:
			if !errors.Is(err, queue.ErrForged) {
				t.Errorf("requeued forged order: %v", err)
			}
		}
	}
}

// Ticket records are written only by sluice: one written by anybody else (or copied
// from another ticket, or signed with another key) is not found, and Status falls back
// to what the queue says.
func TestForgedTicketRecordIsIgnored(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	rc, err := s.Park(ctx, order("orders", "real"))
	if err != nil {
		t.Fatal(err)
	}
	otherTicket := queue.NewTicket()
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: otherTicket, Queue: "orders", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 201, Body: []byte("other")}}); err != nil {
		t.Fatal(err)
	}
	kv, err := s.JetStream().KeyValue(ctx, queue.TicketsBucket)
	if err != nil {
		t.Fatal(err)
	}
	copied, err := kv.Get(ctx, otherTicket)
	if err != nil {
		t.Fatal(err)
	}
	plain, _ := json.Marshal(queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 200, Body: []byte("forged")}})
	var env map[string]json.RawMessage
	if err := json.Unmarshal(copied.Value(), &env); err != nil {
		t.Fatal(err)
	}
	env["record"] = plain // a genuine signature over another record
	swapped, _ := json.Marshal(env)
	otherKey, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(bytes.Repeat([]byte("k"), 32)))
	if err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name  string
		write func() error
	}{
		{"plain JSON", func() error { _, err := kv.Put(ctx, rc.Ticket, plain); return err }},
		{"genuine record of another ticket", func() error { _, err := kv.Put(ctx, rc.Ticket, copied.Value()); return err }},
		{"genuine signature, other record", func() error { _, err := kv.Put(ctx, rc.Ticket, swapped); return err }},
		{"another key", func() error {
			return otherKey.SaveRecord(ctx, &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone})
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := c.write(); err != nil {
				t.Fatal(err)
			}
			if rec, err := s.Record(ctx, rc.Ticket); !errors.Is(err, queue.ErrNotFound) || !errors.Is(err, queue.ErrForged) {
				t.Fatalf("Record = %+v, %v; want not found (forged)", rec, err)
			}
			st, err := s.Status(ctx, rc.Ticket)
			if err != nil || st.Status != queue.StatusQueued || st.Result != nil {
				t.Fatalf("Status = %+v, %v; want queued from the queue", st, err)
			}
		})
	}
	// The next genuine write replaces it.
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDelivering}); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Record(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusDelivering {
		t.Fatalf("genuine record after a forged one: %+v %v", rec, err)
	}
}
