package queueapi

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/internal/openapitest"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/queuetest"
)

type queueAPIFixture struct {
	t       *testing.T
	nats    *natstest.Server
	store   *queue.Store
	handler http.Handler
	admin   *ingress.Admin
	doc     *openapitest.Doc
}

func newQueueAPIFixture(t *testing.T) *queueAPIFixture {
	t.Helper()
	set := parktest.Rules(t, parktest.Orders) // what the admin listener shows (GET /sluice/v1/rules)
	orders := queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1"}
	idle := orders
	idle.Name = "idle"
	srv, store := parktest.Store(t, orders, idle)
	reg := prometheus.NewRegistry()
	a := &ingress.Admin{Gatherer: reg, Rules: ingress.StaticRules{S: set}, Token: "tok", Queues: &API{Store: loaded(store)}}
	return &queueAPIFixture{t: t, nats: srv, store: store, handler: a.Handler(), admin: a, doc: openapitest.Load(t)}
}

func (f *queueAPIFixture) do(method, target, body, token string) *httptest.ResponseRecorder {
	var r *http.Request
	if body == "" {
		r = httptest.NewRequest(method, target, nil)
	} else {
		r = httptest.NewRequest(method, target, strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

// Every route of the admin listener is in the OpenAPI document, and every admin path
// of the document is a route.
func TestOpenAPIRoutes(t *testing.T) {
	f := newQueueAPIFixture(t)
	var routes []string
	for _, rt := range f.admin.Routes() {
		method, path := openapitest.PatternPath(rt.Pattern)
		if _, ok := f.doc.Paths[path][strings.ToLower(method)]; !ok {
			t.Errorf("route %s is not in openapi.json", rt.Pattern)
		}
		routes = append(routes, strings.ToLower(method)+" "+path)
	}
	for path, ops := range f.doc.Paths {
		if strings.HasPrefix(path, deferral.Path) {
			continue // front door
		}
		for method := range ops {
			if method == "parameters" {
				continue
			}
			if !slices.Contains(routes, method+" "+path) {
				t.Errorf("openapi.json documents %s %s, which the admin listener does not serve", method, path)
			}
		}
	}
	w := f.do("GET", ingress.OpenAPIPath, "", "tok")
	if w.Code != 200 || !json.Valid(w.Body.Bytes()) {
		t.Errorf("GET %s: %d", ingress.OpenAPIPath, w.Code)
	}
}

// Without the token every route but /healthz answers 401.
func TestQueueAPINeedsToken(t *testing.T) {
	f := newQueueAPIFixture(t)
	for _, rt := range f.admin.Routes() {
		method, path := openapitest.PatternPath(rt.Pattern)
		path = strings.ReplaceAll(path, "{queue}", "orders")
		for _, token := range []string{"", "wrong", "tok "} {
			w := f.do(method, path+"?confirm=true&all=true", `{"all":true}`, token)
			if path == "/healthz" {
				if w.Code != 200 {
					t.Errorf("%s without token: %d", rt.Pattern, w.Code)
				}
				continue
			}
			// Past ingress.MaxWrongTokens wrong ones this address is locked out: 429.
			unauthorized := w.Code == http.StatusUnauthorized && w.Header().Get("WWW-Authenticate") != ""
			lockedOut := token != "" && w.Code == http.StatusTooManyRequests && w.Header().Get("Retry-After") != ""
			if !unauthorized && !lockedOut {
				t.Errorf("%s with token %q: %d, want 401 (or 429 once locked out)", rt.Pattern, token, w.Code)
			}
		}
	}
	// Nothing was done by those requests.
	q, _ := f.store.Queue("orders")
	if in, err := q.Info(context.Background()); err != nil || !in.PausedUntil.IsZero() {
		t.Errorf("unauthorized requests changed the queue: %+v %v", in, err)
	}
}

// The real responses of every handler, successes and failures, match the document.
func TestQueueAPIResponses(t *testing.T) {
	f := newQueueAPIFixture(t)
	ctx := context.Background()
	q, _ := f.store.Queue("orders")
	// Two dead letters and one queued order; the dispatchers' consumer exists.
	var tickets []string
	for range 3 {
		rc, err := f.store.Park(ctx, &queue.Request{Queue: "orders", Method: "POST", Path: "/v1/orders", Body: []byte("{}")})
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, rc.Ticket)
	}
	dead := tickets[:2]
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := queuetest.Settle(sctx, q, func(l *queue.Lease) error { return l.Dead(sctx, "downstream answered 500", time.Second) }, dead...); err != nil {
		t.Fatal(err)
	}

	const (
		pQueues  = "/sluice/v1/queues"
		pQueue   = "/sluice/v1/queues/{queue}"
		pPause   = "/sluice/v1/queues/{queue}/pause"
		pResume  = "/sluice/v1/queues/{queue}/resume"
		pRetire  = "/sluice/v1/queues/{queue}/retire"
		pDead    = "/sluice/v1/queues/{queue}/dead"
		pRequeue = "/sluice/v1/queues/{queue}/dead/requeue"
	)
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	cases := []struct {
		name, method, doc, target, body string
		want                            int
		contains                        string
	}{
		{"list", "GET", pQueues, "/sluice/v1/queues", "", 200, `"name": "orders"`},
		{"show", "GET", pQueue, "/sluice/v1/queues/orders", "", 200, `"depth": 1`},
		{"show unknown", "GET", pQueue, "/sluice/v1/queues/nosuch", "", 404, ""},
		{"show path trick", "GET", pQueue, "/sluice/v1/queues/..%2F..%2Fmetrics", "", 404, ""},
		{"show dotted", "GET", pQueue, "/sluice/v1/queues/a.b", "", 404, ""},
		{"show wildcard", "GET", pQueue, "/sluice/v1/queues/%3E", "", 404, ""},
		{"pause for", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"15m"}`, 200, `"paused_until"`},
		{"pause until query", "POST", pPause, "/sluice/v1/queues/orders/pause?until=" + future, "", 200, `"paused_until"`},
		{"pause neither", "POST", pPause, "/sluice/v1/queues/orders/pause", `{}`, 400, "exactly one"},
		{"pause both", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"1m","until":"` + future + `"}`, 400, "exactly one"},
		{"pause bad duration", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"soon"}`, 400, "positive duration"},
		{"pause negative", "POST", pPause, "/sluice/v1/queues/orders/pause?for=-5m", "", 400, "positive duration"},
		{"pause forever", "POST", pPause, "/sluice/v1/queues/orders/pause?for=100000h", "", 400, "positive duration"},
		{"pause overflow", "POST", pPause, "/sluice/v1/queues/orders/pause?for=9999999999999999h", "", 400, "positive duration"},
		{"pause past", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"until":"2001-01-01T00:00:00Z"}`, 400, "future"},
		{"pause bad time", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"until":"tomorrow"}`, 400, "RFC 3339"},
		{"pause malformed", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":`, 400, "not the expected JSON"},
		{"pause not object", "POST", pPause, "/sluice/v1/queues/orders/pause", `[1,2]`, 400, "not the expected JSON"},
		{"pause unknown field", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"1m","rm":"-rf"}`, 400, "unknown field"},
		{"pause trailing", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"1m"}{"for":"2m"}`, 400, "trailing"},
		{"pause huge", "POST", pPause, "/sluice/v1/queues/orders/pause", `{"for":"` + strings.Repeat("9", 2<<20) + `"}`, 413, ""},
		{"pause unknown queue", "POST", pPause, "/sluice/v1/queues/nosuch/pause", `{"for":"1m"}`, 404, ""},
		{"pause no dispatcher", "POST", pPause, "/sluice/v1/queues/idle/pause", `{"for":"1m"}`, 409, "no dispatcher"},
		{"resume", "POST", pResume, "/sluice/v1/queues/orders/resume", "", 200, `"orphaned": false`},
		{"resume unknown", "POST", pResume, "/sluice/v1/queues/..%2f/resume", "", 404, ""},
		{"retire declared", "POST", pRetire, "/sluice/v1/queues/orders/retire", "", 409, "rules"},
		{"retire unknown", "POST", pRetire, "/sluice/v1/queues/nosuch/retire", "", 404, ""},
		{"retire trick", "POST", pRetire, "/sluice/v1/queues/%2e%2e%2fKV_sluice_tickets/retire", "", 404, ""},
		{"retire bad drop", "POST", pRetire, "/sluice/v1/queues/orders/retire?drop=please", "", 400, "true or false"},
		{"dead list", "GET", pDead, "/sluice/v1/queues/orders/dead", "", 200, dead[0]},
		{"dead limit", "GET", pDead, "/sluice/v1/queues/orders/dead?limit=1", "", 200, dead[0]},
		{"dead bad limit", "GET", pDead, "/sluice/v1/queues/orders/dead?limit=-1", "", 400, "limit"},
		{"dead huge limit", "GET", pDead, "/sluice/v1/queues/orders/dead?limit=99999999999999999999", "", 400, "limit"},
		{"dead unknown queue", "GET", pDead, "/sluice/v1/queues/nosuch/dead", "", 404, ""},
		{"requeue nothing", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue", "", 400, "all"},
		{"requeue bad ticket", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue", `{"tickets":["../x"]}`, 400, "Not a ticket"},
		{"requeue both", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue", `{"tickets":["` + dead[0] + `"],"all":true}`, 400, "not both"},
		{"requeue too many", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue", `{"tickets":[` + strings.Repeat(`"`+dead[0]+`",`, maxTickets) + `"` + dead[0] + `"]}`, 413, ""},
		{"requeue unknown ticket", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue", `{"tickets":["` + unknownTicket + `"]}`, 404, ""},
		{"requeue one", "POST", pRequeue, "/sluice/v1/queues/orders/dead/requeue?ticket=" + dead[0], "", 200, `"requeued": 1`},
		{"purge no confirm", "DELETE", pDead, "/sluice/v1/queues/orders/dead?all=true", "", 400, "confirm=true"},
		{"purge bad confirm", "DELETE", pDead, "/sluice/v1/queues/orders/dead?confirm=yes&all=true", "", 400, "true or false"},
		{"purge nothing", "DELETE", pDead, "/sluice/v1/queues/orders/dead?confirm=true", "", 400, "all"},
		{"purge one", "DELETE", pDead, "/sluice/v1/queues/orders/dead?confirm=true", `{"tickets":["` + dead[1] + `"]}`, 200, `"purged": 1`},
		{"purge all (none left)", "DELETE", pDead, "/sluice/v1/queues/orders/dead?confirm=true&all=true", "", 200, `"purged": 0`},
		{"purge unknown queue", "DELETE", pDead, "/sluice/v1/queues/nosuch/dead?confirm=true&all=true", "", 404, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := f.do(tc.method, tc.target, tc.body, "tok")
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.contains) {
				t.Fatalf("%s %s: %d %.300s, want %d containing %q", tc.method, tc.target, w.Code, w.Body, tc.want, tc.contains)
			}
			f.doc.Conforms(t, tc.doc, tc.method, w)
		})
	}
	// The pause of "pause until" then the resume really reached the server.
	if in, err := q.Info(ctx); err != nil || !in.PausedUntil.IsZero() {
		t.Errorf("after resume: %+v %v", in, err)
	}
	// Orphan, retire.
	if _, err := f.store.AdoptOrphans(ctx, []string{"orders"}); err != nil {
		t.Fatal(err)
	}
	w := f.do("GET", "/sluice/v1/queues/idle", "", "tok")
	if !strings.Contains(w.Body.String(), `"orphaned": true`) {
		t.Errorf("orphaned queue: %s", w.Body)
	}
	w = f.do("POST", "/sluice/v1/queues/idle/retire", "", "tok")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"retired": "idle"`) {
		t.Errorf("retire: %d %s", w.Code, w.Body)
	}
	f.doc.Conforms(t, pRetire, "POST", w)
	// The other admin endpoints match the document too.
	for _, path := range []string{"/readyz", "/sluice/v1/rules", "/metrics", "/healthz"} {
		f.doc.Conforms(t, path, "GET", f.do("GET", path, "", "tok"))
	}
}

func loaded(store *queue.Store) *atomic.Pointer[queue.Store] {
	var p atomic.Pointer[queue.Store]
	p.Store(store)
	return &p
}

// TestQueueAPIWithoutStore: every endpoint answers 503 with Retry-After until there is
// a store, also when API.Store was never set (never a panic).
func TestQueueAPIWithoutStore(t *testing.T) {
	var pending atomic.Pointer[queue.Store]
	for _, a := range []*API{{}, {Store: &pending}} {
		for _, rt := range a.Routes() {
			method, path := openapitest.PatternPath(rt.Pattern)
			path = strings.ReplaceAll(path, "{queue}", "orders")
			w := httptest.NewRecorder()
			rt.Handler.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(`{"all":true}`)))
			if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
				t.Errorf("%s with store %v: %d (Retry-After %q), want 503", rt.Pattern, a.Store, w.Code, w.Header().Get("Retry-After"))
			}
		}
	}
}

// unknownTicket has a ticket's shape and was never parked.
const unknownTicket = "unknownticketqqqqqqqqqqqqq"
