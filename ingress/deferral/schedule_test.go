package deferral

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/openapitest"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/ingress/ticket"
	"github.com/sluicehq/sluice/queue"
)

const scheduleRules = `
domain: shop
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 100, name: orders}
    on_limit: defer
    queue: orders
  - key: route
    value: ping
    rate_limit: {unit: hour, requests_per_unit: 100, name: ping}
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
  - name: ping
    match: {path: /v1/ping}
    descriptors:
      - [{key: route, value: ping}]
queues:
  orders:
    outflow: {rate: 10/s}
    downstream: http://127.0.0.1:1
    max_delay: 1h
`

// TestScheduledThroughIngress: a request with Sluice-Not-Before is parked although it
// is within its limit, answered 202 "scheduled" with its due time, followed as
// scheduled (due time, seconds until then) and cancelled while it waits; the header is
// not stored for the downstream. Malformed values and times beyond max_delay are 400,
// the bound named; on a route without a queue the header is refused.
func TestScheduledThroughIngress(t *testing.T) {
	set, srv, store := parktest.Open(t, scheduleRules)
	d := New(store)
	m := newMiddleware(t, set, ingress.WithDeferrer(d))
	mux := http.NewServeMux()
	mux.Handle("GET "+Path+"{ticket}", d.StatusHandler())
	mux.Handle("DELETE "+Path+"{ticket}", d.CancelHandler())
	mux.Handle("/", m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) })))
	doc := openapitest.Load(t)
	do := func(method, path string, notBefore ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, path, strings.NewReader(`{"n":1}`))
		r.RemoteAddr = "198.51.100.1:1000"
		for _, v := range notBefore {
			r.Header.Add(ingress.HeaderNotBefore, v)
		}
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}

	start := time.Now()
	w := do("POST", "/v1/orders", "600")
	var acc acceptedBody
	if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &acc) != nil {
		t.Fatalf("scheduled within the limit: %d %s", w.Code, w.Body)
	}
	nb, err := time.Parse(time.RFC3339, acc.NotBefore)
	if err != nil || acc.Status != "scheduled" || nb.Before(start.Add(600*time.Second-time.Second)) || acc.EstimatedDelivery != acc.NotBefore {
		t.Fatalf("202 body %+v (%v)", acc, err)
	}
	st := do("GET", Path+acc.Ticket)
	var status ticket.Status
	if st.Code != 200 || json.Unmarshal(st.Body.Bytes(), &status) != nil {
		t.Fatalf("status %d %s", st.Code, st.Body)
	}
	if status.Status != ticket.Scheduled || status.NotBefore == nil || !status.NotBefore.Equal(nb) ||
		status.DueIn == nil || *status.DueIn < 500 || *status.DueIn > 601 {
		t.Fatalf("status %s", st.Body)
	}
	doc.Conforms(t, Path+"{ticket}", "GET", st)
	raw, err := srv.Stream(t, queue.StreamName("orders")).GetLastMsgForSubject(context.Background(), "sluice.s.orders."+acc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if v := raw.Header.Get(queue.HeaderPrefix + ingress.HeaderNotBefore); v != "" {
		t.Errorf("the client's %s is kept for the downstream: %q", ingress.HeaderNotBefore, v)
	}
	if w := do("DELETE", Path+acc.Ticket); w.Code != http.StatusNoContent {
		t.Fatalf("cancel while scheduled: %d %s", w.Code, w.Body)
	}
	if st := do("GET", Path+acc.Ticket); !strings.Contains(st.Body.String(), `"status":"cancelled"`) {
		t.Fatalf("status after cancel: %s", st.Body)
	}

	at := time.Now().Add(30 * time.Minute).UTC().Format(http.TimeFormat)
	if w := do("POST", "/v1/orders", at); w.Code != http.StatusAccepted || !strings.Contains(w.Body.String(), `"scheduled"`) {
		t.Fatalf("HTTP-date: %d %s", w.Code, w.Body)
	}
	w = do("POST", "/v1/orders", "7200")
	if w.Code != http.StatusBadRequest || !strings.Contains(w.Body.String(), "3600 s") {
		t.Fatalf("beyond max_delay: %d %s", w.Code, w.Body)
	}
	for _, bad := range [][]string{{"soon"}, {"-5"}, {""}, {"1.5"}, {"60", "60"}} {
		if w := do("POST", "/v1/orders", bad...); w.Code != http.StatusBadRequest {
			t.Errorf("%s %q: %d, want 400", ingress.HeaderNotBefore, bad, w.Code)
		}
	}
	if w := do("GET", "/v1/ping", "60"); w.Code != http.StatusBadRequest {
		t.Errorf("on a route without a queue: %d %s", w.Code, w.Body)
	}
	q, _ := store.Queue("orders")
	if depth, err := q.Depth(context.Background()); err != nil || depth != 1 {
		t.Fatalf("depth %d (%v), want only the HTTP-date order", depth, err)
	}
}

func TestParseNotBefore(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   []string
		want time.Time
		ok   bool
	}{
		{nil, time.Time{}, true},
		{[]string{"0"}, now, true},
		{[]string{" 90 "}, now.Add(90 * time.Second), true},
		{[]string{"Mon, 30 Nov 2026 13:00:00 GMT"}, now.Add(time.Hour), true},
		{[]string{"Monday, 30-Nov-26 13:00:00 GMT"}, now.Add(time.Hour), true},
		{[]string{"99999999999999999999999"}, now.Add(time.Duration(maxNotBeforeSeconds) * time.Second), true},
		{[]string{"-1"}, time.Time{}, false},
		{[]string{"1e3"}, time.Time{}, false},
		{[]string{""}, time.Time{}, false},
		{[]string{"2026-11-30T13:00:00Z"}, time.Time{}, false},
		{[]string{"1", "2"}, time.Time{}, false},
	} {
		got, ok := ParseNotBefore(tc.in, now)
		if ok != tc.ok || !got.Equal(tc.want) {
			t.Errorf("ParseNotBefore(%q) = %s, %v; want %s, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

func FuzzParseNotBefore(f *testing.F) {
	for _, s := range []string{"0", "600", "Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT",
		"Sun Nov  6 08:49:37 1994", "99999999999999999999", "-1", "", "x"} {
		f.Add(s)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, s string) {
		got, ok := ParseNotBefore([]string{s}, now)
		if !ok {
			return
		}
		// A delay is never negative, nor beyond the clamp.
		if strings.Trim(strings.TrimSpace(s), "0123456789") == "" &&
			(got.Before(now) || got.After(now.Add(time.Duration(maxNotBeforeSeconds)*time.Second))) {
			t.Fatalf("%q: %s", s, got)
		}
	})
}

const scheduleLanesRules = `
domain: shop
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    priority: {from: "header:X-Priority", default: normal}
    descriptors:
      - [{key: route, value: orders}]
queues:
  orders:
    outflow: {rate: 10/s}
    downstream: http://127.0.0.1:1
    max_delay: 1h
    priorities: {levels: [high, normal], default: normal}
    fair_by: header:X-Tenant
    fair_lanes: 8
`

// TestScheduledKeepsItsLane: a scheduled order waits for its due time in the lane of
// its priority and tenant, whether its request was within its limit (parked because
// it asked for a time) or over it (deferred). Within the limit it went to the
// default level's lane of the empty tenant: its priority and tenant were lost.
func TestScheduledKeepsItsLane(t *testing.T) {
	set, srv, store := parktest.Open(t, scheduleLanesRules)
	m := newMiddleware(t, set, ingress.WithDeferrer(New(store)))
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	st := srv.Stream(t, queue.StreamName("orders"))
	// The first request is within the limit of 1 an hour, the second over it.
	var lanes []string
	for _, what := range []string{"within the limit", "over the limit"} {
		r := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(`{"n":1}`))
		r.RemoteAddr = "198.51.100.1:1000"
		r.Header.Set(ingress.HeaderNotBefore, "600")
		r.Header.Set("X-Priority", "high")
		r.Header.Set("X-Tenant", "acme")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		var acc acceptedBody
		if w.Code != http.StatusAccepted || json.Unmarshal(w.Body.Bytes(), &acc) != nil || acc.Status != "scheduled" {
			t.Fatalf("%s: %d %s", what, w.Code, w.Body)
		}
		raw, err := st.GetLastMsgForSubject(context.Background(), "sluice.s.orders."+acc.Ticket)
		if err != nil {
			t.Fatal(err)
		}
		lanes = append(lanes, raw.Header.Get(queue.HeaderLane))
	}
	if !strings.HasPrefix(lanes[1], "p0t") {
		t.Fatalf("over the limit: lane %q, want one of the level high (p0)", lanes[1])
	}
	if lanes[0] != lanes[1] {
		t.Errorf("within the limit the scheduled order waits for lane %q; over it for %q (priority high, tenant acme)", lanes[0], lanes[1])
	}
}

// TestScheduledOnAnUnroutedPath: a request asking for a delivery time on a path no
// route matches cannot be scheduled, like one on a route whose rules defer into no
// queue: 400, and the upstream does not see it. It was proxied at once, the
// Sluice-Not-Before header with it: delivered before the time it asked for.
func TestScheduledOnAnUnroutedPath(t *testing.T) {
	set, _, store := parktest.Open(t, scheduleRules)
	m := newMiddleware(t, set, ingress.WithDeferrer(New(store)))
	var reached []string
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached = append(reached, r.URL.Path+" "+r.Header.Get(ingress.HeaderNotBefore))
		w.WriteHeader(200)
	}))
	for _, path := range []string{"/v1/ping", "/v1/elsewhere"} {
		r := httptest.NewRequest("POST", path, strings.NewReader(`{"n":1}`))
		r.RemoteAddr = "198.51.100.1:1000"
		r.Header.Set(ingress.HeaderNotBefore, "600")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusBadRequest {
			t.Errorf("POST %s with %s: %d %s; want 400", path, ingress.HeaderNotBefore, w.Code, w.Body)
		}
	}
	if len(reached) != 0 {
		t.Errorf("the upstream was called at once: %q", reached)
	}
}
