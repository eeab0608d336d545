package queue

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A crash between recording the idempotency key and publishing leaves a key without a
// message; the client got no receipt. Its retry must publish the message under the
// recorded ticket rather than hand out a ticket for nothing.
func TestIdempotencyCrashBetweenKeyAndPublish(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, srv.Conn, WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Declare(ctx, Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	req := &Request{Queue: "orders", Method: "POST", Path: "/v1/orders", Body: []byte(`{"sku":1}`),
		Header: http.Header{"Content-Type": {"application/json"}}, Client: "c1", IdempotencyKey: `"crash"`}

	// Step 1 of Park happened, then the process died.
	crashed := NewTicket()
	m := &Message{Request: *req}
	key := idemKey("c1", `"crash"`)
	val, err := s.seal(idemKind, key, idemRecord{Ticket: crashed, Fingerprint: Fingerprint(&m.Request), Queue: "orders"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.idem.Create(ctx, key, val, jetstream.KeyTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Status(ctx, crashed); err != ErrNotFound {
		t.Fatalf("ticket known before the retry: %v", err)
	}

	rc, err := s.Park(ctx, req)
	if err != nil || rc.Ticket != crashed || !rc.Duplicate {
		t.Fatalf("retry: %+v %v", rc, err)
	}
	raw, err := q.stream.GetLastMsgForSubject(ctx, q.subject(crashed))
	if err != nil || string(raw.Data) != `{"sku":1}` || raw.Header.Get(HeaderMsgID) != crashed {
		t.Fatalf("message not published under the recorded ticket: %v %v", raw, err)
	}
	if d, _ := q.Depth(ctx); d != 1 {
		t.Fatalf("depth %d", d)
	}
	// A second retry finds the message and publishes nothing more.
	if rc2, err := s.Park(ctx, req); err != nil || rc2.Ticket != crashed {
		t.Fatalf("second retry %+v %v", rc2, err)
	}
	if d, _ := q.Depth(ctx); d != 1 {
		t.Fatalf("depth %d after the second retry", d)
	}
}

// An idempotency record that sluice did not write decides nothing: a forged one that
// maps a client's key to a ticket of the attacker's choice is replaced, and the order
// gets a ticket of its own.
func TestForgedIdempotencyRecordIsReplaced(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := Open(ctx, srv.Conn, WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	req := &Request{Queue: "orders", Method: "POST", Path: "/v1/orders", Body: []byte(`{"sku":1}`), Client: "c1", IdempotencyKey: `"k"`}
	planted := NewTicket()
	val, _ := json.Marshal(idemRecord{Ticket: planted, Fingerprint: Fingerprint(req), Queue: "orders"})
	if _, err := s.idem.Create(ctx, idemKey("c1", `"k"`), val, jetstream.KeyTTL(time.Hour)); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, req)
	if err != nil || rc.Ticket == planted || rc.Duplicate {
		t.Fatalf("park over a forged key: %+v %v", rc, err)
	}
	// The key now holds the genuine record: a repeat gets the same ticket.
	if rc2, err := s.Park(ctx, req); err != nil || rc2.Ticket != rc.Ticket || !rc2.Duplicate {
		t.Fatalf("repeat: %+v %v", rc2, err)
	}
}
