package deferral

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/queue"
)

const checkRules = `
domain: shop
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    on_limit: defer
    queue: orders
  - key: route
    value: pay
    rate_limit: {unit: hour, requests_per_unit: 1, name: pay}
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_client}
  - key: route
    value: later
    rate_limit: {unit: hour, requests_per_unit: 100, name: later}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
  - name: ip
    match: {path: /v1/ip}
    descriptors:
      - [{key: client, from: client_ip}]
  - name: pay
    match: {path: /v1/pay}
    descriptors:
      - [{key: route, value: pay}]
  - name: later
    match: {method: [POST], path: /v1/later}
    descriptors:
      - [{key: route, value: later}]
queues:
  orders:
    outflow: {rate: 10/s}
    max_depth: 3
    downstream: http://127.0.0.1:1
`

// checkServer serves CheckHandler on loopback, its clients trusted as proxies only
// when trusted says so.
func checkServer(t *testing.T, trusted bool) (*httptest.Server, *queue.Store) {
	t.Helper()
	set, _, store := parktest.Open(t, checkRules)
	var proxies []string
	if trusted {
		proxies = []string{"127.0.0.0/8"}
	}
	ids, err := ingress.NewClientIdentity(proxies, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := newMiddleware(t, set, ingress.WithClientIdentity(ids), ingress.WithDeferrer(New(store)))
	ts := httptest.NewServer(m.CheckHandler())
	t.Cleanup(ts.Close)
	return ts, store
}

func askCheck(t *testing.T, ts *httptest.Server, method, body string, headers ...string) (*http.Response, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, ts.URL+ingress.CheckPath, rd)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := ts.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if len(b) > 0 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%d %q: %v", resp.StatusCode, b, err)
		}
	}
	return resp, out
}

func TestCheckHandlerAllowsRejects(t *testing.T) {
	ts, _ := checkServer(t, false)
	// nginx auth_request: the original request in X-Original-Method / X-Original-URI.
	resp, _ := askCheck(t, ts, "GET", "", "X-Original-Method", "POST", "X-Original-URI", "/v1/pay?x=1")
	if resp.StatusCode != 200 || resp.Header.Get("RateLimit-Policy") != `"pay";q=1;w=3600` {
		t.Fatalf("allowed: %d %v", resp.StatusCode, resp.Header)
	}
	// Traefik ForwardAuth: X-Forwarded-Method / X-Forwarded-Uri.
	resp, p := askCheck(t, ts, "GET", "", "X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/v1/pay")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || p["violated-policies"] == nil {
		t.Fatalf("over the limit: %d %v", resp.StatusCode, p)
	}
	// The problem again in a header, for proxies that keep no body of the check.
	var inHeader map[string]any
	if err := json.Unmarshal([]byte(resp.Header.Get(ingress.HeaderProblem)), &inHeader); err != nil || fmt.Sprint(inHeader) != fmt.Sprint(p) {
		t.Errorf("%s %q (%v), want the body %v", ingress.HeaderProblem, resp.Header.Get(ingress.HeaderProblem), err, p)
	}
	for _, bad := range [][]string{
		{},                                // no URI
		{"X-Forwarded-Uri", "http://x/y"}, // absolute
		{"X-Forwarded-Uri", "/a b"},       // not a request target
		{"X-Forwarded-Method", "G(T", "X-Forwarded-Uri", "/"},
	} {
		if resp, _ := askCheck(t, ts, "GET", "", bad...); resp.StatusCode != 400 {
			t.Errorf("%v: %d, want 400", bad, resp.StatusCode)
		}
	}
}

// TestCheckHandlerNeverParks: nginx auth_request and Traefik ForwardAuth take every
// 2xx for "allowed", so over a defer rule the check answers 429, whatever body it
// carries, and parks nothing.
func TestCheckHandlerNeverParks(t *testing.T) {
	ts, store := checkServer(t, false)
	q, err := store.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	depth := func() uint64 {
		t.Helper()
		n, err := q.Depth(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	nginx := []string{"X-Original-Method", "POST", "X-Original-URI", "/v1/orders"}
	traefik := []string{"X-Forwarded-Method", "POST", "X-Forwarded-Uri", "/v1/orders",
		"X-Forwarded-Host", "shop.example", "X-Forwarded-Proto", "https"}
	if resp, _ := askCheck(t, ts, "GET", "", traefik...); resp.StatusCode != 200 {
		t.Fatalf("first order: %d", resp.StatusCode)
	}
	for _, tc := range []struct {
		name    string
		method  string
		body    string
		chunked bool
		headers []string
		status  int
		detail  string
	}{
		{"nginx, no body", "GET", "", false, nginx, 429, "auth_request"},
		{"nginx, body and Content-Length", "POST", `{"n":2}`, false, append(nginx, "Content-Length", "7"), 429, "2xx"},
		{"nginx, Content-Length: 0", "POST", "", false, append(nginx, "Content-Length", "0"), 429, "front door"},
		{"Traefik, no body", "GET", "", false, traefik, 429, "ForwardAuth"},
		{"Traefik forwardBody", "POST", `{"n":3}`, false, traefik, 429, "2xx"},
		{"Traefik forwardBody, chunked", "POST", `{"n":4}`, true, traefik, 429, "ext_authz"},
		{"scheduled delivery", "POST", `{"n":5}`, false, append(nginx[:len(nginx):len(nginx)], "X-Original-URI", "/v1/later", "Sluice-Not-Before", "60"), 400, "scheduled delivery"},
		// Envoy's HTTP-service form (the check is the original request, at a path
		// prefix) is not served here: parking through Envoy is its gRPC ext_authz.
		{"no forward-auth headers", "POST", `{"n":6}`, false, nil, 400, "X-Forwarded-Uri"},
	} {
		req, err := http.NewRequest(tc.method, ts.URL+ingress.CheckPath, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tc.body != "" {
			req.Body = io.NopCloser(strings.NewReader(tc.body))
			req.ContentLength = int64(len(tc.body))
			if tc.chunked {
				req.ContentLength = -1
			}
		}
		for i := 0; i+1 < len(tc.headers); i += 2 {
			req.Header.Set(tc.headers[i], tc.headers[i+1])
		}
		resp, err := ts.Client().Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		var p map[string]any
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		detail, _ := p["detail"].(string)
		if err != nil || resp.StatusCode != tc.status || !strings.Contains(detail, tc.detail) {
			t.Errorf("%s: %d %v (%v), want %d saying %q", tc.name, resp.StatusCode, p, err, tc.status, tc.detail)
		}
		if tc.status == 429 && resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After: %v", tc.name, resp.Header)
		}
		if resp.Header.Get("Location") != "" || p["ticket"] != nil {
			t.Errorf("%s: a ticket: %v %v", tc.name, resp.Header, p)
		}
		if n := depth(); n != 0 {
			t.Fatalf("%s: queue depth %d, want nothing parked", tc.name, n)
		}
	}
}

func TestCheckHandlerClientIdentity(t *testing.T) {
	ip := []string{"X-Forwarded-Uri", "/v1/ip", "X-Forwarded-For", ""}
	ask := func(ts *httptest.Server, xff string) int {
		ip[3] = xff
		resp, _ := askCheck(t, ts, "GET", "", ip...)
		return resp.StatusCode
	}
	trusted, _ := checkServer(t, true)
	if ask(trusted, "203.0.113.1") != 200 || ask(trusted, "203.0.113.2") != 200 || ask(trusted, "203.0.113.1") != 429 {
		t.Fatal("behind a trusted proxy, X-Forwarded-For does not name the client")
	}
	// nginx appends to X-Forwarded-For and passes the client's own Forwarded on: it
	// names nobody, so 203.0.113.1 stays over its limit.
	if resp, _ := askCheck(t, trusted, "GET", "", "X-Forwarded-Uri", "/v1/ip", "X-Forwarded-For", "203.0.113.1",
		"Forwarded", "for=198.51.100.1"); resp.StatusCode != 429 {
		t.Fatalf("a client's own Forwarded behind an X-Forwarded-For proxy: %d, want 429", resp.StatusCode)
	}
	untrusted, _ := checkServer(t, false)
	if ask(untrusted, "203.0.113.1") != 200 || ask(untrusted, "203.0.113.2") != 429 {
		t.Fatal("an untrusted peer's X-Forwarded-For changed the client")
	}
}
