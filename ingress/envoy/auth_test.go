package envoy

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
)

const authRules = `
domain: shop
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    on_limit: defer
    queue: orders
  - key: route
    value: pay
    rate_limit: {unit: hour, requests_per_unit: 1, name: payments}
  - key: client
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_client}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1, name: per_user}
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors: [[{key: route, value: orders}]]
  - name: pay
    match: {method: [POST], path: /v1/payments}
    descriptors: [[{key: route, value: pay}]]
  - name: ip
    match: {path: /v1/ip}
    descriptors: [[{key: client, from: client_ip}]]
  - name: users
    match: {path: /v1/users}
    descriptors: [[{key: user, from: "header:X-User-ID"}], [{key: user, from: "query:user"}]]
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: DOWNSTREAM
`

// delivered records what the downstream of the orders queue receives.
type delivered struct {
	mu     sync.Mutex
	bodies map[string]string // Sluice-Ticket → body
}

func (d *delivered) get(ticket string) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b, ok := d.bodies[ticket]
	return b, ok
}

// wait returns the body delivered for ticket, failing t when none comes within 30 s.
func (d *delivered) wait(t *testing.T, ticket string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, ok := d.get(ticket); ok {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatal("the deferred order never reached the downstream")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// authFixture is an ext_authz service over loopback whose orders queue lives in an
// embedded NATS and is drained by a real dispatcher to a loopback downstream.
func authFixture(t *testing.T) (authv3.AuthorizationClient, *delivered) {
	t.Helper()
	return authFixtureOf(t, authRules)
}

// authFixtureOf is authFixture on rules src, whose orders queue's downstream is
// written DOWNSTREAM.
func authFixtureOf(t *testing.T, src string) (authv3.AuthorizationClient, *delivered) {
	t.Helper()
	got := &delivered{bodies: map[string]string{}}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got.mu.Lock()
		got.bodies[r.Header.Get("Sluice-Ticket")] = string(b)
		got.mu.Unlock()
	}))
	t.Cleanup(down.Close)
	set := parseRules(t, strings.Replace(src, "DOWNSTREAM", down.URL, 1))
	_, store := parktest.Store(t, set.Queue("orders").Config)
	d, err := dispatcher.New(store, dispatcher.WithFetchWait(300*time.Millisecond), dispatcher.WithPinnedTTL(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := d.Run(runCtx); err != nil {
			t.Errorf("dispatcher: %v", err)
		}
	}()
	t.Cleanup(func() { stop(); <-done })
	ids, err := ingress.NewClientIdentity([]string{"10.0.0.0/8"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := ingress.New(ingress.StaticRules{S: set}, limiter.NewMemory(), ingress.WithClientIdentity(ids),
		ingress.WithDeferrer(deferral.New(store)))
	if err != nil {
		t.Fatal(err)
	}
	return authv3.NewAuthorizationClient(serve(t, NewServer(nil, NewAuthService(mw)))), got
}

type checkReq struct {
	method, path, source, body string
	headers                    map[string]string
}

func check(t *testing.T, c authv3.AuthorizationClient, r checkReq) *authv3.CheckResponse {
	t.Helper()
	req := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: r.method, Path: r.path, Host: "shop.example", Headers: r.headers, RawBody: []byte(r.body)}},
	}}
	if r.source != "" {
		req.Attributes.Source = &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
			SocketAddress: &corev3.SocketAddress{Address: r.source, PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: 40000}}}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.Check(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func headerOf(opts []*corev3.HeaderValueOption, name string) string {
	for _, o := range opts {
		if o.Header.Key == name {
			return o.Header.Value
		}
	}
	return ""
}

// denied returns the status, headers and problem (or ticket) body of a denied check.
func denied(t *testing.T, resp *authv3.CheckResponse) (int, []*corev3.HeaderValueOption, map[string]any) {
	t.Helper()
	d := resp.GetDeniedResponse()
	if d == nil || resp.Status.GetCode() != int32(codes.PermissionDenied) {
		t.Fatalf("not denied: %v", resp)
	}
	var body map[string]any
	if err := json.Unmarshal([]byte(d.Body), &body); err != nil {
		t.Fatalf("body %q: %v", d.Body, err)
	}
	return int(d.Status.GetCode()), d.Headers, body
}

func TestCheckAllowsThenRejects(t *testing.T) {
	c, _ := authFixture(t)
	resp := check(t, c, checkReq{method: "POST", path: "/v1/payments?x=1", source: "192.0.2.1"})
	ok := resp.GetOkResponse()
	if ok == nil || resp.Status.GetCode() != 0 {
		t.Fatalf("first payment: %v", resp)
	}
	if got := headerOf(ok.ResponseHeadersToAdd, "ratelimit-policy"); got != `"payments";q=1;w=3600` {
		t.Fatalf("RateLimit-Policy to add: %q", got)
	}
	code, h, p := denied(t, check(t, c, checkReq{method: "POST", path: "/v1/payments", source: "192.0.2.1"}))
	if code != 429 || headerOf(h, "content-type") != "application/problem+json" || headerOf(h, "retry-after") == "" ||
		!strings.HasSuffix(p["type"].(string), "#quota-exceeded") {
		t.Fatalf("second payment: %d %v %v", code, h, p)
	}
	// A route without limits, and an unknown route, pass.
	if resp := check(t, c, checkReq{method: "GET", path: "/elsewhere", source: "192.0.2.1"}); resp.GetOkResponse() == nil {
		t.Fatalf("unmatched route: %v", resp)
	}
}

func TestCheckDefersWithTheBody(t *testing.T) {
	c, got := authFixture(t)
	order := func(body string, headers map[string]string) *authv3.CheckResponse {
		return check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: body, headers: headers})
	}
	if resp := order(`{"n":1}`, map[string]string{"content-length": "7"}); resp.GetOkResponse() == nil {
		t.Fatalf("first order: %v", resp)
	}
	code, h, body := denied(t, order(`{"n":2}`, map[string]string{"content-length": "7", "content-type": "application/json"}))
	ticket, _ := body["ticket"].(string)
	if code != http.StatusAccepted || ticket == "" || headerOf(h, "location") != deferral.Path+ticket {
		t.Fatalf("deferred order: %d %v %v", code, h, body)
	}
	if b := got.wait(t, ticket); b != `{"n":2}` {
		t.Fatalf("downstream got %q", b)
	}

	// Without the whole body, nothing is parked: 429, and the detail says why.
	for _, tc := range []struct {
		name, body string
		headers    map[string]string
		why        string
	}{
		{"no body sent", "", map[string]string{"content-length": "7"}, "with_request_body"},
		{"no body, no length", "", nil, "with_request_body"},
		{"cut at max_request_bytes", `{"n"`, map[string]string{"content-length": "7", "x-envoy-auth-partial-body": "true"}, "max_request_bytes"},
		{"shorter than its length", `{"n"`, map[string]string{"content-length": "7"}, "Content-Length"},
	} {
		code, _, p := denied(t, order(tc.body, tc.headers))
		if detail, _ := p["detail"].(string); code != 429 || !strings.Contains(detail, tc.why) {
			t.Errorf("%s: %d %v", tc.name, code, p)
		}
	}
}

func TestCheckClientIdentity(t *testing.T) {
	c, _ := authFixture(t)
	ip := func(source, xff string) bool {
		return check(t, c, checkReq{method: "GET", path: "/v1/ip", source: source,
			headers: map[string]string{"x-forwarded-for": xff}}).GetOkResponse() != nil
	}
	// Behind a trusted proxy, X-Forwarded-For names the client.
	if !ip("10.0.0.1", "203.0.113.9") || !ip("10.0.0.1", "203.0.113.10") || ip("10.0.0.2", "203.0.113.9") {
		t.Fatal("clients behind the trusted proxy are not told apart by X-Forwarded-For")
	}
	// An untrusted peer's X-Forwarded-For is ignored: a new value buys nothing.
	if !ip("192.0.2.7", "203.0.113.50") || ip("192.0.2.7", "203.0.113.51") {
		t.Fatal("a spoofed X-Forwarded-For from an untrusted peer changed the client")
	}
	// Behind a trusted proxy that appends to X-Forwarded-For, a Forwarded header the
	// client sent itself names nobody: 203.0.113.9 has used its request.
	if check(t, c, checkReq{method: "GET", path: "/v1/ip", source: "10.0.0.1",
		headers: map[string]string{"x-forwarded-for": "203.0.113.9", "forwarded": "for=198.51.100.1"}}).GetOkResponse() != nil {
		t.Fatal("a client's own Forwarded header behind an X-Forwarded-For proxy changed the client")
	}
}

// TestCheckRefusesRepeatedLimitKeys: a header or query parameter a limit is keyed on,
// sent twice (Envoy's headers map joins the lines with a comma; header_map keeps
// them apart), is denied with 400 naming it, never decided on its first value.
func TestCheckRefusesRepeatedLimitKeys(t *testing.T) {
	c, _ := authFixture(t)
	for _, tc := range []struct {
		name    string
		path    string
		headers map[string]string
		lines   []string // header_map entries of X-User-ID
		want    string
	}{
		{name: "headers map, joined", path: "/v1/users", headers: map[string]string{"x-user-id": "r4nd0m,alice"}, want: "X-User-Id holds a comma-separated list"},
		{name: "header_map, two entries", path: "/v1/users", lines: []string{"r4nd0m", "alice"}, want: "X-User-Id is sent more than once"},
		{name: "query twice", path: "/v1/users?user=r4nd0m&user=alice", want: "query parameter user is sent more than once"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &authv3.AttributeContext_HttpRequest{Method: "GET", Path: tc.path, Host: "shop.example", Headers: tc.headers}
			if tc.lines != nil {
				h.HeaderMap = &corev3.HeaderMap{}
				for _, v := range tc.lines {
					h.HeaderMap.Headers = append(h.HeaderMap.Headers, &corev3.HeaderValue{Key: "x-user-id", Value: v})
				}
			}
			resp, err := c.Check(context.Background(), &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
				Request: &authv3.AttributeContext_Request{Http: h}}})
			if err != nil {
				t.Fatal(err)
			}
			code, hdr, p := denied(t, resp)
			if detail, _ := p["detail"].(string); code != http.StatusBadRequest ||
				headerOf(hdr, "content-type") != "application/problem+json" || !strings.Contains(detail, tc.want) {
				t.Errorf("%d %v %v, want 400 saying %q", code, hdr, p, tc.want)
			}
		})
	}
	one := check(t, c, checkReq{method: "GET", path: "/v1/users?user=bob", headers: map[string]string{"x-user-id": "alice"}})
	if one.GetOkResponse() == nil {
		t.Fatalf("one value each: %v", one)
	}
}

// TestCheckRefusesPathsNotInNormalForm: ext_authz decided on the cleaned path
// (/v1/orders/../../admin counted as /admin) while Envoy routes and forwards the one it
// holds; such a path is denied with 400 and a problem saying why.
func TestCheckRefusesPathsNotInNormalForm(t *testing.T) {
	c, _ := authFixture(t)
	for _, p := range []string{"/v1/orders/../../admin", "/v1/payments/../orders", "//v1/payments", "/v1/%2E%2E/payments", "/v1%2Fpayments"} {
		code, h, body := denied(t, check(t, c, checkReq{method: "POST", path: p, source: "192.0.2.1"}))
		if detail, _ := body["detail"].(string); code != http.StatusBadRequest ||
			headerOf(h, "content-type") != "application/problem+json" || !strings.Contains(detail, "not in normal form") {
			t.Errorf("%s: %d %v %v, want a 400 problem", p, code, h, body)
		}
	}
	// The normal form is decided as ever.
	if resp := check(t, c, checkReq{method: "POST", path: "/v1/payments", source: "192.0.2.1"}); resp.GetOkResponse() == nil {
		t.Fatalf("/v1/payments: %v", resp)
	}
}

func TestCheckRefusesBadRequests(t *testing.T) {
	c, _ := authFixture(t)
	for _, req := range []*authv3.CheckRequest{
		{},
		{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GET", Path: "http://evil.example/"}}}},
		{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{Method: "GE T", Path: "/"}}}},
	} {
		if _, err := c.Check(context.Background(), req); status.Code(err) != codes.InvalidArgument {
			t.Errorf("%v: %v, want InvalidArgument", req, err)
		}
	}
}

func TestCheckBodyOverTheCap(t *testing.T) {
	set := parseRules(t, strings.Replace(authRules, "DOWNSTREAM", "http://127.0.0.1:1", 1))
	mw := newMiddleware(t, set, limiter.NewMemory(), ingress.WithMaxBody(16))
	c := authv3.NewAuthorizationClient(serve(t, NewServer(nil, NewAuthService(mw))))
	body := strings.Repeat("x", 32)
	code, _, p := denied(t, check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: body,
		headers: map[string]string{"content-length": "32"}}))
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("a body over --max-body: %d %v", code, p)
	}
}
