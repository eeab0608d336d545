package dispatcher_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// countingTransport counts the requests the dispatcher hands to its client: one per
// delivery attempt, each at a pacing slot of its own.
type countingTransport struct {
	base  http.RoundTripper
	mu    sync.Mutex
	slots map[time.Time]int
	n     atomic.Int64
}

func (c *countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	c.n.Add(1)
	if d, ok := dispatcher.DeliveryFrom(req.Context()); ok {
		c.mu.Lock()
		c.slots[d.Start]++
		c.mu.Unlock()
	}
	return c.base.RoundTrip(req)
}

// hangUpDownstream answers the first request of each connection (keep-alive) and
// reads the second one and closes the connection without answering: a downstream that
// drops a request it was sent on a reused connection, the case in which net/http's
// Transport may send it again on another connection. It records every request read.
type hangUpDownstream struct {
	addr     string
	mu       sync.Mutex
	arrived  []*http.Request
	answered map[string]bool // by Idempotency-Key
}

func newHangUpDownstream(t *testing.T) *hangUpDownstream {
	d := &hangUpDownstream{answered: map[string]bool{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	d.addr = ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.serve(c)
		}
	}()
	return d
}

func (d *hangUpDownstream) serve(c net.Conn) {
	defer c.Close()
	br := bufio.NewReader(c)
	req := d.read(br)
	if req == nil {
		return
	}
	d.mu.Lock()
	d.answered[req.Header.Get("Idempotency-Key")] = true
	d.mu.Unlock()
	answer := "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"
	if req.Method == http.MethodHead {
		answer = "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\n"
	}
	if _, err := io.WriteString(c, answer); err == nil {
		d.read(br) // and closed unanswered
	}
}

// read reads and records one request (nil: the connection ended).
func (d *hangUpDownstream) read(br *bufio.Reader) *http.Request {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil
	}
	_, _ = io.Copy(io.Discard, req.Body) // unread, the close would be a reset
	d.mu.Lock()
	d.arrived = append(d.arrived, req)
	d.mu.Unlock()
	return req
}

func (d *hangUpDownstream) done() (arrived, answered int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.arrived), len(d.answered)
}

// TestEveryRequestReachingTheDownstreamTakesASlot: a downstream that drops requests
// unanswered on reused connections gets exactly as many requests as the dispatcher's
// pacer granted slots — net/http's Transport sends none of them again on its own
// (it would for a request it thinks replayable: a rewindable or empty body and an
// idempotent method or an Idempotency-Key, which every delivery carries). A failed
// attempt is retried through the dispatcher's backoff and pacer instead. Each method
// and body shape of a delivery is covered, and each reaches the downstream as it
// would have (Content-Length, no chunking).
func TestEveryRequestReachingTheDownstreamTakesASlot(t *testing.T) {
	srv := natstest.Start(t)
	ds := newHangUpDownstream(t)
	cfg := baseConfig("dropped", "http://"+ds.addr)
	cfg.Outflow = limiter.PerSecond(40)
	cfg.MaxInFlight = 1 // one connection, reused
	cfg.MaxAttempts = 20
	store, _ := openStore(t, srv.Conn, cfg)
	shapes := []struct {
		method, body string
	}{
		{"POST", `{"order":1}`}, {"POST", ""}, {"PUT", `{"order":2}`}, {"PUT", ""}, {"PATCH", ""},
		{"GET", ""}, {"DELETE", ""}, {"OPTIONS", ""}, {"HEAD", ""}, {"DELETE", `{"why":"x"}`}, {"TRACE", ""},
	}
	const each = 4
	var tickets []string
	for i := range each * len(shapes) {
		s := shapes[i%len(shapes)]
		req := orderReq("dropped", i)
		req.Method, req.Body = s.method, []byte(s.body)
		rc, err := store.Park(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, rc.Ticket)
	}
	base := http.DefaultTransport.(*http.Transport).Clone()
	t.Cleanup(base.CloseIdleConnections)
	ct := &countingTransport{base: base, slots: map[time.Time]int{}}
	client := &http.Client{Transport: ct, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	startReplicaOn(t, srv.Connect(t), cfg, "r", dispatcher.WithHTTPClient(client))

	waitFor(t, "every order answered", 90*time.Second, func() bool {
		_, answered := ds.done()
		return answered == len(tickets)
	})
	// The last attempt's settlement is on its way; nothing else is sent.
	waitFor(t, "every ticket done", 30*time.Second, func() bool {
		for _, tk := range tickets {
			if st, err := store.Status(ctxT(t), tk); err != nil || st.Status != queue.StatusDone {
				return false
			}
		}
		return true
	})
	arrived, _ := ds.done()
	granted := int(ct.n.Load())
	ct.mu.Lock()
	for start, n := range ct.slots {
		if n > 1 {
			t.Errorf("%d requests at the pacing slot %v", n, start)
		}
	}
	ct.mu.Unlock()
	t.Logf("%d orders: %d requests reached the downstream, %d attempts were granted a slot", len(tickets), arrived, granted)
	if arrived != granted {
		t.Errorf("%d requests reached the downstream, the pacer granted %d: the Transport sent %d on its own", arrived, granted, arrived-granted)
	}
	if arrived <= len(tickets) {
		t.Errorf("only %d requests for %d orders: the downstream dropped none, the test tested nothing", arrived, len(tickets))
	}
	ds.mu.Lock()
	defer ds.mu.Unlock()
	bodies := map[string]string{}
	for i, tk := range tickets {
		bodies[tk] = shapes[i%len(shapes)].body
	}
	for _, r := range ds.arrived {
		body := bodies[r.Header.Get("Idempotency-Key")]
		if r.Method == "TRACE" {
			continue // an empty chunked body (see setOnce)
		}
		if len(r.TransferEncoding) > 0 || r.ContentLength != int64(len(body)) {
			t.Errorf("%s of a %d-byte body: Content-Length %d, Transfer-Encoding %v", r.Method, len(body), r.ContentLength, r.TransferEncoding)
		}
		_, hasLen := r.Header["Content-Length"]
		if wantLen := body != "" || r.Method == "POST" || r.Method == "PUT" || r.Method == "PATCH"; hasLen != wantLen {
			t.Errorf("%s of a %d-byte body: a Content-Length header %v, want %v (as net/http sends a body in memory)", r.Method, len(body), hasLen, wantLen)
		}
	}
}
