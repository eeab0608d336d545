package queue_test

import (
	"context"
	"errors"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// nats-server 2.15.2 does not stop a file store made while it shuts down: the
		// staging store of an atomic batch (the group commit tests stop the server
		// under concurrent parks), or a stream added then. Its flush loops and the
		// access-time ticker they hold outlive the server (seen once, the store's
		// flush loop telling an async-flushed one: a batch's, or a key stream's). A
		// server sluice leaves running shows many more goroutines than these.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*msgBlock).flushLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

func testConfig(name string) queueconfig.Config {
	return queueconfig.Config{
		Name:       name,
		Outflow:    limiter.PerSecond(10),
		Downstream: "http://127.0.0.1:1/api",
	}
}

func openStore(t testing.TB, srv *natstest.Server, cfgs ...queueconfig.Config) *queue.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cfgs {
		if _, err := s.Declare(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func order(q, body string) *queue.Request {
	return &queue.Request{
		Queue:    q,
		Rule:     "create-order",
		Method:   "POST",
		Path:     "/v1/orders",
		RawQuery: "dry=0",
		Header: http.Header{
			"Content-Type":        {"application/json"},
			"X-Request-Id":        {"r-1"},
			"Connection":          {"keep-alive, X-Drop-Me"},
			"X-Drop-Me":           {"1"},
			"Authorization":       {"Bearer secret"},
			"Idempotency-Key":     {`"k"`},
			"Proxy-Authorization": {"x"},
		},
		Body:   []byte(body),
		Client: "client-hash-1",
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestParseRate(t *testing.T) {
	for in, want := range map[string]limiter.Rate{
		"50/s":     limiter.PerSecond(50),
		"3000/10m": {Count: 3000, Period: 10 * time.Minute},
		"1/hour":   {Count: 1, Period: time.Hour},
		"3/500ms":  {Count: 3, Period: 500 * time.Millisecond},
	} {
		got, err := limiter.ParseRate(in)
		if err != nil || got != want {
			t.Errorf("ParseRate(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "5", "0/s", "-1/s", "5/fortnight", "x/s"} {
		if _, err := limiter.ParseRate(in); err == nil {
			t.Errorf("ParseRate(%q) accepted", in)
		}
	}
}

// TestKeptHeaderWithOrWithoutConnection: the headers never stored are dropped, and
// the others kept trimmed, whether or not a Connection header names more to drop
// (KeptHeader looks them up in place without one).
func TestKeptHeaderWithOrWithoutConnection(t *testing.T) {
	h := http.Header{
		"Keep-Alive": {"5"}, "Te": {"trailers"}, "Transfer-Encoding": {"chunked"}, "Upgrade": {"h2c"}, "Trailer": {"X"},
		"Host": {"a"}, "Content-Length": {"3"}, "Expect": {"100-continue"}, "Proxy-Authorization": {"p"},
		queue.HeaderCallback: {"https://cb"}, queue.HeaderTicket: {"forged"}, "Authorization": {"secret"},
		"x-lower": {" kept\t"}, "X-Crlf": {"a\r\nb", "ok"}, "X-Named": {"n"}, "Content-Type": {"application/json"},
	}
	want := http.Header{"X-Lower": {"kept"}, "X-Crlf": {"ok"}, "X-Named": {"n"}, "Content-Type": {"application/json"}}
	if got := queue.KeptHeader(h, []string{"authorization"}); !reflect.DeepEqual(got, want) {
		t.Errorf("without Connection: %v, want %v", got, want)
	}
	h["Connection"] = []string{"x-named, keep-alive"}
	delete(want, "X-Named")
	if got := queue.KeptHeader(h, []string{"authorization"}); !reflect.DeepEqual(got, want) {
		t.Errorf("with Connection: %v, want %v", got, want)
	}
}

func TestKeptHeaderAndFingerprint(t *testing.T) {
	req := order("q", `{"sku":1}`)
	req.Header.Set(queue.HeaderTicket, "forged")
	h := queue.KeptHeader(req.Header, []string{"authorization"})
	for _, gone := range []string{"Connection", "X-Drop-Me", "Authorization", "Proxy-Authorization", queue.HeaderTicket} {
		if h.Get(gone) != "" {
			t.Errorf("%s kept", gone)
		}
	}
	// The client's own key is kept exactly as sent: the downstream receives it.
	if h.Get("Idempotency-Key") != `"k"` {
		t.Errorf("Idempotency-Key %q, want the raw header value", h.Get("Idempotency-Key"))
	}
	if h.Get("Content-Type") != "application/json" || h.Get("X-Request-Id") != "r-1" {
		t.Errorf("kept headers: %v", h)
	}
	a := queue.Fingerprint(req)
	other := *req
	other.Header = http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-2"}}
	if queue.Fingerprint(&other) != a {
		t.Error("fingerprint depends on an irrelevant header")
	}
	other.Body = []byte(`{"sku":2}`)
	if queue.Fingerprint(&other) == a {
		t.Error("fingerprint ignores the body")
	}
	tk := queue.NewTicket()
	if !queue.ValidTicket(tk) || queue.NewTicket() == tk || queue.ValidTicket("../etc") {
		t.Errorf("ticket %q", tk)
	}
}

func TestParkStatusAndPosition(t *testing.T) {
	srv := natstest.Start(t)
	reg := prometheus.NewRegistry()
	ctx := ctxT(t)
	s, err := queue.Open(ctx, srv.Conn, queue.WithRegisterer(reg), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("orders")
	cfg.DropHeaders = []string{"Authorization"}
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	var tickets []string
	for i := range 3 {
		rc, err := s.Park(ctx, order("orders", strings.Repeat("x", i+1)))
		if err != nil {
			t.Fatal(err)
		}
		if rc.Duplicate || rc.Position != uint64(i+1) || rc.Queue != "orders" {
			t.Errorf("receipt %d: %+v", i, rc)
		}
		tickets = append(tickets, rc.Ticket)
	}
	st, err := s.Status(ctx, tickets[2])
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != queue.StatusQueued || st.Position != 3 || st.Rule != "create-order" || st.RetryAfter <= 0 {
		t.Errorf("status: %+v", st)
	}
	if _, err := s.Status(ctx, queue.NewTicket()); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("unknown ticket: %v", err)
	}
	if _, err := s.Status(ctx, "not-a-ticket"); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("malformed ticket: %v", err)
	}

	// The stored message: body as data, metadata and kept headers as NATS headers.
	q, _ := s.Queue("orders")
	raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.orders."+tickets[0])
	if err != nil {
		t.Fatal(err)
	}
	if string(raw.Data) != "x" || raw.Header.Get("Nats-Msg-Id") != tickets[0] ||
		raw.Header.Get(queue.HeaderPath) != "/v1/orders" || raw.Header.Get(queue.HeaderQuery) != "dry=0" ||
		raw.Header.Get(queue.HeaderPrefix+"Content-Type") != "application/json" ||
		raw.Header.Get(queue.HeaderPrefix+"Authorization") != "" || raw.Header.Get(queue.HeaderClient) != "client-hash-1" {
		t.Errorf("stored message headers: %v data %q", raw.Header, raw.Data)
	}
	if d, err := q.Depth(ctx); err != nil || d != 3 {
		t.Errorf("depth %d, %v", d, err)
	}
	if got := gather(t, reg, "sluice_queue_parked_total"); got != 3 {
		t.Errorf("parked_total = %v", got)
	}
	if got := gather(t, reg, "sluice_queue_depth"); got != 3 {
		t.Errorf("depth gauge = %v", got)
	}
	if got := gather(t, reg, "sluice_queue_outflow_per_second"); got != q.Config().Outflow.PerSecondFloat() {
		t.Errorf("outflow gauge = %v, configured %v", got, q.Config().Outflow)
	}
	if got := gather(t, reg, "sluice_queue_max_depth"); got != float64(q.Config().MaxDepth) {
		t.Errorf("max depth gauge = %v, configured %d", got, q.Config().MaxDepth)
	}

	if _, err := s.Park(ctx, &queue.Request{Queue: "nope", Method: "GET", Path: "/"}); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("unknown queue: %v", err)
	}
	if _, err := s.Park(ctx, &queue.Request{Queue: "orders", Method: "GET", Path: "no-slash"}); !errors.Is(err, queue.ErrInvalidRequest) {
		t.Errorf("bad path: %v", err)
	}
}

func gather(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

func TestParkFull(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("small")
	cfg.MaxDepth = 3
	cfg.Outflow = limiter.PerSecond(1)
	s := openStore(t, srv, cfg)
	ctx := ctxT(t)
	var keyed queue.Receipt
	for i := range 3 {
		req := order("small", "o"+itoa(i))
		req.IdempotencyKey = "key-" + itoa(i)
		rc, err := s.Park(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		keyed = rc
	}
	_, err := s.Park(ctx, order("small", "one too many"))
	if !errors.Is(err, queue.ErrFull) {
		t.Fatalf("want ErrFull, got %v", err)
	}
	// A repeat of an accepted order stores nothing: the full queue answers it with its
	// ticket, and a new key is refused as a new order is.
	repeat := order("small", "o"+itoa(2))
	repeat.IdempotencyKey = "key-" + itoa(2)
	if rc, err := s.Park(ctx, repeat); err != nil || !rc.Duplicate || rc.Ticket != keyed.Ticket {
		t.Errorf("repeat into the full queue: %+v %v, want ticket %s as a duplicate", rc, err, keyed.Ticket)
	}
	repeat.IdempotencyKey = "key-new"
	if _, err := s.Park(ctx, repeat); !errors.Is(err, queue.ErrFull) {
		t.Errorf("a new key into the full queue: %v, want ErrFull", err)
	}
	var fe *queue.FullError
	if !errors.As(err, &fe) || fe.Depth != 3 || fe.Limit != "max_depth" || fe.Max != 3 || fe.RetryAfter < time.Second || queue.RetryAfter(err) != fe.RetryAfter {
		t.Errorf("full error: %+v", fe)
	}
	q, _ := s.Queue("small")
	if d, _ := q.Depth(ctx); d != 3 {
		t.Errorf("a full queue was trimmed or grew: depth %d", d)
	}
	// A queue full by its bytes says so.
	cfg = testConfig("bytes")
	cfg.MaxBytes, cfg.MaxBody = 4096, 1024
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	for i := 0; ; i++ {
		req := order("bytes", "b"+itoa(i))
		req.Body = make([]byte, 1000)
		_, err := s.Park(ctx, req)
		if err == nil && i < 10 {
			continue
		}
		if !errors.As(err, &fe) || fe.Limit != "max_bytes" || fe.Max != 4096 {
			t.Errorf("order %d to a queue full by max_bytes: %v (%+v)", i, err, fe)
		}
		break
	}
}

func itoa(i int) string { return string(rune('a' + i)) }

func TestParkUnavailable(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	if _, err := s.Park(ctx, order("orders", "before")); err != nil {
		t.Fatal(err)
	}
	srv.Shutdown()
	for i := range 5 {
		req := order("orders", "while down")
		if i%2 == 1 {
			req.IdempotencyKey = "down-key"
		}
		_, err := s.Park(ctx, req)
		if !errors.Is(err, queue.ErrUnavailable) {
			t.Fatalf("NATS down: want ErrUnavailable, got %v", err)
		}
	}
	srv.Restart()
	q, _ := s.Queue("orders")
	if d, err := q.Depth(ctx); err != nil || d != 1 {
		t.Fatalf("after restart depth = %d (%v), want only the accepted message", d, err)
	}
	if _, err := s.Park(ctx, order("orders", "after")); err != nil {
		t.Fatalf("after restart: %v", err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestIdempotency(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	req := order("orders", `{"sku":1}`)
	req.IdempotencyKey = `"abc"`
	first, err := s.Park(ctx, req)
	if err != nil || first.Duplicate || first.Status != queue.StatusQueued {
		t.Fatalf("first: %+v %v", first, err)
	}
	again := order("orders", `{"sku":1}`)
	again.IdempotencyKey = `"abc"`
	again.Header.Set("X-Request-Id", "another retry")
	second, err := s.Park(ctx, again)
	if err != nil || second.Ticket != first.Ticket || !second.Duplicate {
		t.Fatalf("repeat: %+v %v (first %s)", second, err, first.Ticket)
	}
	diff := order("orders", `{"sku":2}`)
	diff.IdempotencyKey = `"abc"`
	if _, err := s.Park(ctx, diff); !errors.Is(err, queue.ErrIdempotencyConflict) {
		t.Fatalf("different payload: %v", err)
	}
	other := order("orders", `{"sku":1}`)
	other.IdempotencyKey = `"abc"`
	other.Client = "another client"
	third, err := s.Park(ctx, other)
	if err != nil || third.Ticket == first.Ticket || third.Duplicate {
		t.Fatalf("other client, same key: %+v %v", third, err)
	}
	q, _ := s.Queue("orders")
	if d, _ := q.Depth(ctx); d != 2 {
		t.Fatalf("depth %d, want 2 (one per client)", d)
	}

	// Once the dispatcher has finished the ticket, a repeat still gets it back.
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: first.Ticket, Queue: "orders", Status: queue.StatusDone}); err != nil {
		t.Fatal(err)
	}
	if err := q.Stream().Purge(ctx); err != nil { // as if delivered and acknowledged
		t.Fatal(err)
	}
	fourth, err := s.Park(ctx, again)
	if err != nil || fourth.Ticket != first.Ticket || !fourth.Duplicate || fourth.Status != queue.StatusDone {
		t.Fatalf("repeat after done: %+v %v", fourth, err)
	}
	if d, _ := q.Depth(ctx); d != 0 {
		t.Fatalf("a finished order was parked again (depth %d)", d)
	}
}

func TestConcurrentIdempotentParks(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	const n = 8
	tickets := make(chan string, n)
	errs := make(chan error, n)
	for range n {
		go func() {
			req := order("orders", "same")
			req.IdempotencyKey = `"race"`
			rc, err := s.Park(ctx, req)
			tickets <- rc.Ticket
			errs <- err
		}()
	}
	seen := map[string]bool{}
	for range n {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
		seen[<-tickets] = true
	}
	q, _ := s.Queue("orders")
	if d, _ := q.Depth(ctx); len(seen) != 1 || d != 1 {
		t.Fatalf("tickets %v, depth %d", seen, d)
	}
}

func TestRecordAndEvents(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	rc, err := s.Park(ctx, order("orders", "b"))
	if err != nil {
		t.Fatal(err)
	}
	rec := &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 201, Header: http.Header{"Location": {"/o/1"}}, Body: []byte("ok")}}
	if err := s.SaveRecord(ctx, rec); err != nil {
		t.Fatal(err)
	}
	st, err := s.Status(ctx, rc.Ticket)
	if err != nil || st.Status != queue.StatusDone || st.Result.StatusCode != 201 || string(st.Result.Body) != "ok" ||
		st.Result.Header.Get("Location") != "/o/1" || st.UpdatedAt.IsZero() {
		t.Fatalf("status %+v %v", st, err)
	}
	// The record carries a per-key TTL of the queue's IdempotencyTTL.
	kv, err := s.JetStream().KeyValue(ctx, queue.TicketsBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	js := s.JetStream()
	str, _ := js.Stream(ctx, "KV_"+queue.TicketsBucket)
	raw, err := str.GetMsg(ctx, e.Revision())
	if err != nil {
		t.Fatal(err)
	}
	if ttl := raw.Header.Get(jetstream.MsgTTLHeader); ttl != "24h0m0s" && ttl != "86400s" && ttl != "86400" {
		t.Errorf("record TTL header %q", ttl)
	}
	sub, err := srv.Conn.SubscribeSync(queue.DoneSubject("orders"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PublishEvent(queue.DoneSubject("orders"), queue.Event{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone, DownstreamStatus: 201}); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.NextMsg(5 * time.Second)
	if err != nil || !strings.Contains(string(msg.Data), rc.Ticket) {
		t.Fatalf("event %v %v", msg, err)
	}
}

func TestDeadLetters(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"), testConfig("other"))
	ctx := ctxT(t)
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var tickets []string
	for i := range 3 {
		rc, err := s.Park(ctx, order("orders", "dead"+itoa(i)))
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, rc.Ticket)
	}
	// Dead-letter all three the way the dispatcher does.
	for range 3 {
		jm, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, err := queue.Decode(jm)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeadLetter(ctx, m, 8, "downstream answered 500\nInternal"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeadLetter(ctx, m, 8, "repeat after a crash"); err != nil { // duplicate: dropped
			t.Fatal(err)
		}
		if err := s.SaveRecord(ctx, &queue.Record{Ticket: m.Ticket, Queue: "orders", Status: queue.StatusDead, Attempts: 8}); err != nil {
			t.Fatal(err)
		}
		if err := jm.Term(); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Stream().DeleteConsumer(ctx, "t"); err != nil {
		t.Fatal(err)
	}
	dls, err := s.DeadLetters(ctx, "orders", 0)
	if err != nil || len(dls) != 3 {
		t.Fatalf("dead letters %d %v", len(dls), err)
	}
	if dls[0].Message.Ticket != tickets[0] || dls[0].Attempts != 8 || dls[0].Reason != "downstream answered 500 Internal" ||
		string(dls[0].Message.Body) != "deada" || dls[0].DeadAt.IsZero() {
		t.Errorf("dead letter: %+v", dls[0])
	}
	if other, _ := s.DeadLetters(ctx, "other", 0); len(other) != 0 {
		t.Errorf("other queue has %d dead letters", len(other))
	}
	if two, _ := s.DeadLetters(ctx, "orders", 2); len(two) != 2 {
		t.Errorf("limit: %d", len(two))
	}

	// A tool without the rules (sluice dlq) requeues through a store that never
	// declared the queue.
	tool, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tool.Requeue(ctx, "nosuchqueue"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("requeue to a missing queue: %v", err)
	}
	n, err := tool.Requeue(ctx, "orders", tickets[1])
	if err != nil || n != 1 {
		t.Fatalf("requeue: %d %v", n, err)
	}
	st, err := s.Status(ctx, tickets[1])
	if err != nil || st.Status != queue.StatusQueued || st.Attempts != 0 || st.Position < 1 {
		t.Fatalf("requeued status %+v %v", st, err)
	}
	raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.orders."+tickets[1])
	if err != nil || string(raw.Data) != "deadb" {
		t.Fatalf("requeued message %v %v", raw, err)
	}
	if _, err := s.Requeue(ctx, "orders", queue.NewTicket()); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("requeue unknown ticket: %v", err)
	}
	// A requeue that the queue refuses leaves the ticket dead, not "queued".
	full := testConfig("orders")
	full.MaxDepth = 1
	if _, err := s.Declare(ctx, full); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Requeue(ctx, "orders", tickets[2]); !errors.Is(err, queue.ErrFull) {
		t.Fatalf("requeue into a full queue: %v", err)
	}
	if st, err := s.Status(ctx, tickets[2]); err != nil || st.Status != queue.StatusDead || st.Attempts != 8 {
		t.Fatalf("status after a refused requeue: %+v %v", st, err)
	}
	purged, err := s.PurgeDeadLetters(ctx, "orders")
	if err != nil || purged != 2 {
		t.Fatalf("purge %d %v", purged, err)
	}
	if left, _ := s.DeadLetters(ctx, "orders", 0); len(left) != 0 {
		t.Fatalf("%d left after purge", len(left))
	}
}

func TestEmbeddedSurvivesRestart(t *testing.T) {
	dir := t.TempDir()
	start := func() (*embedded.Server, *queue.Store) {
		e, err := embedded.Start(embedded.Config{DataDir: dir})
		if err != nil {
			t.Fatal(err)
		}
		if e.ClientURL() != "" {
			t.Errorf("no listener wanted, got %s", e.ClientURL())
		}
		nc, err := e.Connect()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { nc.Close(); e.Shutdown() })
		s, err := queue.Open(ctxT(t), nc, queue.WithSigningKey(natstest.SigningKey()))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Declare(ctxT(t), testConfig("orders")); err != nil {
			t.Fatal(err)
		}
		return e, s
	}
	e, s := start()
	rc, err := s.Park(ctxT(t), order("orders", "durable"))
	if err != nil {
		t.Fatal(err)
	}
	s.Conn().Close()
	e.Shutdown()

	_, s2 := start()
	st, err := s2.Status(ctxT(t), rc.Ticket)
	if err != nil || st.Status != queue.StatusQueued {
		t.Fatalf("after restart: %+v %v", st, err)
	}

	e3, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Token: "0123456789abcdef0123456789abcdef"})
	if err != nil {
		t.Fatal(err)
	}
	defer e3.Shutdown()
	if !strings.HasPrefix(e3.ClientURL(), "nats://127.0.0.1:") {
		t.Errorf("listener URL %q", e3.ClientURL())
	}
}
