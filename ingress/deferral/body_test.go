package deferral

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// countingReader is a request body that records how much of it was read.
type countingReader struct {
	r    io.Reader
	read atomic.Int64
}

func newCountingReader(n int) *countingReader {
	return &countingReader{r: bytes.NewReader(bytes.Repeat([]byte("b"), n))}
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// bodyFixture is the front door with a defer rule over its limit (the first request
// uses the quota) and the queue "orders" declared with cfg on a real NATS server (the
// server's default max payload: 1 MiB).
type bodyFixture struct {
	handler  http.Handler
	rule     string
	deferrer *Deferrer
	queue    *queue.Queue
	nats     *natstest.Server
	limit    queue.BodyLimit // the queue's body limit for fixture requests
}

func newBodyFixture(t *testing.T, cfg queueconfig.Config, opts ...Option) *bodyFixture {
	t.Helper()
	set := parktest.Rules(t, parktest.Orders)
	cfg.Name, cfg.Outflow, cfg.Downstream = "orders", limiter.PerSecond(10), "http://127.0.0.1:1"
	srv, store := parktest.Store(t, cfg)
	q, err := store.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	d := New(store, opts...)
	m := newMiddleware(t, set, ingress.WithDeferrer(d))
	f := &bodyFixture{nats: srv, handler: m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })),
		rule: set.Rules()[0].Name, deferrer: d, queue: q}
	if w := f.post(strings.NewReader("{}"), 2); w.Code != http.StatusOK {
		t.Fatalf("first request (within the limit): %d", w.Code)
	}
	if f.limit, err = store.BodyLimit(f.request()); err != nil {
		t.Fatal(err)
	}
	return f
}

// request is what the deferrer parks for post (without the body).
func (f *bodyFixture) request() *queue.Request {
	r := f.newRequest(nil, 0)
	header := ingress.Deferral{}.ParkHeader(r) // as the deferrer parks it
	return &queue.Request{Queue: "orders", Rule: f.rule, Method: "POST", Path: "/v1/orders", RawQuery: "x=1",
		Header: header, Client: strings.Repeat("0", 32)} // a scope is 32 hex digits (idempotencyScope)
}

func (f *bodyFixture) newRequest(body io.Reader, contentLength int64) *http.Request {
	r := httptest.NewRequest("POST", "/v1/orders?x=1", body)
	r.ContentLength = contentLength
	r.Header.Set("Content-Type", "application/json")
	r.RemoteAddr = "198.51.100.1:1000"
	return r
}

// post sends a request with body and Content-Length contentLength (-1: unknown, as
// for a chunked body).
func (f *bodyFixture) post(body io.Reader, contentLength int64) *httptest.ResponseRecorder {
	r := f.newRequest(body, contentLength)
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

func (f *bodyFixture) depth(t *testing.T) uint64 {
	t.Helper()
	n, err := f.queue.Depth(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestDeferBodyOverTheQueueLimit(t *testing.T) {
	tests := []struct {
		name string
		cfg  queueconfig.Config
		by   string
	}{
		{"server max payload", queueconfig.Config{}, "max payload"},
		{"max_body", queueconfig.Config{MaxBody: 1000}, "max_body"},
		// A body that can never fit in the queue is 413, not 429 "full" forever.
		{"max_bytes", queueconfig.Config{MaxBytes: 16 << 10}, "max_bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newBodyFixture(t, tc.cfg)
			if !strings.Contains(f.limit.By, tc.by) {
				t.Fatalf("limit %v, want one set by %s", f.limit, tc.by)
			}
			over := int(f.limit.Bytes) + 1
			check := func(what string, w *httptest.ResponseRecorder) {
				t.Helper()
				if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), strconv.FormatInt(f.limit.Bytes, 10)+" bytes") ||
					!strings.Contains(w.Body.String(), tc.by) {
					t.Errorf("%s: %d %s, want 413 naming %v", what, w.Code, w.Body, f.limit)
				}
			}
			// Content-Length over the limit: refused before a byte is read.
			body := newCountingReader(2 << 20)
			check("Content-Length", f.post(body, 2<<20))
			if n := body.read.Load(); n != 0 {
				t.Errorf("Content-Length over the limit: %d bytes read, want 0", n)
			}
			// Unknown length: read no further than one byte past the limit.
			body = newCountingReader(2 << 20)
			check("chunked", f.post(body, -1))
			if n := body.read.Load(); n > int64(over) {
				t.Errorf("chunked: %d bytes read, want at most %d", n, over)
			}
			// One byte less is stored, either way (into an empty queue: max_bytes holds
			// one such body).
			for _, cl := range []int64{int64(over - 1), -1} {
				if w := f.post(newCountingReader(over-1), cl); w.Code != http.StatusAccepted {
					t.Errorf("body of the limit (Content-Length %d): %d %s", cl, w.Code, w.Body)
				}
				if d := f.depth(t); d != 1 {
					t.Errorf("queue depth %d, want 1", d)
				}
				if err := f.nats.Stream(t, f.queue.StreamName()).Purge(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if used := f.deferrer.memory.used.Load(); used != 0 {
				t.Errorf("%d bytes of the memory budget still reserved", used)
			}
		})
	}
}

func TestDeferMemoryBudget(t *testing.T) {
	const budget = 256 << 10
	f := newBodyFixture(t, queueconfig.Config{}, WithBodyMemory(budget))
	// Other requests hold all but 1000 bytes.
	if !f.deferrer.memory.take(budget - 1000) {
		t.Fatal("cannot take the budget")
	}
	for _, tc := range []struct {
		name string
		size int
		cl   int64
	}{
		{"Content-Length", 2000, 2000},
		{"chunked", 100 << 10, -1},
	} {
		body := newCountingReader(tc.size)
		w := f.post(body, tc.cl)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Errorf("%s over the budget: %d (Retry-After %q) %s, want 503 with Retry-After", tc.name, w.Code, w.Header().Get("Retry-After"), w.Body)
		}
		if n := body.read.Load(); n > 0 {
			t.Errorf("%s over the budget: %d bytes read, want 0", tc.name, n)
		}
	}
	// A body that fits in what is left is taken.
	if w := f.post(newCountingReader(900), 900); w.Code != http.StatusAccepted {
		t.Errorf("900 bytes with 1000 free: %d %s", w.Code, w.Body)
	}
	// A chunked body that outgrows what is left part way is refused then.
	f.deferrer.memory.give(budget - 1000)
	if !f.deferrer.memory.take(budget - 100<<10) {
		t.Fatal("cannot take the budget")
	}
	body := newCountingReader(200 << 10)
	if w := f.post(body, -1); w.Code != http.StatusServiceUnavailable {
		t.Errorf("chunked body outgrowing the budget: %d %s", w.Code, w.Body)
	}
	if n := body.read.Load(); n == 0 || n > 100<<10 {
		t.Errorf("chunked body outgrowing the budget: %d bytes read, want some, at most the free 100 KiB", n)
	}
	f.deferrer.memory.give(budget - 100<<10)
	if d := f.depth(t); d != 1 {
		t.Errorf("queue depth %d, want 1: a 503 accepts nothing", d)
	}
	if used := f.deferrer.memory.used.Load(); used != 0 {
		t.Errorf("%d bytes of the budget still reserved after every request ended", used)
	}
	// A body larger than the whole budget could never be taken: 413, not "retry later".
	w := f.post(newCountingReader(budget+1), budget+1)
	if w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "--defer-memory") {
		t.Errorf("body over the whole budget: %d %s", w.Code, w.Body)
	}
	if w := f.post(newCountingReader(budget), budget); w.Code != http.StatusAccepted {
		t.Errorf("body of the whole budget: %d %s", w.Code, w.Body)
	}
	// A chunked body is read in chunks and then copied into one buffer: it may be half
	// the budget.
	if w := f.post(newCountingReader(budget/2+1), -1); w.Code != http.StatusRequestEntityTooLarge || !strings.Contains(w.Body.String(), "--defer-memory") {
		t.Errorf("chunked body over half the budget: %d %s", w.Code, w.Body)
	}
	if w := f.post(newCountingReader(budget/2), -1); w.Code != http.StatusAccepted {
		t.Errorf("chunked body of half the budget: %d %s", w.Code, w.Body)
	}
	if used := f.deferrer.memory.used.Load(); used != 0 {
		t.Errorf("%d bytes of the budget still reserved", used)
	}
}

// stalledBody is a request body that sends nothing: its first Read says so on started,
// then waits until release is closed and fails, as a client that announced a length
// and never sent the body would until the server's read timeout.
type stalledBody struct {
	started chan struct{}
	release chan struct{}
	once    bool
}

func (s *stalledBody) Read([]byte) (int, error) {
	if !s.once {
		s.once = true
		close(s.started)
	}
	<-s.release
	return 0, io.ErrUnexpectedEOF
}

// TestDeferMemoryNotHeldByStalledBodies: a client that announces a large
// Content-Length and then sends nothing (slowloris) must not hold the memory of its
// whole announced body: a handful of them would otherwise refuse every other deferred
// order 503 until the server's read timeout (60 s in sluice serve), at no cost to them.
// Memory is taken as the body arrives; an announced length that cannot fit in what is
// left is still refused before a byte is read (TestDeferMemoryBudget).
func TestDeferMemoryNotHeldByStalledBodies(t *testing.T) {
	const budget = 256 << 10
	f := newBodyFixture(t, queueconfig.Config{}, WithBodyMemory(budget))
	release := make(chan struct{})
	done := make(chan int, 2)
	for range 2 {
		body := &stalledBody{started: make(chan struct{}), release: release}
		go func() {
			done <- f.post(body, 120<<10).Code
		}()
		select {
		case <-body.started:
		case <-time.After(20 * time.Second):
			t.Fatal("the stalled body was never read")
		}
	}
	// Two stalled clients announced 240 KiB of the 256 KiB and sent nothing: a 20 KiB
	// order that arrives whole is taken.
	w := f.post(newCountingReader(20<<10), 20<<10)
	close(release)
	for range 2 {
		if code := <-done; code != http.StatusBadRequest {
			t.Errorf("stalled body: %d, want 400 (the body could not be read)", code)
		}
	}
	if w.Code != http.StatusAccepted {
		t.Errorf("20 KiB order beside two stalled bodies: %d %s, want 202", w.Code, w.Body)
	}
	if used := f.deferrer.memory.used.Load(); used != 0 {
		t.Errorf("%d bytes of the budget still reserved after every request ended", used)
	}
}

// TestDeferHeadersTheQueueCannotStore: ~3,500 headers (42 kB, within the front door's
// limits) make a parked message whose header block JetStream refuses: 431 naming the
// limit, before the body is read and with nothing stored, not 503 "retry later" forever.
func TestDeferHeadersTheQueueCannotStore(t *testing.T) {
	f := newBodyFixture(t, queueconfig.Config{})
	body := newCountingReader(100)
	r := f.newRequest(body, 100)
	for i := range 3500 {
		r.Header.Set("X-H"+strconv.Itoa(i), "v")
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	if w.Code != http.StatusRequestHeaderFieldsTooLarge || w.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(w.Body.String(), "JetStream's 64 KiB header limit") || w.Header().Get("Retry-After") != "" {
		t.Fatalf("%d %v %s, want a 431 problem naming the limit", w.Code, w.Header(), w.Body)
	}
	if n := body.read.Load(); n != 0 {
		t.Errorf("%d bytes of the body read, want 0", n)
	}
	if d := f.depth(t); d != 0 {
		t.Errorf("queue depth %d, want 0", d)
	}
}
