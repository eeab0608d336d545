package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/queue"
)

// End-to-end tests of deferral through the real binary: orders over their limit are
// parked by `sluice serve` / `sluice ingress`, delivered by the dispatchers of `sluice
// serve` / `sluice dispatch` to a real downstream HTTP server, and followed on the
// ticket status endpoint; processes are killed with SIGKILL mid-delivery; dead letters
// are recovered with `sluice dlq`.

// downstream is the API that deferred orders are delivered to. Like a real idempotent
// API it deduplicates by Idempotency-Key: a repeat gets the first answer again and is
// counted as a duplicate. It also checks that no order (X-Order) ever arrives under two
// different keys, which would be a duplicate the downstream could not recognise.
type downstream struct {
	*httptest.Server
	delay   atomic.Int64 // per request, nanoseconds
	failing atomic.Bool  // answer 500

	started  atomic.Int64 // requests received
	finished atomic.Int64 // requests answered (any status)
	failures atomic.Int64 // 500s answered

	mu         sync.Mutex
	order      []string          // keys in order of first successful arrival
	count      map[string]int    // successful deliveries per key
	keyOfOrder map[string]string // X-Order → key
	mismatches []string          // orders seen under two keys
	requests   map[string]seenRequest
}

type seenRequest struct {
	method, path, query, order, body, contentType string
}

func newDownstream(t *testing.T, delay time.Duration) *downstream {
	d := &downstream{count: map[string]int{}, keyOfOrder: map[string]string{}, requests: map[string]seenRequest{}}
	d.delay.Store(int64(delay))
	d.Server = httptest.NewServer(http.HandlerFunc(d.serve))
	t.Cleanup(d.Close)
	return d
}

func (d *downstream) serve(w http.ResponseWriter, r *http.Request) {
	d.started.Add(1)
	defer d.finished.Add(1)
	body, _ := io.ReadAll(r.Body)
	time.Sleep(time.Duration(d.delay.Load()))
	if d.failing.Load() {
		d.failures.Add(1)
		http.Error(w, "downstream broken", http.StatusInternalServerError)
		return
	}
	key, order := r.Header.Get("Idempotency-Key"), r.Header.Get("X-Order")
	d.mu.Lock()
	if key != "" {
		if d.count[key] == 0 {
			d.order = append(d.order, key)
			d.requests[key] = seenRequest{r.Method, r.URL.Path, r.URL.RawQuery, order, string(body), r.Header.Get("Content-Type")}
		}
		d.count[key]++
	}
	if order != "" {
		if prev, ok := d.keyOfOrder[order]; ok && prev != key {
			d.mismatches = append(d.mismatches, fmt.Sprintf("order %s under keys %s and %s", order, prev, key))
		}
		d.keyOfOrder[order] = key
	}
	d.mu.Unlock()
	// Processing the order (the part that matters) happened even when the client has
	// gone away meanwhile: that is what makes a redelivery a duplicate.
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Downstream", "orders-api")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"order":%q,"accepted":true}`, order)
}

// arrived returns how many of keys have been delivered at least once.
func (d *downstream) arrived(keys []string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, k := range keys {
		if d.count[k] > 0 {
			n++
		}
	}
	return n
}

// duplicates returns the number of deliveries beyond the first, over every key.
func (d *downstream) duplicates() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, c := range d.count {
		n += c - 1
	}
	return n
}

func (d *downstream) snapshot() (order []string, count map[string]int, mismatches []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.order), clonedMap(d.count), slices.Clone(d.mismatches)
}

func clonedMap(m map[string]int) map[string]int {
	out := make(map[string]int, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// waitArrived waits until every key has been delivered.
func (d *downstream) waitArrived(t *testing.T, keys []string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for d.arrived(keys) < len(keys) {
		if time.Now().After(deadline) {
			t.Fatalf("after %s only %d of %d accepted orders reached the downstream", within, d.arrived(keys), len(keys))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// deferRules defers every POST /v1/orders beyond the first (a token bucket of one that
// refills once an hour) to the queue orders; queueExtra adds fields to that queue.
// A second queue, tiny, holds two messages and delivers one per hour.
func deferRules(downstreamURL, queueExtra string) string {
	return fmt.Sprintf(`
domain: e2e-defer
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    algorithm: token_bucket
    on_limit: defer
    queue: orders
  - key: route
    value: tiny
    rate_limit: {unit: hour, requests_per_unit: 1, name: tiny}
    algorithm: token_bucket
    on_limit: defer
    queue: tiny
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
  - name: tiny
    match: {method: [POST], path: /v1/tiny}
    descriptors:
      - [{key: route, value: tiny}]
queues:
  orders:
    downstream: %s
%s
  tiny:
    outflow: {unit: hour, requests_per_unit: 1}
    max_depth: 2
    downstream: %s
`, downstreamURL, indent(queueExtra, "    "), downstreamURL)
}

func indent(s, prefix string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	for i, l := range lines {
		lines[i] = prefix + strings.TrimSpace(l)
	}
	return strings.Join(lines, "\n")
}

// dispatchFlags make crash recovery take seconds, not the production minute: a message
// taken by a killed dispatcher comes back after 4s, and a queue pinned to a dead
// dispatcher moves after 1s.
var dispatchFlags = []string{"--delivery-timeout", "3s", "--ack-wait", "4s", "--failover-after", "1s"}

// accepted is what a client learns from a 202.
type accepted struct {
	Ticket            string `json:"ticket"`
	Queue             string `json:"queue"`
	Status            string `json:"status"`
	Monitor           string `json:"monitor"`
	EstimatedDelivery string `json:"estimated_delivery"`
	Duplicate         bool   `json:"duplicate"`
}

// postOrder sends one order; err is a transport error (the process may be gone).
func postOrder(base, path, order, body string, headers ...string) (result, error) {
	req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Order", order)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return result{}, err
	}
	return result{resp.StatusCode, resp.Header, string(b)}, nil
}

// mustDefer sends an order that must be deferred and returns its ticket.
func mustDefer(t *testing.T, base, path, order string, headers ...string) accepted {
	t.Helper()
	r, err := postOrder(base, path, order, fmt.Sprintf(`{"order":%q}`, order), headers...)
	if err != nil {
		t.Fatal(err)
	}
	return checkAccepted(t, r)
}

func checkAccepted(t *testing.T, r result) accepted {
	t.Helper()
	if r.status != http.StatusAccepted {
		t.Fatalf("status %d, want 202: %s", r.status, r.body)
	}
	var a accepted
	if err := json.Unmarshal([]byte(r.body), &a); err != nil || !queue.ValidTicket(a.Ticket) {
		t.Fatalf("202 body %q: %v", r.body, err)
	}
	if loc := r.header.Get("Location"); loc != "/sluice/v1/deferred/"+a.Ticket || a.Monitor != loc {
		t.Fatalf("Location %q, monitor %q, ticket %s", loc, a.Monitor, a.Ticket)
	}
	return a
}

// ticketStatus is the JSON of GET /sluice/v1/deferred/{ticket}.
type ticketStatus struct {
	Ticket    string `json:"ticket"`
	Queue     string `json:"queue"`
	Status    string `json:"status"`
	Attempts  int    `json:"attempts"`
	LastError string `json:"last_error"`
	Result    *struct {
		Status  int         `json:"status"`
		Headers http.Header `json:"headers"`
		Body    string      `json:"body"`
	} `json:"result"`
}

func getStatus(t *testing.T, base, ticket string) (ticketStatus, result) {
	t.Helper()
	r := send(t, "GET", base+"/sluice/v1/deferred/"+ticket, nil)
	var st ticketStatus
	if r.status == 200 {
		if err := json.Unmarshal([]byte(r.body), &st); err != nil {
			t.Fatalf("status body %q: %v", r.body, err)
		}
	}
	return st, r
}

// waitStatus polls a ticket until it has status want.
func waitStatus(t *testing.T, base, ticket, want string, within time.Duration) ticketStatus {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		st, r := getStatus(t, base, ticket)
		if st.Status == want {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("ticket %s: status %q after %s, want %q (%d %s)", ticket, st.Status, within, want, r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// warmUp spends the one request the rules let through at once, so that every later
// order is deferred.
func warmUp(t *testing.T, base, path string) {
	t.Helper()
	if r, err := postOrder(base, path, "warm-up", "{}"); err != nil || r.status != 200 {
		t.Fatalf("first request: %v %d %s", err, r.status, r.body)
	}
}

// (a) Over-limit orders get 202, reach the downstream in the order they arrived, each
// exactly once, and their tickets end done with the downstream's answer.
func TestDeferDeliversInOrderExactlyOnce(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	// One delivery at a time, so the arrival order at the downstream is the order of
	// the queue and nothing else.
	// X-Downstream is kept in results only because result_headers lists it.
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}\nmax_in_flight: 1\nresult_headers: [X-Downstream]"))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")

	const n = 30
	var tickets []string
	for i := range n {
		a := mustDefer(t, p.url, "/v1/orders?src=e2e", fmt.Sprint("o", i))
		if a.Queue != "orders" || a.Status != "queued" || a.EstimatedDelivery == "" {
			t.Fatalf("order %d: %+v", i, a)
		}
		tickets = append(tickets, a.Ticket)
	}
	down.waitArrived(t, tickets, 30*time.Second)
	// Every ticket done: the downstream answered them all, so no delivery is left.
	for i, tk := range tickets {
		st := waitStatus(t, p.url, tk, "done", 20*time.Second)
		want := fmt.Sprintf(`{"order":"o%d","accepted":true}`, i)
		if st.Result == nil || st.Result.Status != 201 || st.Result.Body != want ||
			st.Result.Headers.Get("X-Downstream") != "orders-api" || st.Attempts != 1 {
			t.Fatalf("ticket %d status %+v, result %+v", i, st, st.Result)
		}
	}
	order, count, mismatches := down.snapshot()
	if !slices.Equal(order, tickets) {
		t.Errorf("arrival order at the downstream differs from the order of acceptance:\n got %v\nwant %v", order, tickets)
	}
	for _, tk := range tickets {
		if count[tk] != 1 {
			t.Errorf("ticket %s delivered %d times", tk, count[tk])
		}
	}
	if len(count) != n || len(mismatches) > 0 || down.started.Load() != n {
		t.Errorf("downstream saw %d keys in %d requests (want %d), mismatches %v", len(count), down.started.Load(), n, mismatches)
	}
	// The delivered request is the original one plus the ticket as Idempotency-Key.
	down.mu.Lock()
	first := down.requests[tickets[0]]
	down.mu.Unlock()
	if first.method != "POST" || first.path != "/v1/orders" || first.query != "src=e2e" || first.order != "o0" ||
		first.body != `{"order":"o0"}` || first.contentType != "application/json" {
		t.Errorf("delivered request %+v", first)
	}
	if up.hits.Load() != 1 {
		t.Errorf("upstream got %d requests, want only the warm-up", up.hits.Load())
	}
	waitQueueEmpty(t, p.admin, "orders")
	if r := send(t, "GET", p.url+"/sluice/v1/deferred/"+strings.Repeat("a", 26), nil); r.status != 404 {
		t.Errorf("unknown ticket: %d", r.status)
	}
}

// sender posts orders from several goroutines until told to stop, a transport error
// (the process died) or max orders, and keeps the tickets of those that got 202.
type sender struct {
	mu       sync.Mutex
	tickets  []string
	orders   map[string]string // ticket → order
	attempts atomic.Int64
	stop     atomic.Bool
	wg       sync.WaitGroup
}

func startSenders(t *testing.T, base string, workers, max int, pause time.Duration) *sender {
	s := &sender{orders: map[string]string{}}
	for w := range workers {
		s.wg.Go(func() {
			for i := 0; !s.stop.Load(); i++ {
				time.Sleep(pause)
				if s.attempts.Add(1) > int64(max) {
					return
				}
				order := fmt.Sprintf("w%d-%d", w, i)
				r, err := postOrder(base, "/v1/orders", order, fmt.Sprintf(`{"order":%q}`, order))
				if err != nil {
					return // the front door is gone; whatever got no 202 was never promised
				}
				if r.status != http.StatusAccepted {
					t.Errorf("order %s: %d %s", order, r.status, r.body)
					return
				}
				var a accepted
				if err := json.Unmarshal([]byte(r.body), &a); err != nil {
					t.Errorf("order %s: %q: %v", order, r.body, err)
					return
				}
				s.mu.Lock()
				s.tickets = append(s.tickets, a.Ticket)
				s.orders[a.Ticket] = order
				s.mu.Unlock()
			}
		})
	}
	return s
}

func (s *sender) accepted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.tickets)
}

// waitFor polls cond until it holds.
func waitFor(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitQueueEmpty waits until the depth metric (cached up to a second) says the queue
// is empty.
func waitQueueEmpty(t *testing.T, admin, queueName string) {
	t.Helper()
	want := fmt.Sprintf("sluice_queue_depth{queue=%q} 0", queueName)
	waitFor(t, "an empty queue "+queueName, 20*time.Second, func() bool {
		return strings.Contains(send(t, "GET", admin+"/metrics", nil).body, want)
	})
}

// reportKill logs what the downstream saw of a crash and checks what must hold.
func reportKill(t *testing.T, down *downstream, tickets []string, base string) {
	t.Helper()
	order, count, mismatches := down.snapshot()
	promised := map[string]bool{}
	for _, tk := range tickets {
		promised[tk] = true
	}
	extra := 0
	for _, k := range order {
		if !promised[k] {
			extra++ // stored, but its client never heard the 202
		}
	}
	dups := down.duplicates()
	t.Logf("accepted (202) %d; delivered keys %d (of which %d never acknowledged to their client); "+
		"duplicate deliveries (same Idempotency-Key) %d; requests to the downstream %d",
		len(tickets), len(count), extra, dups, down.started.Load())
	if len(mismatches) > 0 {
		t.Errorf("orders delivered under different keys: %v", mismatches)
	}
	// The downstream has them all; their records follow as each answer is handled.
	for _, tk := range tickets {
		waitStatus(t, base, tk, "done", 30*time.Second)
	}
}

// (b) kill -9 of `sluice serve` (embedded NATS) while orders are queued and deliveries
// are under way: after a restart on the same data directory every order that got a 202
// is delivered.
func TestServeKilledLosesNoAcceptedOrder(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 150*time.Millisecond)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}\nmax_in_flight: 8"))
	dataDir := t.TempDir()
	args := append([]string{"--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir}, dispatchFlags...)
	p := startSluice(t, args...)
	warmUp(t, p.url, "/v1/orders")

	// About 200 orders a second against 50 deliveries a second: the queue grows.
	s := startSenders(t, p.url, 4, 300, 20*time.Millisecond)
	// Kill while orders keep arriving, several deliveries are waiting on the slow
	// downstream, and more orders wait in the queue.
	waitFor(t, "deliveries under way", 30*time.Second, func() bool {
		return down.finished.Load() >= 10 && down.started.Load()-down.finished.Load() >= 3 && len(s.accepted()) >= 40
	})
	p.kill(t)
	s.wg.Wait() // each sender stops at its first refused connection
	tickets := s.accepted()
	inFlight := down.started.Load() - down.finished.Load()
	before := down.arrived(tickets)
	t.Logf("killed with %d orders accepted (%d sent), %d delivered, %d deliveries under way", len(tickets), s.attempts.Load(), before, inFlight)
	if before == len(tickets) || s.attempts.Load() > 300 {
		t.Fatal("everything was sent or delivered before the kill; the test proves nothing")
	}

	p2 := startSluice(t, args...)
	down.waitArrived(t, tickets, 60*time.Second)
	reportKill(t, down, tickets, p2.url)

	// A second process on the data directory is refused, not let loose on its files.
	code, _, stderr := runSluice(t, append([]string{"serve", "--listen", freeAddr(t), "--admin-listen", freeAddr(t)}, args...)...)
	if code != 1 || !strings.Contains(stderr, "in use by another sluice process") {
		t.Errorf("second serve on one data dir: exit %d\n%s", code, stderr)
	}
}

// (c) kill -9 of a `sluice dispatch` mid-delivery (the front door is a separate
// `sluice ingress`, whose embedded NATS the dispatchers connect to): a new dispatcher
// delivers every accepted order.
func TestDispatchKilledLosesNoAcceptedOrder(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 300*time.Millisecond)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 20/s}\nmax_in_flight: 4"))
	natsAddr := freeAddr(t)
	front := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL, "--nats-listen", natsAddr, "--nats-listen-token", testNATSToken, "--queue-key", testQueueKey)
	dispatchArgs := append([]string{"--rules", rulesPath, "--nats", "nats://" + natsAddr, "--nats-token", testNATSToken, "--queue-key", testQueueKey}, dispatchFlags...)
	d1 := startCommand(t, "dispatch", dispatchArgs...)
	if r := send(t, "GET", d1.admin+"/readyz", nil); r.status != 200 {
		t.Fatalf("dispatch /readyz: %d %s", r.status, r.body)
	}
	warmUp(t, front.url, "/v1/orders")

	var tickets []string
	for i := range 60 {
		tickets = append(tickets, mustDefer(t, front.url, "/v1/orders", fmt.Sprint("c", i)).Ticket)
	}
	waitFor(t, "deliveries under way", 30*time.Second, func() bool {
		return down.started.Load()-down.finished.Load() >= 2 && down.finished.Load() >= 4
	})
	m := send(t, "GET", d1.admin+"/metrics", nil).body
	if !strings.Contains(m, `sluice_queue_delivered_total{queue="orders"}`) || !strings.Contains(m, "sluice_delivery_duration_seconds") {
		t.Errorf("dispatch /metrics has no dispatcher metrics:\n%s", grepLines(m, "sluice_"))
	}
	d1.kill(t)
	inFlight := down.started.Load() - down.finished.Load()
	t.Logf("dispatcher killed with %d of %d orders delivered and %d deliveries under way", down.arrived(tickets), len(tickets), inFlight)

	startCommand(t, "dispatch", dispatchArgs...)
	down.waitArrived(t, tickets, 60*time.Second)
	reportKill(t, down, tickets, front.url)
}

// SIGTERM to `sluice dispatch` lets the deliveries under way finish (and be recorded
// done) before it exits, status 0.
func TestDispatchShutdownFinishesDeliveries(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 1500*time.Millisecond)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}\nmax_in_flight: 3"))
	natsAddr := freeAddr(t)
	front := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL, "--nats-listen", natsAddr, "--nats-listen-token", testNATSToken, "--queue-key", testQueueKey)
	d := startCommand(t, "dispatch", "--rules", rulesPath, "--nats", "nats://"+testNATSToken+"@"+natsAddr, "--queue-key", testQueueKey)
	warmUp(t, front.url, "/v1/orders")
	var tickets []string
	for i := range 6 {
		tickets = append(tickets, mustDefer(t, front.url, "/v1/orders", fmt.Sprint("s", i)).Ticket)
	}
	waitFor(t, "three deliveries under way", 30*time.Second, func() bool { return down.started.Load() == 3 })
	if code := d.stop(t); code != 0 {
		t.Fatalf("dispatch exit status %d\n%s", code, d.output)
	}
	if down.started.Load() != 3 || down.finished.Load() != 3 {
		t.Fatalf("downstream: %d started, %d finished; want the 3 under way finished", down.started.Load(), down.finished.Load())
	}
	done := 0
	for _, tk := range tickets {
		st, _ := getStatus(t, front.url, tk)
		switch st.Status {
		case "done":
			done++
		case "queued", "": // not taken yet: waits for the next dispatcher
		default:
			t.Errorf("ticket %s: %s", tk, st.Status)
		}
	}
	if done != 3 {
		t.Errorf("%d tickets done after shutdown, want the 3 delivered", done)
	}
}

// testNATSToken is the --nats-listen-token of the tests' embedded servers.
const testNATSToken = "test-token-0123456789abcdef0123456789"

// runSluice runs the binary to completion and returns its exit status and output.
func runSluice(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(sluiceBinary, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) {
			t.Fatal(err)
		}
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// (d) A downstream answering 500 until max_attempts: the ticket ends dead, an event is
// published on sluice.dead.orders, `sluice dlq list` shows it, `sluice dlq requeue`
// brings it back and it is delivered once the downstream is healthy; purge needs --yes.
func TestDeadLetterRequeue(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	down.failing.Store(true)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL,
		"outflow: {rate: 50/s}\nmax_attempts: 2\nbackoff: {initial: 50ms, max: 200ms}"))
	natsAddr := freeAddr(t)
	dataDir := t.TempDir()
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--nats-listen", natsAddr, "--nats-listen-token", testNATSToken, "--data-dir", dataDir)
	natsURL := "nats://" + testNATSToken + "@" + natsAddr

	// serve generated the key and kept it in the data directory; dlq reaching the
	// queues over --nats needs the same one.
	key := keptQueueKey(t, dataDir)
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	events := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(queue.DeadSubject("orders"), events)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	warmUp(t, p.url, "/v1/orders")
	a := mustDefer(t, p.url, "/v1/orders", "d1")
	b := mustDefer(t, p.url, "/v1/orders", "d2")
	dead := map[string]queue.Event{}
	timeout := time.After(30 * time.Second)
	for len(dead) < 2 {
		select {
		case m := <-events:
			var ev queue.Event
			if err := json.Unmarshal(m.Data, &ev); err != nil {
				t.Fatalf("event %q: %v", m.Data, err)
			}
			dead[ev.Ticket] = ev
		case <-timeout:
			t.Fatalf("dead-letter events: %v", dead)
		}
	}
	for _, tk := range []string{a.Ticket, b.Ticket} {
		ev, ok := dead[tk]
		if !ok || ev.Status != queue.StatusDead || ev.Queue != "orders" || ev.Attempts != 2 || !strings.Contains(ev.Error, "500") {
			t.Errorf("event of %s: %+v", tk, ev)
		}
		st := waitStatus(t, p.url, tk, "dead", 10*time.Second)
		if st.Attempts != 2 {
			t.Errorf("ticket %s: %+v", tk, st)
		}
	}
	if got := down.failures.Load(); got != 4 {
		t.Errorf("downstream answered %d attempts, want 2 per order", got)
	}

	// The running serve holds the data directory: dlq says how to reach it instead.
	code, _, stderr := runSluice(t, "dlq", "list", "orders", "--data-dir", dataDir)
	if code != 1 || !strings.Contains(stderr, "--admin http://ADDR of its --admin-listen") || !strings.Contains(stderr, "in use by another sluice process") {
		t.Errorf("dlq on a locked data dir: %d %s", code, stderr)
	}

	code, stdout, stderr := runSluice(t, "dlq", "list", "orders", "--nats", natsURL, "--queue-key", key)
	if code != 0 || !strings.Contains(stdout, "TICKET") || !strings.Contains(stdout, a.Ticket) || !strings.Contains(stdout, b.Ticket) {
		t.Fatalf("dlq list: %d\n%s%s", code, stdout, stderr)
	}
	t.Logf("sluice dlq list orders:\n%s", stdout)
	code, stdout, stderr = runSluice(t, "dlq", "list", "--json", "orders", a.Ticket, "--nats", natsURL, "--queue-key", key)
	var listed []queueapi.DeadLetterView
	if code != 0 || json.Unmarshal([]byte(stdout), &listed) != nil || len(listed) != 1 ||
		listed[0].Ticket != a.Ticket || listed[0].Attempts != 2 || listed[0].Queue != "orders" ||
		!strings.Contains(listed[0].Reason, "500") || listed[0].DeadAt.IsZero() || listed[0].Path != "/v1/orders" {
		t.Fatalf("dlq list --json: %d %s %s", code, stdout, stderr)
	}

	// Healthy again: requeue one ticket; it is delivered under its own ticket.
	down.failing.Store(false)
	code, stdout, stderr = runSluice(t, "dlq", "requeue", "orders", a.Ticket, "--nats", natsURL, "--queue-key", key)
	if code != 0 || !strings.Contains(stdout, "requeued 1 dead letters") {
		t.Fatalf("dlq requeue: %d %s %s", code, stdout, stderr)
	}
	st := waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	if st.Result == nil || st.Result.Status != 201 {
		t.Errorf("requeued ticket: %+v", st)
	}
	if _, count, _ := down.snapshot(); count[a.Ticket] != 1 || count[b.Ticket] != 0 {
		t.Errorf("deliveries: %v", count)
	}
	// A ticket that is no dead letter (any more) is an error.
	if code, _, stderr = runSluice(t, "dlq", "requeue", "orders", a.Ticket, "--nats", natsURL, "--queue-key", key); code != 1 || !strings.Contains(stderr, "no dead letter") {
		t.Errorf("requeue of a delivered ticket: %d %s", code, stderr)
	}

	// Purge without --yes asks nothing and does nothing.
	if code, _, stderr = runSluice(t, "dlq", "purge", "orders", "--nats", natsURL, "--queue-key", key); code != 2 || !strings.Contains(stderr, "--yes") {
		t.Errorf("purge without --yes: %d %s", code, stderr)
	}
	if code, stdout, stderr = runSluice(t, "dlq", "purge", "orders", "--yes", "--nats", natsURL, "--queue-key", key); code != 0 || !strings.Contains(stdout, "purged 1 dead letters") {
		t.Errorf("purge: %d %s %s", code, stdout, stderr)
	}
	if st, _ := getStatus(t, p.url, b.Ticket); st.Status != "dead" {
		t.Errorf("purged ticket's status: %+v", st)
	}

	// With serve stopped, dlq starts the embedded server on the data directory itself.
	if code := p.stop(t); code != 0 {
		t.Fatalf("serve exit status %d", code)
	}
	code, stdout, stderr = runSluice(t, "dlq", "list", "orders", "--json", "--data-dir", dataDir)
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("dlq list on the data dir: %d %q %s", code, stdout, stderr)
	}
	if code, _, stderr = runSluice(t, "dlq", "list", "nosuchqueue", "--data-dir", dataDir); code != 1 || !strings.Contains(stderr, "no queue") {
		t.Errorf("unknown queue: %d %s", code, stderr)
	}
}

// (e) One Idempotency-Key: one ticket, one delivery; the same key with another payload
// is 422. A full queue answers 429 with Retry-After.
func TestDeferIdempotencyAndFullQueue(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL)
	warmUp(t, p.url, "/v1/orders")

	body := `{"order":"idem"}`
	var tickets []string
	for i := range 3 {
		r, err := postOrder(p.url, "/v1/orders", "idem", body, "Idempotency-Key", `"order-42"`)
		if err != nil {
			t.Fatal(err)
		}
		a := checkAccepted(t, r)
		if a.Duplicate != (i > 0) {
			t.Errorf("submission %d: duplicate=%v", i, a.Duplicate)
		}
		tickets = append(tickets, a.Ticket)
	}
	if tickets[1] != tickets[0] || tickets[2] != tickets[0] {
		t.Fatalf("one Idempotency-Key, tickets %v", tickets)
	}
	r, err := postOrder(p.url, "/v1/orders", "idem", `{"order":"other"}`, "Idempotency-Key", `"order-42"`)
	if err != nil || r.status != http.StatusUnprocessableEntity || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("same key, other payload: %v %d %s", err, r.status, r.body)
	}
	if r, _ := postOrder(p.url, "/v1/orders", "idem", body, "Idempotency-Key", "bad key with spaces"); r.status != http.StatusBadRequest {
		t.Errorf("malformed key: %d %s", r.status, r.body)
	}
	waitStatus(t, p.url, tickets[0], "done", 30*time.Second)
	// The repeat after delivery still maps to the delivered ticket, not a new order.
	r, _ = postOrder(p.url, "/v1/orders", "idem", body, "Idempotency-Key", `"order-42"`)
	if a := checkAccepted(t, r); a.Ticket != tickets[0] {
		t.Errorf("repeat after delivery: ticket %s, want %s", a.Ticket, tickets[0])
	}
	waitQueueEmpty(t, p.admin, "orders")
	// The downstream receives the client's own key, as sent.
	if _, count, _ := down.snapshot(); len(count) != 1 || count[`"order-42"`] != 1 || down.started.Load() != 1 {
		t.Errorf("downstream: %v in %d requests, want one delivery", count, down.started.Load())
	}

	// tiny holds 2 messages and delivers 1 per hour: the first deferred one goes out at
	// once, two more fill it, and the next is refused.
	warmUp(t, p.url, "/v1/tiny")
	var statuses []int
	var full result
	for i := range 8 {
		r, err := postOrder(p.url, "/v1/tiny", fmt.Sprint("t", i), "{}")
		if err != nil {
			t.Fatal(err)
		}
		statuses = append(statuses, r.status)
		if r.status == http.StatusTooManyRequests {
			full = r
			break
		}
		if r.status != http.StatusAccepted {
			t.Fatalf("tiny %d: %d %s", i, r.status, r.body)
		}
	}
	if full.status != http.StatusTooManyRequests || len(statuses) > 4 {
		t.Fatalf("statuses %v: no 429 once tiny was full", statuses)
	}
	if ra := full.header.Get("Retry-After"); ra == "" || ra == "0" || !strings.Contains(full.body, "full") {
		t.Errorf("full queue: Retry-After %q, body %s", ra, full.body)
	}
	t.Logf("tiny queue: statuses %v, Retry-After %s", statuses, full.header.Get("Retry-After"))
}
