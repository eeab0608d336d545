package deferral

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/openapitest"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/ingress/ticket"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queuetest"
)

// waitRules are parktest.Orders with room for the orders of TestThousandWaiters.
var waitRules = strings.Replace(parktest.Orders, "max_depth: 3", "max_depth: 2000", 1)

// countingParker counts the status reads of a store (the watch is the store's).
type countingParker struct {
	*queue.Store
	reads atomic.Int64
}

func (p *countingParker) Status(ctx context.Context, ticket string) (*queue.Record, error) {
	p.reads.Add(1)
	return p.Store.Status(ctx, ticket)
}

type waitFixture struct {
	nats     *natstest.Server
	store    *queue.Store
	parker   *countingParker
	deferrer *Deferrer
	srv      *httptest.Server
}

// newWaitFixture serves the status of a queue that delivers nothing on its own, with
// waits of at most a minute; poll is how often a waited ticket is read besides the
// watch's news.
func newWaitFixture(t *testing.T, poll time.Duration, l WaitLimits) *waitFixture {
	t.Helper()
	_, ns, store := parktest.Open(t, waitRules)
	if l.Max == 0 {
		l.Max = time.Minute
	}
	p := &countingParker{Store: store}
	d := New(p, WithWaits(l))
	d.waits.poll = poll
	mux := http.NewServeMux()
	mux.Handle("GET "+Path+"{ticket}", d.StatusHandler())
	srv := httptest.NewServer(mux)
	t.Cleanup(func() {
		d.Close()
		srv.Close()
	})
	return &waitFixture{nats: ns, store: store, parker: p, deferrer: d, srv: srv}
}

func (f *waitFixture) park(t *testing.T) string {
	t.Helper()
	rc, err := f.store.Park(context.Background(), &queue.Request{Queue: "orders", Method: "POST", Path: "/v1/orders", ReceivedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
	return rc.Ticket
}

// get asks for ticket's status with headers (name, value, …).
func (f *waitFixture) get(ctx context.Context, ticket string, headers ...string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", f.srv.URL+Path+ticket, nil)
	if err != nil {
		return nil, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Add(headers[i], headers[i+1])
	}
	return http.DefaultClient.Do(req)
}

// settle settles the orders of tickets as a dispatcher does: done, or failed, with
// the downstream's answer.
func (f *waitFixture) settle(t *testing.T, status queue.Status, tickets ...string) {
	t.Helper()
	if err := f.settleBy(f.store, status, `{"ok":true}`, tickets...); err != nil {
		t.Fatal(err)
	}
}

// settleBy settles through store (another replica's, for one).
func (f *waitFixture) settleBy(store *queue.Store, status queue.Status, body string, tickets ...string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	q, err := store.Queue("orders")
	if err != nil {
		return err
	}
	res := &queue.Result{StatusCode: 201, Body: []byte(body)}
	fin := queuetest.Done(ctx, res)
	if status == queue.StatusFailed {
		fin = func(l *queue.Lease) error { return l.Fail(ctx, res, "refused") }
	}
	return queuetest.Settle(ctx, q, fin, tickets...)
}

// waiting is how many waits are open and whether ticket's follow has read it.
func (f *waitFixture) waiting(tk string) (open int, read bool) {
	h := f.deferrer.waits
	h.mu.Lock()
	defer h.mu.Unlock()
	if fl := h.follows[tk]; fl != nil {
		rec, _, _ := fl.state()
		read = rec != nil
	}
	return h.open, read
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 30s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func decodeStatus(t *testing.T, resp *http.Response) ticket.Status {
	t.Helper()
	defer resp.Body.Close()
	var st ticket.Status
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatalf("status body: %v", err)
	}
	return st
}

// TestPreferWaitAnsweredWhenDone: a client waiting with Prefer: wait=60 gets done,
// with the result and Preference-Applied, once the record is written by another
// process's store: the follow reads the ticket only once an hour otherwise, so the
// answer came from the watch before the wait expired.
func TestPreferWaitAnsweredWhenDone(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{})
	tk := f.park(t)
	type answer struct {
		resp *http.Response
		err  error
	}
	got := make(chan answer, 1)
	go func() {
		resp, err := f.get(context.Background(), tk, "Prefer", "respond-async, wait=60")
		got <- answer{resp, err}
	}()
	waitUntil(t, "the wait to be open and read", func() bool { open, read := f.waiting(tk); return open == 1 && read })
	if err := f.settleBy(f.otherStore(t), queue.StatusDone, "made", tk); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatal(a.err)
	}
	if pa := a.resp.Header.Get("Preference-Applied"); pa != "wait=60" {
		t.Errorf("Preference-Applied %q, want wait=60", pa)
	}
	st := decodeStatus(t, a.resp)
	if st.Status != ticket.Done || st.Result == nil || st.Result.Body != "made" {
		t.Fatalf("after the wait: %+v, want done with the result before the wait expired", st)
	}
	if open, _ := f.waiting(tk); open != 0 {
		t.Errorf("%d waits still open after the answer", open)
	}
}

// otherStore opens a store on a connection of its own, as another replica's.
func (f *waitFixture) otherStore(t *testing.T) *queue.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	other, err := queue.Open(ctx, f.nats.Connect(t), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	q, _ := f.store.Queue("orders")
	if _, err := other.Declare(ctx, q.Config()); err != nil {
		t.Fatal(err)
	}
	return other
}

// TestPreferWaitExpires: a status that stays queued is answered after the wait, with
// Retry-After and Preference-Applied; a wait longer than Max is cut to it; a final
// status is answered at once; without WithWaits the header changes nothing.
func TestPreferWaitExpires(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{Max: 2 * time.Second})
	tk := f.park(t)
	resp, err := f.get(context.Background(), tk, "Prefer", "wait=3600")
	if err != nil {
		t.Fatal(err)
	}
	if pa := resp.Header.Get("Preference-Applied"); pa != "wait=2" || resp.Header.Get("Retry-After") == "" {
		t.Errorf("Preference-Applied %q, Retry-After %q: want wait=2 (the maximum) and a Retry-After", pa, resp.Header.Get("Retry-After"))
	}
	if st := decodeStatus(t, resp); st.Status != ticket.Queued {
		t.Errorf("after the wait: %s, want queued", st.Status)
	}
	f.settle(t, queue.StatusFailed, tk)
	resp, err = f.get(context.Background(), tk, "Prefer", "wait=2")
	if err != nil {
		t.Fatal(err)
	}
	if st := decodeStatus(t, resp); st.Status != ticket.Failed || resp.Header.Get("Preference-Applied") != "wait=2" {
		t.Errorf("final: %s, Preference-Applied %q", st.Status, resp.Header.Get("Preference-Applied"))
	}
	// The documented answers.
	doc := openapitest.Load(t)
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", Path+tk, nil)
	r.Header.Set("Prefer", "wait=1")
	f.deferrer.StatusHandler().ServeHTTP(w, r)
	doc.Conforms(t, Path+"{ticket}", "GET", w)

	// HEAD: answered at once (nothing of a wait would be read).
	head := httptest.NewRecorder()
	hr := httptest.NewRequest("HEAD", Path+tk, nil)
	hr.Header.Set("Prefer", "wait=60")
	hr.Header.Set("Accept", "text/event-stream")
	f.deferrer.StatusHandler().ServeHTTP(head, hr)
	if head.Code != 200 || head.Header().Get("Preference-Applied") != "" || head.Header().Get("Content-Type") != "application/json" {
		t.Errorf("HEAD: %d, Preference-Applied %q, %s", head.Code, head.Header().Get("Preference-Applied"), head.Header().Get("Content-Type"))
	}

	plain := New(f.store).StatusHandler()
	w = httptest.NewRecorder()
	plain.ServeHTTP(w, r)
	if w.Code != 200 || w.Header().Get("Preference-Applied") != "" {
		t.Errorf("without WithWaits: %d, Preference-Applied %q", w.Code, w.Header().Get("Preference-Applied"))
	}
}

// TestWaitCapFreedByClientGone: past the per-client cap a wait is answered at once
// without Preference-Applied and a stream is 429; a client that hangs up frees its
// place, and another client has its own.
func TestWaitCapFreedByClientGone(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{PerClient: 1})
	tk := f.park(t)
	ctx, hangUp := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := f.get(ctx, tk, "Prefer", "wait=60"); err == nil {
			resp.Body.Close()
		}
	}()
	waitUntil(t, "the first wait to be open", func() bool { open, _ := f.waiting(tk); return open == 1 })
	resp, err := f.get(context.Background(), tk, "Prefer", "wait=60")
	if err != nil {
		t.Fatal(err)
	}
	if pa := resp.Header.Get("Preference-Applied"); pa != "" || resp.StatusCode != 200 {
		t.Errorf("past the cap: %d, Preference-Applied %q; want an answer at once without it", resp.StatusCode, pa)
	}
	resp.Body.Close()
	resp, err = f.get(context.Background(), tk, "Accept", "text/event-stream")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" {
		t.Errorf("a stream past the cap: %d, Retry-After %q; want 429 with one", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	hangUp()
	<-done
	waitUntil(t, "the place to be freed", func() bool { open, _ := f.waiting(tk); return open == 0 })
	resp, err = f.get(context.Background(), tk, "Prefer", "wait=1")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if pa := resp.Header.Get("Preference-Applied"); pa != "wait=1" {
		t.Errorf("after the first client went away: Preference-Applied %q, want wait=1", pa)
	}
	h := f.deferrer.waits
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.follows) != 0 || len(h.clients) != 0 || h.stopWatch != nil {
		t.Errorf("no waits left, yet %d follows, %d clients, watching %v", len(h.follows), len(h.clients), h.stopWatch != nil)
	}
}

// sseEvent is one event of a stream.
type sseEvent struct{ id, event, data string }

// readEvents reads the events of a stream until it ends, sending each on out.
func readEvents(r io.Reader, out chan<- sseEvent) {
	defer close(out)
	sc := bufio.NewScanner(r)
	var ev sseEvent
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "":
			if ev.event != "" {
				out <- ev
			}
			ev = sseEvent{}
		case strings.HasPrefix(line, "id: "):
			ev.id = line[4:]
		case strings.HasPrefix(line, "event: "):
			ev.event = line[7:]
		case strings.HasPrefix(line, "data: "):
			ev.data = line[6:]
		}
	}
}

// TestEventStream: a stream starts with retry and the status, carries each change the
// records tell, ends after the final status; a reconnect that has seen it gets 204.
func TestEventStream(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{})
	tk := f.park(t)
	resp, err := f.get(context.Background(), tk, "Accept", "application/json;q=0.5, text/event-stream")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("stream: %d %s", resp.StatusCode, ct)
	}
	br := bufio.NewReader(resp.Body)
	if first, err := br.ReadString('\n'); err != nil || first != "retry: 1000\n" {
		t.Fatalf("first line %q %v, want the retry", first, err)
	}
	events := make(chan sseEvent, 10)
	go readEvents(br, events)
	// next returns the next event, which must say want, past events saying skip.
	next := func(want string, skip ...string) ticket.Status {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if ok && ev.event == "status" && slices.Contains(skip, ev.id) {
					continue
				}
				var st ticket.Status
				if !ok || ev.event != "status" || ev.id != want || json.Unmarshal([]byte(ev.data), &st) != nil || st.Status != want {
					t.Fatalf("event %+v (open %v), want status %s", ev, ok, want)
				}
				return st
			case <-time.After(30 * time.Second):
				t.Fatalf("no %s event within 30s", want)
			}
			return ticket.Status{}
		}
	}
	next(ticket.Queued)
	waitUntil(t, "the stream's ticket to be read", func() bool { _, read := f.waiting(tk); return read })
	q, _ := f.store.Queue("orders")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := queuetest.Settle(ctx, q, queuetest.Failed(ctx, time.Millisecond, "delivery failed: 503"), tk); err != nil {
		t.Fatal(err)
	}
	if st := next(ticket.Queued); st.Attempts != 1 {
		t.Errorf("second event: %+v, want the failed attempt", st)
	}
	f.settle(t, queue.StatusDone, tk)
	// The second attempt's start (delivering) is told unless the stream reads the
	// record only once it is done.
	if st := next(ticket.Done, ticket.Delivering); st.Result == nil || st.Result.Status != 201 {
		t.Errorf("final event %+v", st)
	}
	select {
	case ev, ok := <-events:
		if ok {
			t.Fatalf("an event after the final one: %+v", ev)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the stream stays open after the final status")
	}
	again, err := f.get(context.Background(), tk, "Accept", "text/event-stream", "Last-Event-ID", "done")
	if err != nil {
		t.Fatal(err)
	}
	again.Body.Close()
	if again.StatusCode != http.StatusNoContent {
		t.Errorf("a reconnect that saw the final status: %d, want 204", again.StatusCode)
	}
	w := httptest.NewRecorder()
	r := httptest.NewRequest("GET", Path+tk, nil)
	r.Header.Set("Accept", "text/event-stream")
	r.Header.Set("Last-Event-ID", "done")
	f.deferrer.StatusHandler().ServeHTTP(w, r)
	openapitest.Load(t).Conforms(t, Path+"{ticket}", "GET", w)
}

// TestCloseEndsWaits: Close answers an open wait with the status it has and ends an
// open stream, long before the wait would expire; a wait after Close is answered at
// once.
func TestCloseEndsWaits(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{})
	tk := f.park(t)
	waited := make(chan string, 1)
	go func() {
		resp, err := f.get(context.Background(), tk, "Prefer", "wait=60")
		if err != nil {
			waited <- err.Error()
			return
		}
		waited <- decodeStatus(t, resp).Status
	}()
	stream, err := f.get(context.Background(), tk, "Accept", "text/event-stream")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	waitUntil(t, "both open", func() bool { open, _ := f.waiting(tk); return open == 2 })
	closed := make(chan struct{})
	go func() { f.deferrer.Close(); close(closed) }()
	select {
	case st := <-waited:
		if st != ticket.Queued {
			t.Errorf("the wait ended by Close: %s, want its status queued", st)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close left the wait open")
	}
	if _, err := io.Copy(io.Discard, stream.Body); err != nil {
		t.Errorf("the stream: %v", err)
	}
	<-closed
	resp, err := f.get(context.Background(), tk, "Prefer", "wait=60")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get("Preference-Applied") != "" {
		t.Errorf("a wait after Close was applied")
	}
}

// TestThousandWaiters: 1,000 clients waiting at once on 100 tickets cost one watch
// (one consumer on the tickets bucket), one follow per ticket and no NATS read per
// client: the reads while they wait are bounded by tickets × polls, whatever the
// number of waiters. The memory they take is logged (server and client sides, in
// this process).
func TestThousandWaiters(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 1,000 connections")
	}
	const waiters, tickets = 1000, 100
	f := newWaitFixture(t, 2*time.Second, WaitLimits{PerClient: waiters})
	tks := make([]string, tickets)
	for i := range tks {
		tks[i] = f.park(t)
	}
	tr := &http.Transport{MaxConnsPerHost: 0, MaxIdleConnsPerHost: waiters}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	held := heldRequestBytes(t, waiters)
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	answers := make(chan string, waiters)
	for i := range waiters {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", f.srv.URL+Path+tks[i%tickets], nil)
			req.Header.Set("Prefer", "wait=60")
			resp, err := client.Do(req)
			if err != nil {
				answers <- err.Error()
				return
			}
			answers <- decodeStatus(t, resp).Status
		})
	}
	waitUntil(t, "every wait open", func() bool { open, _ := f.waiting(tks[0]); return open == waiters })
	reads0, since := f.parker.reads.Load(), time.Now()
	runtime.GC()
	var during runtime.MemStats
	runtime.ReadMemStats(&during)
	perWaiter := (int64(during.HeapInuse+during.StackInuse) - int64(before.HeapInuse+before.StackInuse)) / waiters
	time.Sleep(5 * time.Second)
	reads, elapsed := f.parker.reads.Load()-reads0, time.Since(since)
	f.deferrer.waits.mu.Lock()
	follows := len(f.deferrer.waits.follows)
	f.deferrer.waits.mu.Unlock()
	info, err := f.nats.Stream(t, "KV_"+queue.TicketsBucket).Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	// Each ticket is read at most once per poll (2s here), plus once for a kick.
	if limit := int64(tickets) * (int64(elapsed/(2*time.Second)) + 2); reads > limit {
		t.Errorf("%d status reads in %s with %d waiters on %d tickets, want at most %d (per ticket, not per waiter)",
			reads, elapsed.Round(time.Millisecond), waiters, tickets, limit)
	}
	if follows != tickets || info.State.Consumers != 1 {
		t.Errorf("%d follows, %d consumers on the tickets bucket; want %d and 1", follows, info.State.Consumers, tickets)
	}
	t.Logf("%d waiters on %d tickets: %d bytes of heap and stacks per waiter (server and client in this process; "+
		"a request held by a plain net/http handler takes %d), %d status reads in %s",
		waiters, tickets, perWaiter, held, reads, elapsed.Round(time.Millisecond))
	f.settle(t, queue.StatusDone, tks...)
	wg.Wait()
	close(answers)
	n := 0
	for a := range answers {
		if a != ticket.Done {
			t.Errorf("a waiter got %q, want done", a)
		}
		n++
	}
	if n != waiters {
		t.Errorf("%d answers of %d", n, waiters)
	}
}

// heldRequestBytes is what n requests held open by a handler that only blocks take
// of heap and stacks per request, client and server in this process: the part of a
// waiter's cost that is net/http's own.
func heldRequestBytes(t *testing.T, n int) int64 {
	t.Helper()
	release := make(chan struct{})
	var in atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in.Add(1)
		<-release
	}))
	defer srv.Close()
	tr := &http.Transport{MaxIdleConnsPerHost: n}
	defer tr.CloseIdleConnections()
	runtime.GC()
	var before, during runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			if resp, err := (&http.Client{Transport: tr}).Get(srv.URL); err == nil {
				resp.Body.Close()
			}
		})
	}
	waitUntil(t, "every plain request held", func() bool { return in.Load() == int64(n) })
	runtime.GC()
	runtime.ReadMemStats(&during)
	close(release)
	wg.Wait()
	return (int64(during.HeapInuse+during.StackInuse) - int64(before.HeapInuse+before.StackInuse)) / int64(n)
}

func TestPreferWait(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want time.Duration
		ok   bool
	}{
		{nil, 0, false},
		{[]string{"wait=10"}, 10 * time.Second, true},
		{[]string{"respond-async, WAIT = 5"}, 5 * time.Second, true},
		{[]string{`wait="7"`}, 7 * time.Second, true},
		{[]string{"wait=3;foo=bar"}, 3 * time.Second, true},
		{[]string{"return=minimal", "wait=4, wait=9"}, 4 * time.Second, true},
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=1.5"}, 0, false},
		{[]string{"wait="}, 0, false},
		{[]string{"wait=99999999999999999999"}, 24 * time.Hour, true},
		{[]string{`foo="a, wait=5"`}, 0, false},
		{[]string{"waiting=5"}, 0, false},
	} {
		got, ok := preferWait(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("preferWait(%q) = %v %v, want %v %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
	for in, want := range map[string]bool{
		"text/event-stream": true, "TEXT/Event-Stream; q=0.9": true, "application/json, text/event-stream": true,
		"text/event-stream;q=0": false, "application/json": false, "*/*": false, `text/plain; x="text/event-stream"`: false,
	} {
		if got := acceptsEventStream([]string{in}); got != want {
			t.Errorf("acceptsEventStream(%q) = %v, want %v", in, got, want)
		}
	}
}

// FuzzPreferWait: any Prefer value gives no panic, a wait within a day, and wait=N
// added in front reads N.
func FuzzPreferWait(f *testing.F) {
	for _, s := range []string{"wait=10", `a="b,\"c", wait=1`, "wait=\"", ";;,,=", "wait=00000000000001"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if d, ok := preferWait([]string{s}); ok && (d < 0 || d > 24*time.Hour) {
			t.Fatalf("preferWait(%q) = %v", s, d)
		}
		if d, ok := preferWait([]string{"wait=42", s}); !ok || d != 42*time.Second {
			t.Fatalf("wait=42 before %q: %v %v", s, d, ok)
		}
		_ = acceptsEventStream([]string{s})
		_ = fmt.Sprint(splitList(s))
	})
}

// TestTicketWait: the Go helper follows a real front door's ticket to done, and says
// ErrNotFound for a ticket it does not know.
func TestTicketWait(t *testing.T) {
	f := newWaitFixture(t, time.Hour, WaitLimits{})
	tk := f.park(t)
	// The settling ends before the test does: Wait sees the order done once its record
	// is written, before its message is acknowledged, and the fixture's cleanup closes
	// the connection (a clean-clone run failed on "nats: connection closed").
	settled := make(chan struct{})
	defer func() { <-settled }()
	go func() {
		defer close(settled)
		deadline := time.Now().Add(30 * time.Second)
		for time.Now().Before(deadline) {
			if _, read := f.waiting(tk); read {
				break
			}
			time.Sleep(10 * time.Millisecond)
		}
		if err := f.settleBy(f.store, queue.StatusDone, "made", tk); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	st, err := ticket.Wait(ctx, f.srv.URL+Path+tk)
	if err != nil || st.Status != ticket.Done || st.Result == nil || st.Result.Body != "made" {
		t.Fatalf("Wait: %+v %v", st, err)
	}
	if _, err := ticket.Wait(ctx, f.srv.URL+Path+"aaaaaaaaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, ticket.ErrNotFound) {
		t.Errorf("an unknown ticket: %v, want ticket.ErrNotFound", err)
	}
}
