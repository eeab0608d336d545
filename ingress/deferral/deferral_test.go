package deferral

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/openapitest"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/ingress/internal/warn"
	"github.com/sluicehq/sluice/ingress/ticket"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queuetest"
	"github.com/sluicehq/sluice/rules"
)

type deferFixture struct {
	handler  http.Handler
	nats     *natstest.Server
	store    *queue.Store
	deferrer *Deferrer
}

func newDeferFixture(t *testing.T, opts ...Option) *deferFixture {
	t.Helper()
	set, srv, store := parktest.Open(t, parktest.Orders)
	f := newDeferFixtureOn(t, set, store, opts...)
	f.nats = srv
	return f
}

// newDeferFixtureOn is newDeferFixture on a store of the test's own, with set's
// queues declared in it.
func newDeferFixtureOn(t *testing.T, set *rules.Set, store *queue.Store, opts ...Option) *deferFixture {
	t.Helper()
	d := New(store, opts...)
	m := newMiddleware(t, set, ingress.WithDeferrer(d))
	mux := http.NewServeMux()
	mux.Handle("GET "+Path+"{ticket}", d.StatusHandler())
	mux.Handle("/", m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })))
	return &deferFixture{handler: mux, store: store, deferrer: d}
}

func (f *deferFixture) post(body string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest("POST", "/v1/orders?x=1", strings.NewReader(body))
	r.RemoteAddr = "198.51.100.1:1000"
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Add(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

func (f *deferFixture) get(path string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
	return w
}

func TestDeferParksAndAnswers202(t *testing.T) {
	f := newDeferFixture(t)
	if w := f.post(`{"n":0}`); w.Code != http.StatusOK {
		t.Fatalf("within the limit: %d", w.Code)
	}
	w := f.post(`{"n":1}`)
	if w.Code != http.StatusAccepted {
		t.Fatalf("over the limit: %d %s", w.Code, w.Body)
	}
	var acc acceptedBody
	if err := json.Unmarshal(w.Body.Bytes(), &acc); err != nil {
		t.Fatal(err)
	}
	if !queue.ValidTicket(acc.Ticket) || acc.Queue != "orders" || acc.Status != "queued" || acc.Position != 1 {
		t.Fatalf("202 body %+v", acc)
	}
	if _, err := time.Parse(time.RFC3339, acc.EstimatedDelivery); err != nil {
		t.Fatalf("estimated_delivery %q: %v", acc.EstimatedDelivery, err)
	}
	if loc := w.Header().Get("Location"); loc != Path+acc.Ticket {
		t.Fatalf("Location %q", loc)
	}
	// The message is stored: the queue holds it.
	q, _ := f.store.Queue("orders")
	if depth, err := q.Depth(context.Background()); err != nil || depth != 1 {
		t.Fatalf("queue depth %d, %v", depth, err)
	}
	st := f.get(Path + acc.Ticket)
	var status ticket.Status
	if err := json.Unmarshal(st.Body.Bytes(), &status); err != nil || st.Code != 200 {
		t.Fatalf("status %d %s", st.Code, st.Body)
	}
	if status.Status != ticket.Queued || status.Ticket != acc.Ticket || st.Header().Get("Retry-After") == "" {
		t.Fatalf("status %+v, Retry-After %q", status, st.Header().Get("Retry-After"))
	}
	for _, path := range []string{Path + "aaaaaaaaaaaaaaaaaaaaaaaaaa", Path + "nonsense"} {
		if w := f.get(path); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, w.Code)
		}
	}
}

func TestDeferIdempotency(t *testing.T) {
	f := newDeferFixture(t)
	f.post(`{}`) // use up the limit
	first := f.post(`{"order":1}`, "Idempotency-Key", `"order-1"`)
	again := f.post(`{"order":1}`, "Idempotency-Key", `"order-1"`)
	if first.Code != 202 || again.Code != 202 || first.Header().Get("Location") != again.Header().Get("Location") {
		t.Fatalf("same key, same payload: %d %q, %d %q", first.Code, first.Header().Get("Location"), again.Code, again.Header().Get("Location"))
	}
	if w := f.post(`{"order":2}`, "Idempotency-Key", `"order-1"`); w.Code != http.StatusUnprocessableEntity {
		t.Fatalf("same key, other payload: %d, want 422", w.Code)
	}
	for _, bad := range []string{`""`, `"unterminated`, `"a"b"`, "two words", strings.Repeat("k", 256), "\"tab\there\""} {
		if w := f.post(`{}`, "Idempotency-Key", bad); w.Code != http.StatusBadRequest {
			t.Errorf("Idempotency-Key %q: %d, want 400", bad, w.Code)
		}
	}
	if w := f.post(`{}`, "Idempotency-Key", "a", "Idempotency-Key", "b"); w.Code != http.StatusBadRequest {
		t.Errorf("two Idempotency-Key headers: %d, want 400", w.Code)
	}
	q, _ := f.store.Queue("orders")
	if depth, _ := q.Depth(context.Background()); depth != 1 {
		t.Fatalf("queue depth %d, want 1: only one order was accepted", depth)
	}
}

// A tenant whose lane holds tenant_max_depth orders gets a 429 that names that limit,
// not the queue's (which has room); another tenant's order is still taken.
func TestDeferFullTenantLaneNamesTheLimit(t *testing.T) {
	rules := strings.Replace(parktest.Orders, "    max_depth: 3\n", "    max_depth: 100\n    fair_by: header:X-Tenant\n    tenant_max_depth: 2\n", 1)
	set, _, store := parktest.Open(t, rules)
	m := newMiddleware(t, set, ingress.WithDeferrer(New(store)))
	f := &deferFixture{handler: m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })), store: store}
	f.post(`{}`, "X-Tenant", "a")
	for i := range 2 {
		if w := f.post(`{}`, "X-Tenant", "a"); w.Code != http.StatusAccepted {
			t.Fatalf("order %d of tenant a: %d %s", i, w.Code, w.Body)
		}
	}
	w := f.post(`{}`, "X-Tenant", "a")
	var p struct{ Detail string }
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("third order of tenant a: %d %s, Retry-After %q", w.Code, w.Body, w.Header().Get("Retry-After"))
	}
	if !strings.Contains(p.Detail, "tenant's lane") || !strings.Contains(p.Detail, "tenant_max_depth 2") || strings.Contains(p.Detail, "max_depth 100") {
		t.Errorf("the problem does not name the tenant's limit: %q", p.Detail)
	}
	// Tenants hash to lanes: look for one that is not a's.
	for i := range 50 {
		if w := f.post(`{}`, "X-Tenant", fmt.Sprint("b", i)); w.Code == http.StatusAccepted {
			return
		}
	}
	t.Error("no other tenant's order was taken")
}

func TestDeferFullQueueAndNATSDown(t *testing.T) {
	var logs bytes.Buffer
	f := newDeferFixture(t, WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	f.deferrer.unavailable = warn.Every(time.Hour)
	f.post(`{}`)
	for i := range 3 {
		if w := f.post(`{}`); w.Code != 202 {
			t.Fatalf("order %d: %d", i, w.Code)
		}
	}
	w := f.post(`{}`)
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("full queue: %d, Retry-After %q", w.Code, w.Header().Get("Retry-After"))
	}
	if !strings.Contains(w.Body.String(), "holds 3 orders (max_depth 3)") {
		t.Errorf("full queue: the problem does not name the limit: %s", w.Body)
	}
	f.nats.Shutdown()
	for range 20 {
		w = f.post(`{}`)
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
			t.Fatalf("NATS down: %d %s, Retry-After %q", w.Code, w.Body, w.Header().Get("Retry-After"))
		}
	}
	// An outage does not write a line per refused request. The first may be a park
	// not acknowledged: sent on the connection before the client saw it close.
	if n := strings.Count(logs.String(), `msg="deferring failed"`) + strings.Count(logs.String(), `msg="deferring not acknowledged"`); n != 1 {
		t.Errorf("20 refused defers logged %d warnings, want 1:\n%s", n, logs.String())
	}
}

func TestIdempotencyKeySyntax(t *testing.T) {
	cases := []struct {
		in   string
		key  string
		okay bool
	}{
		{`"8e03978e-40d5-43e8-bc93-6894a57f9324"`, "8e03978e-40d5-43e8-bc93-6894a57f9324", true},
		{`"with \"escaped\" quote"`, `with "escaped" quote`, true},
		{`bare-token_1.2`, "bare-token_1.2", true},
		{`""`, "", false},
		{`"\x"`, "", false},
		{"\"caf\xc3\xa9\"", "", false},
		{"a,b", "", false},
	}
	for _, tc := range cases {
		key, ok := idempotencyKey(http.Header{"Idempotency-Key": {tc.in}})
		if key != tc.key && tc.okay || ok != tc.okay {
			t.Errorf("%q: got %q, %v; want %q, %v", tc.in, key, ok, tc.key, tc.okay)
		}
	}
	if key, ok := idempotencyKey(http.Header{}); key != "" || !ok {
		t.Errorf("absent header: %q, %v", key, ok)
	}
}

// What the dispatcher would refuse to deliver is refused before anything is stored:
// 400, and the queue stays empty.
func TestDeferRefusesUndeliverableTargets(t *testing.T) {
	f := newDeferFixture(t)
	f.post(`{}`) // use up the limit
	for _, query := range []string{"x=1\x01", "x=1#frag", "x=a b"} {
		r := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(`{}`))
		r.URL.RawQuery = query
		r.RemoteAddr = "198.51.100.1:1000"
		w := httptest.NewRecorder()
		f.handler.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "cannot be queued") {
			t.Errorf("query %q: %d %s, want 400", query, w.Code, w.Body)
		}
	}
	q, _ := f.store.Queue("orders")
	if depth, err := q.Depth(context.Background()); err != nil || depth != 0 {
		t.Fatalf("queue depth %d, %v: nothing may be stored", depth, err)
	}
}

// DELETE /sluice/v1/deferred/{ticket} on the front door: only a queued order, only with
// its ticket.
func TestCancelHandler(t *testing.T) {
	f := newDeferFixture(t)
	d := New(f.store)
	doc := openapitest.Load(t)
	mux := http.NewServeMux()
	mux.Handle("DELETE "+Path+"{ticket}", d.CancelHandler())
	mux.Handle("GET "+Path+"{ticket}", d.StatusHandler())
	del := func(ticket string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, httptest.NewRequest("DELETE", Path+ticket, nil))
		return w
	}
	const docPath = Path + "{ticket}"
	f.post(`{"n":0}`) // within the limit
	var acc acceptedBody
	if w := f.post(`{"n":1}`); w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &acc) != nil {
		t.Fatalf("defer: %d %s", w.Code, w.Body)
	}
	w := del(acc.Ticket)
	if w.Code != http.StatusNoContent {
		t.Fatalf("cancel: %d %s", w.Code, w.Body)
	}
	doc.Conforms(t, docPath, "DELETE", w)
	st := httptest.NewRecorder()
	mux.ServeHTTP(st, httptest.NewRequest("GET", Path+acc.Ticket, nil))
	if !strings.Contains(st.Body.String(), `"status":"cancelled"`) || st.Header().Get("Retry-After") != "" {
		t.Errorf("status after cancel: %s (Retry-After %q)", st.Body, st.Header().Get("Retry-After"))
	}
	doc.Conforms(t, docPath, "GET", st)
	if w := del(acc.Ticket); w.Code != http.StatusNoContent {
		t.Errorf("cancel again: %d", w.Code)
	}
	// Someone else's ticket cannot be guessed: unknown and malformed tickets are 404.
	for _, ticket := range []string{"unknownticketqqqqqqqqqqqqq", "x", strings.Repeat("a", 27), "..%2F..%2Fx", "AAAAAAAAAAAAAAAAAAAAAAAAAA"} {
		w := del(ticket)
		if w.Code != http.StatusNotFound {
			t.Errorf("cancel %q: %d", ticket, w.Code)
		}
		doc.Conforms(t, docPath, "DELETE", w)
	}
	// A final order: 409.
	var done acceptedBody
	if w := f.post(`{"n":2}`); w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &done) != nil {
		t.Fatalf("defer: %d %s", w.Code, w.Body)
	}
	q, _ := f.store.Queue("orders")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := queuetest.Settle(sctx, q, queuetest.Done(sctx, nil), done.Ticket); err != nil {
		t.Fatal(err)
	}
	w = del(done.Ticket)
	if w.Code != http.StatusConflict || !regexp.MustCompile(`done`).MatchString(w.Body.String()) {
		t.Errorf("cancel a done order: %d %s", w.Code, w.Body)
	}
	doc.Conforms(t, docPath, "DELETE", w)
}

// loaded is a store source that has store open already.
