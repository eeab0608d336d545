package queue_test

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

func TestBodyLimit(t *testing.T) {
	srv := natstest.Start(t) // the server's default max payload: 1 MiB
	small := testConfig("small")
	small.MaxBody = 1000
	tight := testConfig("tight")
	tight.MaxBytes = 64 << 10
	s := openStore(t, srv, testConfig("orders"), small, tight)
	ctx := ctxT(t)
	payload := srv.Conn.MaxPayload()

	tests := []struct {
		queue   string
		by      string
		atLeast int64
		atMost  int64
	}{
		// 1 MiB of max_body does not fit in 1 MiB of payload with headers: the
		// server's payload binds, less the headers and MetadataRoom.
		{"orders", "the NATS server's max payload", payload - 8<<10, payload - queue.MetadataRoom - 200},
		{"small", "max_body", 1000, 1000},
		{"tight", "max_bytes", 60 << 10, 64<<10 - 500},
	}
	for _, tc := range tests {
		l, err := s.BodyLimit(order(tc.queue, ""))
		if err != nil {
			t.Fatal(err)
		}
		if l.By != tc.by || l.Bytes < tc.atLeast || l.Bytes > tc.atMost {
			t.Errorf("%s: limit %v, want %s between %d and %d", tc.queue, l, tc.by, tc.atLeast, tc.atMost)
			continue
		}
		// A body of exactly the limit is stored, and can be dead-lettered: the room
		// kept is real.
		req := order(tc.queue, strings.Repeat("b", int(l.Bytes)))
		rc, err := s.Park(ctx, req)
		if err != nil {
			t.Errorf("%s: a body of the limit (%v): %v", tc.queue, l, err)
			continue
		}
		q, _ := s.Queue(tc.queue)
		raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q."+tc.queue+"."+rc.Ticket)
		if err != nil {
			t.Fatal(err)
		}
		m := &queue.Message{Request: *req, Ticket: rc.Ticket, Fingerprint: raw.Header.Get(queue.HeaderFingerprint), Seq: raw.Sequence}
		m.Header = queue.KeptHeader(req.Header, nil)
		if err := s.DeadLetter(ctx, m, 8, strings.Repeat("reason ", 100)); err != nil {
			t.Errorf("%s: dead-lettering a body of the limit: %v", tc.queue, err)
		}
	}

	// Larger headers leave less room for the body.
	big := order("orders", "")
	big.Header.Set("X-Large", strings.Repeat("h", 10_000))
	l0, _ := s.BodyLimit(order("orders", ""))
	l1, err := s.BodyLimit(big)
	if err != nil || l0.Bytes-l1.Bytes < 10_000 {
		t.Errorf("10 kB more headers: limit %v → %v (%v)", l0, l1, err)
	}
	// Headers the queue drops take no room.
	dropping := testConfig("dropping")
	dropping.DropHeaders = []string{"X-Large"}
	if _, err := s.Declare(ctx, dropping); err != nil {
		t.Fatal(err)
	}
	big.Queue = "dropping"
	l2, _ := s.BodyLimit(big)
	if l3, _ := s.BodyLimit(order("dropping", "")); l2.Bytes != l3.Bytes {
		t.Errorf("dropped header counted: %v, want %v", l2, l3)
	}
	if _, err := s.BodyLimit(order("nope", "")); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("unknown queue: %v", err)
	}
}

// TestDropHeadersNeverStored looks for a dropped header's value in every byte the NATS
// server wrote: queue stream, dead letters, key-value buckets.
func TestDropHeadersNeverStored(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("orders")
	cfg.DropHeaders = []string{"authorization", "X-Api-Key"}
	s := openStore(t, srv, cfg)
	ctx := ctxT(t)
	const secret, apiKey, kept = "Bearer s3cret-t0ken-d7f1", "k3y-value-9a7c", "kept-marker-5e2b"
	req := order("orders", `{"sku":1}`)
	req.Header = map[string][]string{
		"Authorization": {secret},
		"x-api-key":     {apiKey}, // a map key not in canonical form
		"X-Request-Id":  {kept},
	}
	rc, err := s.Park(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
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
	if m.Ticket != rc.Ticket || m.Header.Get("Authorization") != "" || m.Header.Get("X-Api-Key") != "" || m.Header.Get("X-Request-Id") != kept {
		t.Errorf("stored headers %v", m.Header)
	}
	if err := s.DeadLetter(ctx, m, 1, "test"); err != nil {
		t.Fatal(err)
	}
	// Every write is synced before it is acknowledged: the files hold all of it now.
	files := map[string]int{}
	err = filepath.WalkDir(srv.Dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, v := range []string{secret, apiKey, kept} {
			files[v] += bytes.Count(b, []byte(v))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if files[secret] != 0 || files[apiKey] != 0 {
		t.Errorf("dropped header values found on disk: %v", files)
	}
	if files[kept] < 2 { // the queued message and its dead letter
		t.Errorf("the kept header's value is on disk %d times, want 2 or more (is the scan blind?)", files[kept])
	}
}

// deadLetterNext dead-letters the next message of a queue the way the dispatcher does.
func deadLetterNext(t *testing.T, s *queue.Store, name string) *queue.Message {
	t.Helper()
	ctx := ctxT(t)
	q, _ := s.Queue(name)
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
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
	if err := s.DeadLetter(ctx, m, 8, "test"); err != nil {
		t.Fatal(err)
	}
	if err := jm.Term(); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDeadLetterMaxAge(t *testing.T) {
	srv := natstest.Start(t)
	short := testConfig("short")
	short.DeadLetterMaxAge = time.Second
	s := openStore(t, srv, testConfig("orders"), short)
	ctx := ctxT(t)
	for _, name := range []string{"orders", "short"} {
		if _, err := s.Park(ctx, order(name, "x")); err != nil {
			t.Fatal(err)
		}
	}
	kept := deadLetterNext(t, s, "orders")
	deadLetterNext(t, s, "short")

	dead, err := s.JetStream().Stream(ctx, queue.DeadStream)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := dead.GetLastMsgForSubject(ctx, "sluice.dlq.orders."+kept.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if ttl := raw.Header.Get(jetstream.MsgTTLHeader); ttl != (14 * 24 * time.Hour).String() {
		t.Errorf("dead letter of a queue with the default dead_letter_max_age has TTL %q, want 14 days", ttl)
	}
	// JetStream deletes the short queue's dead letter after its TTL; the other stays.
	waitFor(t, func() bool {
		dls, err := s.DeadLetters(ctx, "short", 0)
		return err == nil && len(dls) == 0
	})
	if dls, err := s.DeadLetters(ctx, "orders", 0); err != nil || len(dls) != 1 {
		t.Errorf("dead letters of orders: %d, %v", len(dls), err)
	}
}

// TestDeadStreamOfOlderSluice opens a store on a dead-letter stream made without
// message TTLs, holding a dead letter without one.
func TestDeadStreamOfOlderSluice(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: queue.DeadStream, Subjects: []string{"sluice.dlq.>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute, AllowDirect: true}); err != nil {
		t.Fatal(err)
	}
	ticket := queue.NewTicket()
	old := nats.NewMsg("sluice.dlq.orders." + ticket)
	for k, v := range map[string]string{queue.HeaderTicket: ticket, queue.HeaderQueue: "orders", queue.HeaderMethod: "POST",
		queue.HeaderPath: "/v1/orders", queue.HeaderDeadReason: "old", queue.HeaderDeadAttempts: "8"} {
		old.Header.Set(k, v)
	}
	old.Data = []byte("old-body")
	if _, err := js.PublishMsg(ctx, old); err != nil {
		t.Fatal(err)
	}

	s := openStore(t, srv, testConfig("orders"))
	info, err := js.Stream(ctx, queue.DeadStream)
	if err != nil {
		t.Fatal(err)
	}
	if !info.CachedInfo().Config.AllowMsgTTL {
		t.Error("the dead-letter stream was not updated to allow message TTLs")
	}
	dls, err := s.DeadLetters(ctx, "orders", 0)
	if err != nil || len(dls) != 1 || dls[0].Message.Ticket != ticket || string(dls[0].Message.Body) != "old-body" {
		t.Fatalf("old dead letters: %+v, %v", dls, err)
	}
	if n, err := s.Requeue(ctx, "orders"); err != nil || n != 1 {
		t.Fatalf("requeue of an old dead letter: %d, %v", n, err)
	}
	// New dead letters, with a TTL, go into the same stream.
	if m := deadLetterNext(t, s, "orders"); m.Ticket != ticket || string(m.Body) != "old-body" {
		t.Errorf("requeued message %+v", m)
	}
	if dls, err := s.DeadLetters(ctx, "orders", 0); err != nil || len(dls) != 1 {
		t.Errorf("dead letters after a new one: %d, %v", len(dls), err)
	}
}

// TestHeaderLimit: headers that the server can never store (its 64 KiB header block,
// or a smaller max payload) are ErrHeaderTooLarge from BodyLimit and Park, nothing
// stored, not ErrUnavailable to be retried forever; the largest headers BodyLimit
// accepts are stored and can be dead-lettered.
func TestHeaderLimit(t *testing.T) {
	small := filepath.Join(t.TempDir(), "small.conf")
	if err := os.WriteFile(small, []byte("max_payload: 32768\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		srv  func(t *testing.T) *natstest.Server
		by   string
	}{
		{"JetStream header limit", func(t *testing.T) *natstest.Server { return natstest.Start(t) }, "JetStream's 64 KiB header limit"},
		{"max payload", func(t *testing.T) *natstest.Server {
			srv := natstest.StartConfig(t, small)
			srv.Conn = srv.Connect(t)
			return srv
		}, "max payload"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := tc.srv(t)
			s := openStore(t, srv, testConfig("orders"))
			ctx := ctxT(t)
			q, _ := s.Queue("orders")
			// ~3,500 headers, 42 kB, as a client can send through the front door.
			many := order("orders", "")
			for i := range 3500 {
				many.Header.Set(fmt.Sprintf("X-H%d", i), "v")
			}
			for _, req := range []*queue.Request{many, padded(70_000)} {
				var he *queue.HeaderLimitError
				if _, err := s.BodyLimit(req); !errors.As(err, &he) || !errors.Is(err, queue.ErrHeaderTooLarge) ||
					!errors.Is(err, queue.ErrTooLarge) || !strings.Contains(he.By, tc.by) || he.Size <= he.Limit {
					t.Fatalf("BodyLimit: %v, want a HeaderLimitError by %s", err, tc.by)
				}
				if _, err := s.Park(ctx, req); !errors.Is(err, queue.ErrHeaderTooLarge) || errors.Is(err, queue.ErrUnavailable) {
					t.Fatalf("Park: %v, want ErrHeaderTooLarge", err)
				}
				req.IdempotencyKey = "k-too-large"
				if _, err := s.Park(ctx, req); !errors.Is(err, queue.ErrHeaderTooLarge) {
					t.Fatalf("Park with a key: %v, want ErrHeaderTooLarge", err)
				}
			}
			if d, err := q.Depth(ctx); err != nil || d != 0 {
				t.Fatalf("depth %d (%v) after refusals, want 0", d, err)
			}
			// The largest padding BodyLimit takes: stored, and dead-lettered.
			lo, hi := 0, 70_000 // fits(lo), !fits(hi)
			for hi-lo > 1 {
				mid := (lo + hi) / 2
				if _, err := s.BodyLimit(padded(mid)); err == nil {
					lo = mid
				} else {
					hi = mid
				}
			}
			req := padded(lo)
			rc, err := s.Park(ctx, req)
			if err != nil {
				t.Fatalf("the largest headers BodyLimit takes (%d bytes of padding): %v", lo, err)
			}
			raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.orders."+rc.Ticket)
			if err != nil {
				t.Fatal(err)
			}
			m := &queue.Message{Request: *req, Ticket: rc.Ticket, Fingerprint: raw.Header.Get(queue.HeaderFingerprint), Seq: raw.Sequence}
			m.Header = queue.KeptHeader(req.Header, nil)
			if err := s.DeadLetter(ctx, m, 8, strings.Repeat("reason ", 100)); err != nil {
				t.Errorf("dead-lettering the largest headers: %v", err)
			}
		})
	}
}

// TestHeaderLimitOfMaxBytes: headers larger than the whole queue (max_bytes) could
// never be stored, however empty the queue: ErrHeaderTooLarge, not ErrFull forever.
func TestHeaderLimitOfMaxBytes(t *testing.T) {
	srv := natstest.Start(t)
	tiny := testConfig("orders")
	tiny.MaxBytes = 16 << 10
	s := openStore(t, srv, tiny)
	var he *queue.HeaderLimitError
	if _, err := s.BodyLimit(padded(20_000)); !errors.As(err, &he) || he.By != "max_bytes" || he.Size <= he.Limit {
		t.Fatalf("BodyLimit: %v, want a HeaderLimitError by max_bytes", err)
	}
	if l, err := s.BodyLimit(padded(10_000)); err != nil || l.By != "max_bytes" {
		t.Fatalf("headers that fit: %v %v", l, err)
	}
}

// padded is an order whose X-Pad header has n bytes.
func padded(n int) *queue.Request {
	req := order("orders", "")
	req.Header.Set("X-Pad", strings.Repeat("p", n))
	return req
}
