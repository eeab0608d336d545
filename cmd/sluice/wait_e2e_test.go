package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/ticket"
)

// gatedDownstream holds each delivery until release is closed, and notes when it
// answered.
type gatedDownstream struct {
	*httptest.Server
	arrived  chan struct{} // closed at the first delivery
	release  chan struct{}
	once     sync.Once
	mu       sync.Mutex
	answered time.Time
}

func newGatedDownstream(t *testing.T) *gatedDownstream {
	d := &gatedDownstream{arrived: make(chan struct{}), release: make(chan struct{})}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		d.once.Do(func() { close(d.arrived) })
		<-d.release
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"made":true}`)
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		d.mu.Lock()
		d.answered = time.Now()
		d.mu.Unlock()
	}))
	t.Cleanup(func() {
		d.once.Do(func() { close(d.arrived) })
		select {
		case <-d.release:
		default:
			close(d.release)
		}
		d.Close()
	})
	return d
}

// TestWaitForDoneThroughTheBinary: the 202 offers the waits; a client waiting with
// Prefer: wait=60 on an order whose delivery is under way gets done with the
// downstream's answer and Preference-Applied, before its wait expired; an event
// stream opened at the same time carries the same final status and ends; the Go
// helper (ticket.Wait) returns it. The time from the downstream's answer to the
// waiter's is logged.
func TestWaitForDoneThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice")
	}
	down := newGatedDownstream(t)
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 10/s}"))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	r, err := postOrder(p.url, "/v1/orders", "w1", `{"order":"w1"}`)
	if err != nil {
		t.Fatal(err)
	}
	acc := checkAccepted(t, r)
	var offer struct {
		MonitorWait   int64 `json:"monitor_wait"`
		MonitorEvents bool  `json:"monitor_events"`
	}
	if err := json.Unmarshal([]byte(r.body), &offer); err != nil || offer.MonitorWait != 60 || !offer.MonitorEvents {
		t.Fatalf("202 body %s: want monitor_wait 60 and monitor_events true", r.body)
	}
	select {
	case <-down.arrived:
	case <-time.After(30 * time.Second):
		t.Fatal("the order never reached the downstream")
	}
	monitor := p.url + acc.Monitor

	type answer struct {
		status, applied string
		at              time.Time
		err             error
	}
	waited := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest("GET", monitor, nil)
		req.Header.Set("Prefer", "wait=60")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			waited <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		var st ticket.Status
		err = json.NewDecoder(resp.Body).Decode(&st)
		waited <- answer{st.Status, resp.Header.Get("Preference-Applied"), time.Now(), err}
	}()
	streamed := make(chan []string, 1)
	go func() {
		req, _ := http.NewRequest("GET", monitor, nil)
		req.Header.Set("Accept", "text/event-stream")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			streamed <- []string{err.Error()}
			return
		}
		defer resp.Body.Close()
		var ids []string
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if id, ok := strings.CutPrefix(sc.Text(), "id: "); ok {
				ids = append(ids, id)
			}
		}
		streamed <- ids // the stream ended
	}()
	helper := make(chan string, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		st, err := ticket.Wait(ctx, monitor)
		if err != nil {
			helper <- err.Error()
			return
		}
		helper <- st.Status
	}()
	// Let the three ask before the delivery ends (asking after it is answered at once,
	// which would prove less); nothing below depends on it.
	time.Sleep(500 * time.Millisecond)
	close(down.release)

	var a answer
	select {
	case a = <-waited:
	case <-time.After(90 * time.Second):
		t.Fatal("the wait was not answered")
	}
	if a.err != nil || a.status != ticket.Done || a.applied != "wait=60" {
		t.Fatalf("the wait: %+v; want done with Preference-Applied: wait=60, before the wait expired", a)
	}
	down.mu.Lock()
	lag := a.at.Sub(down.answered)
	down.mu.Unlock()
	t.Logf("the waiter had done %s after the downstream answered", lag.Round(time.Millisecond))
	select {
	case ids := <-streamed:
		if len(ids) == 0 || ids[len(ids)-1] != ticket.Done {
			t.Errorf("the stream's events %v: want it to end with done", ids)
		}
	case <-time.After(60 * time.Second):
		t.Error("the stream stayed open after done")
	}
	select {
	case st := <-helper:
		if st != ticket.Done {
			t.Errorf("ticket.Wait: %s", st)
		}
	case <-time.After(90 * time.Second):
		t.Error("ticket.Wait did not return")
	}
}

// TestThousandWaitersThroughTheBinary: 1,000 clients wait at once on 100 tickets of a
// paused queue; the process's memory for them is logged (bytes
// per waiter; sluice_ticket_waits tells when they are open). With --max-waits 1000
// the 1,001st wait is answered at once (no Preference-Applied). The clients then go
// away and their places are free again; a SIGTERM with a wait and a stream open stops
// the process without waiting for them.
func TestThousandWaitersThroughTheBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("runs sluice with 1,000 connections")
	}
	bin, err := plainBinary()
	if err != nil {
		t.Fatal(err)
	}
	const waiters, tickets = 1000, 100
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 10/s}\nmax_depth: 1000"))
	p := startBinary(t, bin, "serve", "--rules", rulesPath, "--upstream", up.URL, "--log-level", "info",
		"--ticket-lookups", "0", "--max-waits-per-client", strconv.Itoa(waiters), "--max-waits", strconv.Itoa(waiters),
		"--shutdown-timeout", "50s")
	// Nothing is delivered while they wait. A pause needs the dispatcher's consumer,
	// which attaches a moment after the start (409 until then).
	var paused result
	waitFor(t, "the queue paused", 30*time.Second, func() bool {
		paused = send(t, "POST", p.admin+"/sluice/v1/queues/orders/pause?for=1h", nil)
		return paused.status != http.StatusConflict
	})
	if paused.status/100 != 2 {
		t.Fatalf("pause: %d %s", paused.status, paused.body)
	}
	warmUp(t, p.url, "/v1/orders")
	tks := make([]string, tickets)
	for i := range tks {
		tks[i] = mustDefer(t, p.url, "/v1/orders", fmt.Sprint("m", i)).Monitor
	}
	open := func() string { // sluice_ticket_waits
		for line := range strings.Lines(send(t, "GET", p.admin+"/metrics", nil).body) {
			if v, ok := strings.CutPrefix(line, "sluice_ticket_waits "); ok {
				return strings.TrimSpace(v)
			}
		}
		return "none"
	}
	if got := open(); got != "0" {
		t.Fatalf("sluice_ticket_waits %s before any wait", got)
	}
	before := vmRSS(t, p.cmd.Process.Pid)
	ctx, hangUp := context.WithCancel(context.Background())
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: waiters}}
	defer client.CloseIdleConnections()
	var wg sync.WaitGroup
	var failed, early atomic.Int64
	for i := range waiters {
		wg.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, "GET", p.url+tks[i%tickets], nil)
			req.Header.Set("Prefer", "wait=60")
			resp, err := client.Do(req)
			if err != nil {
				if ctx.Err() == nil {
					failed.Add(1)
					t.Logf("waiter %d: %v", i, err)
				}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if ctx.Err() == nil {
				early.Add(1) // answered before the wait ended: refused
				t.Logf("waiter %d answered early: %d %s", i, resp.StatusCode, b)
			}
		})
	}
	waitFor(t, "1,000 waits open", 60*time.Second, func() bool {
		n := open()
		if failed.Load()+early.Load() > 0 {
			t.Fatalf("%d waiters failed, %d answered early; %s open", failed.Load(), early.Load(), n)
		}
		return n == strconv.Itoa(waiters)
	})
	during := vmRSS(t, p.cmd.Process.Pid)
	t.Logf("%d waiters on %d tickets: RSS %d MiB -> %d MiB, %d bytes per waiter", waiters, tickets,
		before>>20, during>>20, (during-before)/waiters)
	// The cap: the next wait is answered at once, without Preference-Applied.
	if r := send(t, "GET", p.url+tks[0], nil, "Prefer", "wait=60"); r.status != 200 || r.header.Get("Preference-Applied") != "" {
		t.Errorf("a wait past --max-waits: %d, Preference-Applied %q; want an answer at once", r.status, r.header.Get("Preference-Applied"))
	}
	hangUp()
	wg.Wait()
	waitFor(t, "the places freed by the clients that went away", 60*time.Second, func() bool { return open() == "0" })

	// Shutdown with a wait and a stream open: both end at once.
	done := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest("GET", p.url+tks[0], nil)
		req.Header.Set("Prefer", "wait=60")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	stream, _ := http.NewRequest("GET", p.url+tks[1], nil)
	stream.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(stream)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitFor(t, "the wait and the stream open", 60*time.Second, func() bool { return open() == "2" })
	// --shutdown-timeout is 50s: stop's 30s pass only if the waits did not hold it.
	stopped := time.Now()
	if code := p.stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM with waits open", code)
	}
	t.Logf("stopped in %s with a wait and a stream open", time.Since(stopped).Round(time.Millisecond))
	if status := <-done; status != 200 {
		t.Errorf("the wait open at shutdown: %d, want its status", status)
	}
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		t.Errorf("the stream open at shutdown: %v, want it ended", err)
	}
}
