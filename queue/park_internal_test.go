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
	s, err := Open(ctx, srv.Conn)
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
	val, _ := json.Marshal(idemRecord{Ticket: crashed, Fingerprint: Fingerprint(&m.Request), Queue: "orders"})
	if _, err := s.idem.Create(ctx, idemKey("c1", `"crash"`), val, jetstream.KeyTTL(time.Hour)); err != nil {
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

func TestOutflowSamples(t *testing.T) {
	var o outflowSamples
	t0 := time.Unix(1_000_000, 0)
	if r, over := o.rate(); r != 0 || over != 0 {
		t.Fatalf("empty: %v %v", r, over)
	}
	// 100 orders parked, 2 leave per second; samples every second for two minutes.
	for i := 0; i <= 120; i++ {
		o.add(t0.Add(time.Duration(i)*time.Second), jetstream.StreamState{LastSeq: 100, Msgs: uint64(max(100-2*i, 0))})
		if i == 3 {
			if r, over := o.rate(); over != 0 {
				t.Errorf("after 3 s: %v over %v, want unmeasured", r, over)
			}
		}
		if i == 40 {
			if r, over := o.rate(); r != 2 || over != 40*time.Second {
				t.Errorf("after 40 s: %v over %v", r, over)
			}
		}
	}
	// The queue emptied at 50 s: the last minute saw nothing leave.
	if r, over := o.rate(); r != 0 || over < 55*time.Second || over > 65*time.Second {
		t.Errorf("after 120 s: %v over %v", r, over)
	}
	if len(o.s) > 16 {
		t.Errorf("%d samples kept", len(o.s))
	}
	// A re-created stream starts over.
	o.add(t0.Add(121*time.Second), jetstream.StreamState{LastSeq: 1, Msgs: 1})
	if r, over := o.rate(); over != 0 {
		t.Errorf("after re-creation: %v %v", r, over)
	}
}
