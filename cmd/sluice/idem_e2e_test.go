package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// End-to-end tests of idempotency scoping, the downstream's view of deferred orders
// (keys, forwarding headers) and bounded keys, through the real binary and its
// embedded NATS.

// recorder is a downstream (and upstream) that keeps every request it receives and
// answers with a session cookie and an internal header, which must never reach a
// ticket's monitor.
type recorder struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
}

type seen struct {
	order  string
	header http.Header
	body   string
}

func newRecorder(t *testing.T) *recorder {
	rc := &recorder{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, seen{r.Header.Get("X-Order"), r.Header.Clone(), string(b)})
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "session=downstream-secret; HttpOnly")
		w.Header().Set("X-Internal-Host", "db-7.internal")
		w.Header().Set("X-Order-Id", "oid-"+r.Header.Get("X-Order"))
		fmt.Fprintf(w, `{"order":%q,"caller":%q}`, r.Header.Get("X-Order"), r.Header.Get("Authorization"))
	}))
	t.Cleanup(rc.Close)
	return rc
}

// of returns the requests received for an order (X-Order).
func (rc *recorder) of(order string) []seen {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	var out []seen
	for _, s := range rc.reqs {
		if s.order == order {
			out = append(out, s)
		}
	}
	return out
}

func (rc *recorder) waitOrder(t *testing.T, order string, n int) []seen {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d requests of order %s", n, order), 30*time.Second, func() bool { return len(rc.of(order)) >= n })
	return rc.of(order)
}

// idemRules defers every POST /v1/orders beyond the first to orders; /v1/small defers
// to small, which holds 2 orders and accepts 2 keys per client.
func idemRules(down string) string {
	return fmt.Sprintf(`
domain: e2e-idem
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    algorithm: token_bucket
    on_limit: defer
    queue: orders
  - key: route
    value: small
    rate_limit: {unit: hour, requests_per_unit: 1, name: small}
    algorithm: token_bucket
    on_limit: defer
    queue: small
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
  - name: small
    match: {method: [POST], path: /v1/small}
    idempotency_scope: [header:X-Api-Key]
    descriptors:
      - [{key: route, value: small}]
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: %s
    result_headers: [X-Order-Id]
  small:
    outflow: {unit: hour, requests_per_unit: 1}
    max_depth: 3
    max_idempotency_keys: 2
    downstream: %s
`, down, down)
}

// Two callers behind one address (different Authorization) with the same
// Idempotency-Key: two tickets, two deliveries, each sees only its own result; with
// another body no 422 across callers, a 422 within one.
func TestIdempotencyScopedByCaller(t *testing.T) {
	t.Parallel()
	down := newRecorder(t)
	p := startSluice(t, "--rules", writeRules(t, t.TempDir(), idemRules(down.URL)), "--upstream", down.URL)
	warmUp(t, p.url, "/v1/orders")

	body := `{"sku":1}`
	post := func(auth, order, body string) result {
		r, err := postOrder(p.url, "/v1/orders", order, body, "Idempotency-Key", `"shared-1"`, "Authorization", auth)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	alice := checkAccepted(t, post("Bearer alice", "a1", body))
	bob := checkAccepted(t, post("Bearer bob", "b1", body))
	if alice.Ticket == bob.Ticket || bob.Duplicate {
		t.Fatalf("two callers, one key: tickets %s and %s (duplicate %v)", alice.Ticket, bob.Ticket, bob.Duplicate)
	}
	if r := post("Bearer carol", "c1", `{"sku":2}`); r.status != http.StatusAccepted {
		t.Fatalf("another caller, same key, other body: %d %s", r.status, r.body)
	}
	if r := post("Bearer alice", "a1", `{"sku":2}`); r.status != http.StatusUnprocessableEntity {
		t.Fatalf("same caller, same key, other body: %d %s", r.status, r.body)
	}
	if again := checkAccepted(t, post("Bearer alice", "a1", body)); again.Ticket != alice.Ticket || !again.Duplicate {
		t.Fatalf("same caller repeats: %+v, want ticket %s", again, alice.Ticket)
	}
	for _, c := range []struct{ ticket, auth string }{{alice.Ticket, "Bearer alice"}, {bob.Ticket, "Bearer bob"}} {
		st := waitStatus(t, p.url, c.ticket, "done", 30*time.Second)
		if st.Result == nil || !strings.Contains(st.Result.Body, c.auth) {
			t.Errorf("ticket %s: result %+v, want the answer to %s", c.ticket, st.Result, c.auth)
		}
	}
	if n, m := len(down.of("a1")), len(down.of("b1")); n != 1 || m != 1 {
		t.Errorf("deliveries: alice %d, bob %d; want 1 each", n, m)
	}
	// A repeat of a delivered order says done.
	r := post("Bearer alice", "a1", body)
	var a struct{ Ticket, Status string }
	if r.status != http.StatusAccepted || json.Unmarshal([]byte(r.body), &a) != nil || a.Ticket != alice.Ticket || a.Status != "done" {
		t.Errorf("repeat of a done order: %d %s", r.status, r.body)
	}
}

// The downstream of a deferred order sees what it would have seen proxied: the
// client's own Idempotency-Key, the ticket as Sluice-Ticket, forwarding headers from
// the real connection (forged ones from an untrusted peer dropped). The monitor keeps
// only allow-listed response headers, never Set-Cookie.
func TestDeferredRequestAsProxied(t *testing.T) {
	t.Parallel()
	down := newRecorder(t)
	p := startSluice(t, "--rules", writeRules(t, t.TempDir(), idemRules(down.URL)), "--upstream", down.URL)
	forged := []string{"X-Forwarded-For", "6.6.6.6", "Forwarded", "for=6.6.6.6;host=admin.internal",
		"X-Forwarded-Host", "admin.internal", "X-Forwarded-Proto", "https", "Idempotency-Key", `"order-77"`}
	// The first is proxied, its retry deferred: one order, one key downstream.
	for range 2 {
		if r, err := postOrder(p.url, "/v1/orders", "o77", `{"sku":77}`, forged...); err != nil || (r.status != 200 && r.status != 202) {
			t.Fatalf("%v %d %s", err, r.status, r.body)
		}
	}
	got := down.waitOrder(t, "o77", 2)
	host := strings.TrimPrefix(p.url, "http://")
	for i, s := range got {
		if k := s.header.Get("Idempotency-Key"); k != `"order-77"` {
			t.Errorf("request %d: Idempotency-Key %q, want the client's %q", i, k, `"order-77"`)
		}
		if xff := s.header.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != "127.0.0.1" {
			t.Errorf("request %d: X-Forwarded-For %q", i, xff)
		}
		if f := s.header.Values("Forwarded"); len(f) != 0 {
			t.Errorf("request %d: forged Forwarded %q reached the downstream", i, f)
		}
		if h, pr := s.header.Get("X-Forwarded-Host"), s.header.Get("X-Forwarded-Proto"); h != host || pr != "http" {
			t.Errorf("request %d: X-Forwarded-Host %q, -Proto %q; want %q, http", i, h, pr, host)
		}
	}
	if tk := got[1].header.Get("Sluice-Ticket"); !queue.ValidTicket(tk) {
		t.Fatalf("deferred delivery without Sluice-Ticket: %v", got[1].header)
	}
	st, r := getStatus(t, p.url, got[1].header.Get("Sluice-Ticket"))
	st = waitStatus(t, p.url, st.Ticket, "done", 30*time.Second)
	h := st.Result.Headers
	if h.Get("Set-Cookie") != "" || h.Get("X-Internal-Host") != "" || strings.Contains(r.body, "downstream-secret") {
		t.Errorf("monitor shows headers off the allow-list: %v", h)
	}
	if h.Get("Content-Type") != "application/json" || h.Get("X-Order-Id") != "oid-o77" {
		t.Errorf("monitor lost allow-listed headers: %v", h)
	}
	// A deferred order without a key gets its ticket as the key.
	if a := mustDefer(t, p.url, "/v1/orders", "nokey"); true {
		s := down.waitOrder(t, "nokey", 1)[0]
		if s.header.Get("Idempotency-Key") != a.Ticket || s.header.Get("Sluice-Ticket") != a.Ticket {
			t.Errorf("no client key: Idempotency-Key %q, Sluice-Ticket %q, ticket %s",
				s.header.Get("Idempotency-Key"), s.header.Get("Sluice-Ticket"), a.Ticket)
		}
	}
}

// Keys are bounded: refused requests leave none (2,000 distinct keys against a full
// queue leave only the accepted orders' keys), a refused key works again, and a client
// past max_idempotency_keys gets 429 while another is unaffected.
func TestIdempotencyKeysBounded(t *testing.T) {
	t.Parallel()
	down := newRecorder(t)
	natsAddr := freeAddr(t)
	p := startSluice(t, "--rules", writeRules(t, t.TempDir(), idemRules(down.URL)), "--upstream", down.URL,
		"--nats-listen", natsAddr, "--nats-listen-token", testNATSToken, "--max-body", "1000")
	warmUp(t, p.url, "/v1/small")

	post := func(key, apiKey, body string) result {
		r, err := postOrder(p.url, "/v1/small", key, body, "Idempotency-Key", key, "X-Api-Key", apiKey)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Too large: 413, no key; the corrected body with the same key is accepted.
	if r := post("fix-me", "k1", strings.Repeat("x", 2000)); r.status != http.StatusRequestEntityTooLarge {
		t.Fatalf("large body: %d %s", r.status, r.body)
	}
	checkAccepted(t, post("fix-me", "k1", "{}"))
	// Second key of k1: accepted. Third: 429, max_idempotency_keys says why.
	checkAccepted(t, post("second", "k1", "{}"))
	r := post("third", "k1", "{}")
	if r.status != http.StatusTooManyRequests || !strings.Contains(r.body, "max_idempotency_keys") || r.header.Get("Retry-After") == "" {
		t.Fatalf("past the key cap: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	// Another client is unaffected; it fills the queue (3 orders, one of which may be
	// delivering already).
	statuses := map[int]int{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 2000; i += 8 {
				r, err := postOrder(p.url, "/v1/small", "flood", "{}", "Idempotency-Key", fmt.Sprint("flood-", i), "X-Api-Key", fmt.Sprint("k-", i%4+2))
				mu.Lock()
				if err != nil {
					statuses[-1]++
				} else {
					statuses[r.status]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("2000 requests with distinct keys against a full queue: %v", statuses)
	if statuses[http.StatusAccepted] > 2 || statuses[http.StatusTooManyRequests] < 1990 {
		t.Errorf("statuses %v", statuses)
	}
	// Counted while serve runs: the slots are in memory (see queue.Store.keyStream).
	slots, keys := storedKeys(t, "nats://"+testNATSToken+"@"+natsAddr, "small")
	if want := 2 + statuses[http.StatusAccepted]; slots != want || keys > want {
		t.Errorf("%d key slots and %d idempotency keys stored, want %d slots (one per accepted order) and at most as many keys (one per final order)", slots, keys, want)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("serve exit %d", code)
	}
}

// storedKeys counts, on the NATS server at url, the key slots of a queue (one per
// accepted order with a key) and the live keys of the idempotency bucket (one per such
// order that is final).
func storedKeys(t *testing.T, url, queueName string) (slots, keys int) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, _ := jetstream.New(nc)
	st, err := js.Stream(ctx, queue.KeyStreamName(queueName))
	if err != nil {
		t.Fatal(err)
	}
	slots = int(st.CachedInfo().State.Msgs)
	kv, err := js.KeyValue(ctx, queue.IdempotencyBucket)
	if err != nil {
		t.Fatal(err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range lister.Keys() {
		keys++
	}
	return slots, keys
}
