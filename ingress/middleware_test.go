package ingress

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

const testRules = `
domain: shop
descriptors:
  - key: route
    value: orders
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 3, name: orders_per_user}
  - key: client_ip
    rate_limits:
      - {unit: second, requests_per_unit: 100}
      - {window: 10m, requests_per_unit: 5, algorithm: sliding_window_counter}
    name: per_ip
  - key: route
    value: search
    rate_limit: {unit: minute, requests_per_unit: 1, name: search}
    shadow_mode: true
  - key: route
    value: health
    rate_limit: {unlimited: true, name: health}
routes:
  - name: orders
    match: {method: [POST], path_prefix: /v1/orders}
    descriptors:
      - [{key: route, value: orders}, {key: user, from: "header:X-User-ID"}]
      - [{key: client_ip, from: client_ip}]
  - name: search
    match: {path: /v1/search}
    descriptors:
      - [{key: route, value: search}]
  - name: health
    match: {path: /v1/health}
    descriptors:
      - [{key: route, value: health}]
`

type fixture struct {
	handler http.Handler
	reg     *prometheus.Registry
	clock   *time.Time
	mu      *sync.Mutex
	reached int
}

// mustNew is New for a test, which fails when New does.
func mustNew(t testing.TB, src RulesSource, lim limiter.Limiter, opts ...Option) *Middleware {
	t.Helper()
	m, err := New(src, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func newFixture(t *testing.T, opts ...Option) *fixture {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{reg: prometheus.NewRegistry(), mu: &sync.Mutex{}}
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	f.clock = &now
	store := limiter.NewMemory(limiter.WithClock(func() time.Time {
		f.mu.Lock()
		defer f.mu.Unlock()
		return *f.clock
	}))
	m := mustNew(t, StaticRules{set}, store, append([]Option{WithRegisterer(f.reg)}, opts...)...)
	f.handler = m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.Copy(io.Discard, r.Body); err != nil {
			http.Error(w, err.Error(), http.StatusRequestEntityTooLarge)
			return
		}
		f.mu.Lock()
		f.reached++
		f.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}))
	return f
}

func (f *fixture) advance(d time.Duration) {
	f.mu.Lock()
	*f.clock = f.clock.Add(d)
	f.mu.Unlock()
}

func (f *fixture) do(method, path, peer string, headers ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, path, strings.NewReader("{}"))
	r.RemoteAddr = peer
	for i := 0; i+1 < len(headers); i += 2 {
		r.Header.Set(headers[i], headers[i+1])
	}
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

func TestRejectsWithHeadersAndProblem(t *testing.T) {
	f := newFixture(t)
	for i, wantRemaining := range []string{"2", "1", "0"} {
		w := f.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "alice")
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: status %d", i, w.Code)
		}
		if got := w.Header().Get("X-Ratelimit-Remaining"); got != wantRemaining {
			t.Fatalf("request %d: X-Ratelimit-Remaining %q, want %s", i, got, wantRemaining)
		}
	}
	f.advance(20 * time.Second) // 40s left in the minute window
	w := f.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "alice")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("4th request: status %d, want 429", w.Code)
	}
	want := map[string]string{
		"X-Ratelimit-Limit":       "3",
		"X-Ratelimit-Remaining":   "0",
		"X-Ratelimit-Retry-After": "40",
		"Retry-After":             "40",
		"Ratelimit-Policy":        `"orders_per_user";q=3;w=60`,
		"Ratelimit":               `"orders_per_user";r=0;t=40`,
		"Cache-Control":           "no-store",
		"Content-Type":            "application/problem+json",
	}
	for k, v := range want {
		if got := w.Header().Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	var p map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
		t.Fatalf("problem body: %v\n%s", err, w.Body)
	}
	if p["type"] != quotaExceededType || p["status"] != float64(429) || p["retry-after"] != float64(40) || p["limit"] != float64(3) {
		t.Errorf("problem body %v", p)
	}
	if vp, _ := p["violated-policies"].([]any); len(vp) != 1 || vp[0] != "orders_per_user" {
		t.Errorf("violated-policies %v", p["violated-policies"])
	}
	if f.reached != 3 {
		t.Errorf("upstream reached %d times, want 3", f.reached)
	}
	// Another user is not affected.
	if w := f.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "bob"); w.Code != http.StatusOK {
		t.Errorf("other user: status %d", w.Code)
	}
	if got := decisiontest.Count(t, f.reg, "orders_per_user", decide.OutcomeRejected); got != 1 {
		t.Errorf("rejected counter %v, want 1", got)
	}
}

func TestHeadersDescribeTheLimitClosestToRunningOut(t *testing.T) {
	f := newFixture(t)
	// per_ip allows 100/s and 5 per 10 minutes: the second is closer to running out.
	w := f.do("POST", "/v1/orders", "198.51.100.2:1000") // no X-User-ID: only per_ip applies
	if got := w.Header().Get("Ratelimit"); !strings.HasPrefix(got, `"per_ip";r=4;`) {
		t.Fatalf("RateLimit %q, want the 10-minute limit with 4 remaining", got)
	}
	if got := w.Header().Get("Ratelimit-Policy"); got != `"per_ip";q=5;w=600` {
		t.Fatalf("RateLimit-Policy %q", got)
	}
}

func TestForgedForwardingHeadersChangeNothing(t *testing.T) {
	f := newFixture(t)
	for i := range 5 {
		w := f.do("POST", "/v1/orders", "198.51.100.3:1000", "X-Forwarded-For", "10.0.0."+string(rune('1'+i)))
		if w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	w := f.do("POST", "/v1/orders", "198.51.100.3:1000", "X-Forwarded-For", "10.9.9.9", "Forwarded", "for=10.8.8.8")
	if w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request from one real address with forged headers: %d, want 429", w.Code)
	}
}

func TestTrustedProxyForwardsTheClient(t *testing.T) {
	ids, err := NewClientIdentity([]string{"10.0.0.0/8"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, WithClientIdentity(ids))
	for i := range 5 {
		if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "X-Forwarded-For", "203.0.113.1"); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "X-Forwarded-For", "203.0.113.1"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("client behind the proxy: %d, want 429", w.Code)
	}
	if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "X-Forwarded-For", "203.0.113.2"); w.Code != http.StatusOK {
		t.Fatalf("another client behind the same proxy: %d, want 200", w.Code)
	}
}

// TestClientForwardedThroughAnXFFProxy: behind a trusted proxy that appends to
// X-Forwarded-For (the default), a Forwarded header the client sent itself, passed
// through by the proxy, must not name the client: a new value each request would be
// a new limit each request.
func TestClientForwardedThroughAnXFFProxy(t *testing.T) {
	ids, err := NewClientIdentity([]string{"10.0.0.0/8"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, WithClientIdentity(ids))
	for i := range 5 {
		if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "X-Forwarded-For", "203.0.113.1",
			"Forwarded", "for=198.51.100."+strconv.Itoa(i+1)); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "X-Forwarded-For", "203.0.113.1",
		"Forwarded", "for=198.51.100.99"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request of one client with a new Forwarded: %d, want 429", w.Code)
	}
}

// TestClientThroughAForwardedProxy: behind trusted proxies that write Forwarded,
// Forwarded names the client and a client's own X-Forwarded-For is ignored.
func TestClientThroughAForwardedProxy(t *testing.T) {
	ids, err := NewClientIdentity([]string{"10.0.0.0/8"}, 0, WithForwardedHeader(Forwarded))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, WithClientIdentity(ids))
	for i := range 5 {
		if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "Forwarded", "for=203.0.113.1",
			"X-Forwarded-For", "198.51.100."+strconv.Itoa(i+1)); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d", i, w.Code)
		}
	}
	if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "Forwarded", "for=203.0.113.1",
		"X-Forwarded-For", "198.51.100.99"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("6th request of one client with a new X-Forwarded-For: %d, want 429", w.Code)
	}
	if w := f.do("POST", "/v1/orders", "10.0.0.1:1000", "Forwarded", "for=203.0.113.2"); w.Code != http.StatusOK {
		t.Fatalf("another client behind the same proxy: %d, want 200", w.Code)
	}
}

func TestShadowModeCountsButNeverEnforces(t *testing.T) {
	for _, global := range []bool{false, true} {
		f := newFixture(t, WithShadow(global))
		path := "/v1/search"
		if global {
			path = "/v1/orders"
		}
		for i := range 8 {
			if w := f.do("POST", path, "198.51.100.4:1000", "X-User-ID", "carol"); w.Code != http.StatusOK {
				t.Fatalf("global=%v request %d: %d", global, i, w.Code)
			}
		}
		rule := "search"
		if global {
			rule = "orders_per_user"
		}
		if got := decisiontest.Count(t, f.reg, rule, decide.OutcomeShadowDenied); got == 0 {
			t.Errorf("global=%v: no shadow rejections counted", global)
		}
	}
}

func TestUnmatchedAndUnlimitedPass(t *testing.T) {
	f := newFixture(t)
	for range 10 {
		if w := f.do("GET", "/elsewhere", "198.51.100.5:1000"); w.Code != http.StatusOK || w.Header().Get("Ratelimit") != "" {
			t.Fatalf("unmatched: %d %v", w.Code, w.Header())
		}
		if w := f.do("GET", "/v1/health", "198.51.100.5:1000"); w.Code != http.StatusOK {
			t.Fatalf("unlimited: %d", w.Code)
		}
	}
}

func TestBodyOverTheCapIs413(t *testing.T) {
	f := newFixture(t, WithMaxBody(8))
	r := httptest.NewRequest("POST", "/v1/orders", strings.NewReader(strings.Repeat("x", 9)))
	r.RemoteAddr = "198.51.100.6:1000"
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge || w.Header().Get("Content-Type") != "application/problem+json" {
		t.Fatalf("declared length over cap: %d %q", w.Code, w.Header().Get("Content-Type"))
	}
	// A chunked body (no declared length) is cut off while read.
	r = httptest.NewRequest("POST", "/v1/orders", io.MultiReader(strings.NewReader(strings.Repeat("x", 9))))
	r.ContentLength = -1
	r.RemoteAddr = "198.51.100.6:1000"
	w = httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	if w.Code != http.StatusRequestEntityTooLarge {
		t.Fatalf("streamed body over cap: %d", w.Code)
	}
}

// TestParkHeader: a Deferrer called without Deferral.Header parks the request's own
// header with the forwarding headers rebuilt, so a client cannot have forged
// Forwarded or X-Forwarded-* headers (or a Sluice-Ticket) delivered downstream; a
// Header given is used as is.
func TestParkHeader(t *testing.T) {
	r := httptest.NewRequest("POST", "http://shop.example/v1/orders", nil)
	r.RemoteAddr = "198.51.100.7:4000"
	r.Header.Set("X-Forwarded-For", "10.0.0.1")
	r.Header.Set("Forwarded", "for=10.0.0.1;host=evil.example")
	r.Header.Set("X-Forwarded-Host", "evil.example")
	r.Header.Set("X-Request-Id", "r-1")
	r.Header.Set("Sluice-Ticket", "forged") // the dispatcher's to set on the delivery
	h := Deferral{}.ParkHeader(r)
	for name, want := range map[string]string{
		"X-Forwarded-For":  "198.51.100.7",
		"X-Forwarded-Host": "shop.example",
		"Forwarded":        "",
		"Sluice-Ticket":    "",
		"X-Request-Id":     "r-1",
	} {
		if got := strings.Join(h.Values(name), ","); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if r.Header.Get("X-Forwarded-For") != "10.0.0.1" {
		t.Error("ParkHeader changed the request's own header")
	}
	given := http.Header{"X-Kept": {"1"}}
	if got := (Deferral{Header: given}).ParkHeader(r); got.Get("X-Kept") != "1" || got.Get("X-Forwarded-For") != "" {
		t.Errorf("given header not used as is: %v", got)
	}
}
