package dispatcher_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// publishAs publishes msg as a plain NATS client (no sluice code, no key) would.
func publishAs(t *testing.T, nc *nats.Conn, msg *nats.Msg) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
}

// Messages that someone with publish rights on sluice.q.> made up, altered or signed
// with another key are dead-lettered as forged; only the genuine order reaches the
// downstream, and the forged copies that carry its ticket do not mark it dead.
func TestForgedMessagesNeverReachTheDownstream(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	store, q := openStore(t, srv.Conn, cfg)
	genuine := park(t, store, "orders", 0, 1)[0]
	raw, err := srv.Stream(t, q.StreamName()).GetLastMsgForSubject(ctxT(t), "sluice.q.orders."+genuine)
	if err != nil {
		t.Fatal(err)
	}
	attacker := srv.Connect(t)
	copyOf := func(tamper func(*nats.Msg)) *nats.Msg {
		msg := nats.NewMsg(raw.Subject)
		for k, vs := range raw.Header {
			msg.Header[k] = append([]string(nil), vs...)
		}
		msg.Header.Del(queue.HeaderMsgID)
		msg.Header.Del(jetstream.ExpectedStreamHeader)
		msg.Data = bytes.Clone(raw.Data)
		tamper(msg)
		return msg
	}
	made := "madeupticketaaaaaaaaaaaaaa" // a ticket's shape, never parked
	forged := []*nats.Msg{
		copyOf(func(m *nats.Msg) { m.Data[len(m.Data)-2]++ }),                              // body
		copyOf(func(m *nats.Msg) { m.Header.Set(queue.HeaderPrefix+"X-Request-Id", "x") }), // header
		copyOf(func(m *nats.Msg) { m.Header.Set(queue.HeaderPath, "@evil.example/steal") }),
		copyOf(func(m *nats.Msg) { // made up, with no signature
			m.Subject = "sluice.q.orders." + made
			m.Header.Del(queue.HeaderSignature)
			m.Header.Set(queue.HeaderTicket, made)
			m.Data = []byte(`{"order":"made up"}`)
		}),
	}
	for _, msg := range forged {
		publishAs(t, attacker, msg)
	}
	// Signed, but with another key.
	other, err := queue.Open(ctxT(t), attacker, queue.WithSigningKey(bytes.Repeat([]byte("x"), 32)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Park(ctxT(t), orderReq("orders", 99)); err != nil {
		t.Fatal(err)
	}

	// Events go out on the replica's connection within each settlement, before its
	// counters: what it published up to the counters of the five is every event.
	reg := prometheus.NewRegistry()
	nc := srv.Connect(t)
	var dls []queue.DeadLetter
	if events := natstest.PublishedDuring(t, nc, queue.DeadSubject("orders"), func() {
		startReplicaOn(t, nc, cfg, "a", dispatcher.WithRegisterer(reg))
		waitFor(t, "five dead letters", 30*time.Second, func() bool {
			dls, err = store.DeadLetters(ctxT(t), "orders", 0)
			return err == nil && len(dls) == 5
		})
		waitFor(t, "the genuine order delivered", 30*time.Second, func() bool {
			st, err := store.Status(ctxT(t), genuine)
			return err == nil && st.Status == queue.StatusDone
		})
		waitFor(t, "the counters of the five rejections", 30*time.Second, func() bool {
			return gather(t, reg, "sluice_queue_rejected_total", "reason", "forged") == 5 &&
				gather(t, reg, "sluice_queue_dead_total") == 5
		})
	}); len(events) != 0 {
		t.Errorf("forged messages published dead events: %v", events)
	}
	for _, dl := range dls {
		if !strings.HasPrefix(dl.Reason, "forged: ") || dl.Attempts != 0 {
			t.Errorf("dead letter %s: reason %q, attempts %d", dl.Message.Ticket, dl.Reason, dl.Attempts)
		}
	}
	hits := ds.all()
	if len(hits) != 1 || hits[0].key != genuine || hits[0].body != `{"order":0}` || hits[0].header.Get("X-Request-Id") != "req-0" {
		t.Fatalf("downstream saw %+v, want only the genuine order", hits)
	}

	// Re-queued, they are forged still: dead letters again, never delivered, and the
	// genuine ticket stays done.
	if n, err := store.Requeue(ctxT(t), "orders"); err != nil || n != 5 {
		t.Fatalf("requeue %d %v", n, err)
	}
	waitFor(t, "the re-queued forgeries dead again", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_queue_rejected_total", "reason", "forged") == 10
	})
	if n := len(ds.all()); n != 1 {
		t.Errorf("downstream hit %d times", n)
	}
	if st, err := store.Status(ctxT(t), genuine); err != nil || st.Status != queue.StatusDone {
		t.Errorf("genuine ticket after the requeue: %+v %v", st, err)
	}
}

// A ticket record saying done that sluice did not write neither makes the dispatcher
// acknowledge the order undelivered nor shows on the monitor.
func TestForgedDoneRecordDoesNotSkipDelivery(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	store, _ := openStore(t, srv.Conn, cfg)
	tk := park(t, store, "orders", 0, 1)[0]
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctxT(t), queue.TicketsBucket)
	if err != nil {
		t.Fatal(err)
	}
	fake, _ := json.Marshal(queue.Record{Ticket: tk, Queue: "orders", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 200, Body: []byte("forged result")}})
	if _, err := kv.Put(ctxT(t), tk, fake); err != nil {
		t.Fatal(err)
	}
	if st, err := store.Status(ctxT(t), tk); err != nil || st.Status != queue.StatusQueued || st.Result != nil {
		t.Fatalf("monitor before delivery: %+v %v", st, err)
	}
	startReplica(t, srv, cfg, "a")
	waitFor(t, "the order delivered", 30*time.Second, func() bool { return ds.count(tk) == 1 })
	var st *queue.Record
	waitFor(t, "status done", 30*time.Second, func() bool {
		st, err = store.Status(ctxT(t), tk)
		return err == nil && st.Status == queue.StatusDone
	})
	if st.Result == nil || st.Result.StatusCode != 201 || string(st.Result.Body) != `{"ok":true}` {
		t.Fatalf("result %+v, want the downstream's", st.Result)
	}
}

// An order that could not be delivered (a path that is not a validly escaped absolute
// path, a query that would break the request line) is refused by Park, so it is never
// accepted, stored, or sent; deliveryURL refuses the same (TestDeliveryURL) for a
// parked message that slipped in some other way.
func TestUndeliverableOrderIsNeverParked(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	store, _ := openStore(t, srv.Conn, cfg)
	for _, c := range []struct{ path, query string }{{"/a%zz", ""}, {"//evil.example/x", ""}, {"/x", "a=1 HTTP/1.1"}, {"/x", "a=1#b"}} {
		req := orderReq("orders", 1)
		req.Path, req.RawQuery = c.path, c.query
		if rc, err := store.Park(ctxT(t), req); !errors.Is(err, queue.ErrInvalidRequest) {
			t.Errorf("park %q?%q: %+v %v, want ErrInvalidRequest", c.path, c.query, rc, err)
		}
	}
	good := park(t, store, "orders", 2, 3)[0]
	startReplica(t, srv, cfg, "a")
	waitFor(t, "the valid order delivered", 30*time.Second, func() bool { return ds.count(good) == 1 })
	if n := len(ds.all()); n != 1 {
		t.Fatalf("%d deliveries, want only the valid order's", n)
	}
}
