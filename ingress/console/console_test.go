package console

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
)

const testToken = "admin-token-0123456789"

// fixture is a console in front of a real admin API; store is set by withQueues.
type fixture struct {
	t       *testing.T
	c       *Console
	h       http.Handler
	now     atomic.Pointer[time.Time]
	probe   atomic.Pointer[http.Header] // what the admin API's probe endpoint last received
	store   *queue.Store
	reloads *Reloads
}

func newFixture(t *testing.T, store *queue.Store, extra ...Option) *fixture {
	t.Helper()
	set := parktest.Rules(t, parktest.Orders)
	f := &fixture{t: t, store: store, reloads: &Reloads{}}
	start := time.Date(2026, 11, 30, 10, 0, 0, 0, time.UTC)
	f.now.Store(&start)
	reg := prometheus.NewRegistry()
	m, err := decide.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Count("orders", decide.OutcomeDeferred)
	m.Count("orders", decide.OutcomeAllowed)
	admin := &ingress.Admin{Gatherer: reg, Rules: ingress.StaticRules{S: set}, Token: testToken,
		Extra: map[string]http.Handler{"POST /sluice/v1/probe": http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := r.Header.Clone()
			f.probe.Store(&h)
			w.WriteHeader(http.StatusNoContent)
		})}}
	opts := []Option{WithGatherer(reg), WithRules(ingress.StaticRules{S: set}), WithReloads(f.reloads),
		WithClock(func() time.Time { return *f.now.Load() }), WithLogger(slog.New(slog.DiscardHandler))}
	if store != nil {
		var p atomic.Pointer[queue.Store]
		p.Store(store)
		admin.Queues = &queueapi.API{Store: &p}
		opts = append(opts, WithQueueStore(&p))
	}
	opts = append(opts, extra...)
	if f.c, err = New(testToken, admin.Handler(), opts...); err != nil {
		t.Fatal(err)
	}
	f.h = f.c.Handler()
	return f
}

func (f *fixture) advance(d time.Duration) {
	n := f.now.Load().Add(d)
	f.now.Store(&n)
}

// req describes one request to the console.
type req struct {
	method, target, body string
	cookie               string
	headers              map[string]string
}

func (f *fixture) do(r req) *httptest.ResponseRecorder {
	f.t.Helper()
	var hr *http.Request
	if r.body != "" {
		hr = httptest.NewRequest(r.method, r.target, strings.NewReader(r.body))
	} else {
		hr = httptest.NewRequest(r.method, r.target, nil)
	}
	if r.cookie != "" {
		hr.AddCookie(&http.Cookie{Name: CookieName, Value: r.cookie})
	}
	for k, v := range r.headers {
		hr.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	f.h.ServeHTTP(w, hr)
	return w
}

// login signs in and returns the session cookie and its CSRF token.
func (f *fixture) login() (cookie, csrf string) {
	f.t.Helper()
	w := f.do(req{method: "POST", target: "/console/login", body: "token=" + url.QueryEscape(testToken),
		headers: map[string]string{"Content-Type": "application/x-www-form-urlencoded", "Origin": "http://example.com"}})
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != Prefix {
		f.t.Fatalf("sign-in: %d %v %s", w.Code, w.Header(), w.Body)
	}
	ck := sessionCookie(f.t, w)
	w = f.do(req{method: "GET", target: "/console/session", cookie: ck.Value})
	var s struct {
		CSRF string `json:"csrf"`
	}
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &s) != nil || s.CSRF == "" {
		f.t.Fatalf("session: %d %s", w.Code, w.Body)
	}
	return ck.Value, s.CSRF
}

func sessionCookie(t *testing.T, w *httptest.ResponseRecorder) *http.Cookie {
	t.Helper()
	for _, c := range w.Result().Cookies() {
		if c.Name == CookieName {
			return c
		}
	}
	t.Fatalf("no session cookie in %v", w.Header())
	return nil
}

func TestNew(t *testing.T) {
	api := http.NotFoundHandler()
	for name, tc := range map[string]struct {
		token string
		api   http.Handler
		opts  []Option
	}{
		"no token":   {"", api, nil},
		"no API":     {testToken, nil, nil},
		"short TTL":  {testToken, api, []Option{WithSessionTTL(time.Second)}},
		"long TTL":   {testToken, api, []Option{WithSessionTTL(31 * 24 * time.Hour)}},
		"nil clock":  {testToken, api, []Option{WithClock(nil)}},
		"nil logger": {testToken, api, []Option{WithLogger(nil)}},
	} {
		if _, err := New(tc.token, tc.api, tc.opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := New(testToken, api, WithSessionTTL(time.Hour)); err != nil {
		t.Errorf("valid options: %v", err)
	}
}

// Without a session: the pages are the sign-in form, the data and the API 401, and
// the admin API behind the console still wants its bearer token.
func TestNoSession(t *testing.T) {
	f := newFixture(t, nil)
	w := f.do(req{method: "GET", target: "/console/"})
	if w.Code != 200 || !strings.Contains(w.Body.String(), `action="/console/login"`) || strings.Contains(w.Body.String(), "app.js") {
		t.Errorf("GET /console/ without a session: %d %s", w.Code, w.Body)
	}
	if csp := w.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("CSP %q", csp)
	}
	if w := f.do(req{method: "GET", target: "/console"}); w.Code != http.StatusFound || w.Header().Get("Location") != Prefix {
		t.Errorf("GET /console: %d %v", w.Code, w.Header())
	}
	for _, r := range []req{
		{method: "GET", target: "/console/session"},
		{method: "GET", target: "/console/data/decisions"},
		{method: "GET", target: "/console/data/reloads"},
		{method: "GET", target: "/console/data/tickets/" + strings.Repeat("a", 26)},
		{method: "POST", target: "/console/data/explain", body: `{"method":"GET","path":"/"}`},
		{method: "GET", target: "/console/api/sluice/v1/rules"},
		{method: "POST", target: "/console/api/sluice/v1/probe"},
		{method: "POST", target: "/console/logout"},
	} {
		if w := f.do(r); w.Code != http.StatusUnauthorized {
			t.Errorf("%s %s without a session: %d", r.method, r.target, w.Code)
		}
	}
	if f.probe.Load() != nil {
		t.Error("a request without a session reached the admin API")
	}
	// Outside /console/ the admin API is as before.
	if w := f.do(req{method: "GET", target: "/sluice/v1/rules"}); w.Code != http.StatusUnauthorized {
		t.Errorf("admin API without its token: %d", w.Code)
	}
	if w := f.do(req{method: "GET", target: "/sluice/v1/rules", headers: map[string]string{"Authorization": "Bearer " + testToken}}); w.Code != 200 {
		t.Errorf("admin API with its token: %d", w.Code)
	}
	// The static files are public: they hold no data.
	if w := f.do(req{method: "GET", target: "/console/static/style.css"}); w.Code != 200 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/css") {
		t.Errorf("style.css: %d %v", w.Code, w.Header())
	}
	for _, p := range []string{"/console/static/index.html", "/console/static/nope.js", "/console/static/..%2fconsole.go"} {
		if w := f.do(req{method: "GET", target: p}); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, w.Code)
		}
	}
}

func TestSignIn(t *testing.T) {
	f := newFixture(t, nil)
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	for _, tok := range []string{"", "wrong", testToken + " ", strings.ToUpper(testToken)} {
		w := f.do(req{method: "POST", target: "/console/login", body: "token=" + url.QueryEscape(tok), headers: form})
		if w.Code != http.StatusSeeOther || w.Header().Get("Location") != "/console/login?failed=1" || len(w.Result().Cookies()) != 0 {
			t.Errorf("sign-in with %q: %d %v", tok, w.Code, w.Header())
		}
	}
	// A cross-site form cannot sign in (login CSRF), even with the right token.
	for _, h := range []map[string]string{
		{"Origin": "https://evil.example"},
		{"Sec-Fetch-Site": "cross-site"},
		{"Origin": "null"},
	} {
		h["Content-Type"] = form["Content-Type"]
		w := f.do(req{method: "POST", target: "/console/login", body: "token=" + testToken, headers: h})
		if w.Code != http.StatusForbidden || len(w.Result().Cookies()) != 0 {
			t.Errorf("cross-site sign-in %v: %d", h, w.Code)
		}
	}

	w := f.do(req{method: "POST", target: "/console/login", body: "token=" + testToken, headers: form})
	ck := sessionCookie(t, w)
	if !ck.HttpOnly || ck.SameSite != http.SameSiteStrictMode || ck.Path != Prefix || ck.Secure {
		t.Errorf("cookie %+v: want HttpOnly, SameSite=Strict, Path=/console/, not Secure over plain HTTP", ck)
	}
	if strings.Contains(ck.Value, testToken) || strings.Contains(w.Body.String(), testToken) {
		t.Error("the cookie or the answer holds the admin token")
	}
	if want := f.now.Load().Add(DefaultSessionTTL); !ck.Expires.Equal(want) {
		t.Errorf("expires %v, want %v", ck.Expires, want)
	}
	// Two sign-ins, two sessions.
	if w2 := f.do(req{method: "POST", target: "/console/login", body: "token=" + testToken, headers: form}); sessionCookie(t, w2).Value == ck.Value {
		t.Error("two sign-ins got the same session value")
	}
	if w := f.do(req{method: "GET", target: "/console/", cookie: ck.Value}); w.Code != 200 || !strings.Contains(w.Body.String(), "/console/static/app.js") {
		t.Errorf("GET /console/ signed in: %d", w.Code)
	}

	// Over TLS the cookie is Secure.
	r := httptest.NewRequest("POST", "https://admin.example/console/login", strings.NewReader("token="+testToken))
	r.Header.Set("Content-Type", form["Content-Type"])
	rec := httptest.NewRecorder()
	f.h.ServeHTTP(rec, r)
	if ck := sessionCookie(t, rec); !ck.Secure {
		t.Error("cookie set over TLS is not Secure")
	}
}

// TestSignInCode: a one-time code signs in once, within SignInCodeTTL, cross-site
// never; a newer code voids the older; a wrong one counts as a wrong token.
func TestSignInCode(t *testing.T) {
	f := newFixture(t, nil)
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	signIn := func(code string, h map[string]string) *httptest.ResponseRecorder {
		return f.do(req{method: "POST", target: "/console/login", body: "code=" + url.QueryEscape(code), headers: h})
	}
	failed := func(w *httptest.ResponseRecorder) bool {
		return w.Code == http.StatusSeeOther && w.Header().Get("Location") == "/console/login?failed=1" && len(w.Result().Cookies()) == 0
	}
	old := f.c.NewSignInCode()
	code := f.c.NewSignInCode()
	if len(code) != 32 || code == old || strings.Contains(code, testToken) {
		t.Fatalf("codes %q, %q", old, code)
	}
	if w := signIn(old, form); !failed(w) {
		t.Errorf("the voided code: %d %v", w.Code, w.Header())
	}
	if w := signIn(code, map[string]string{"Content-Type": form["Content-Type"], "Sec-Fetch-Site": "cross-site"}); w.Code != http.StatusForbidden {
		t.Errorf("cross-site code: %d", w.Code)
	}
	w := signIn(code, form)
	if w.Code != http.StatusSeeOther || w.Header().Get("Location") != Prefix {
		t.Fatalf("the code: %d %v", w.Code, w.Header())
	}
	if ck := sessionCookie(t, w); f.do(req{method: "GET", target: "/console/session", cookie: ck.Value}).Code != 200 {
		t.Error("the code's session is refused")
	}
	if w := signIn(code, form); !failed(w) {
		t.Errorf("the code again: %d %v", w.Code, w.Header())
	}
	code = f.c.NewSignInCode()
	f.advance(SignInCodeTTL)
	if w := signIn(code, form); !failed(w) {
		t.Errorf("the code after its TTL: %d %v", w.Code, w.Header())
	}
	// Wrong codes use up the address's allowance of wrong tokens (the ones above too).
	for range ingress.MaxWrongTokens {
		signIn("guess", form)
	}
	if w := f.do(req{method: "POST", target: "/console/login", body: "token=" + testToken, headers: form}); w.Code != http.StatusTooManyRequests {
		t.Errorf("the token after many wrong codes: %d", w.Code)
	}
}

// A session cookie is only good as minted, for this token, until it expires.
// Wrong tokens lock the address out of the sign-in (429 with Retry-After), the right
// token included, until its allowance refills.
func TestSignInLockout(t *testing.T) {
	f := newFixture(t, nil)
	form := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	signIn := func(tok string) *httptest.ResponseRecorder {
		return f.do(req{method: "POST", target: "/console/login", body: "token=" + url.QueryEscape(tok), headers: form})
	}
	for i := range ingress.MaxWrongTokens {
		if w := signIn("guess"); w.Code != http.StatusSeeOther {
			t.Fatalf("wrong token %d: %d", i+1, w.Code)
		}
	}
	for _, tok := range []string{"guess", testToken} {
		if w := signIn(tok); w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" || len(w.Result().Cookies()) != 0 {
			t.Fatalf("%q while locked out: %d %v", tok, w.Code, w.Header())
		}
	}
	f.advance(ingress.WrongTokenRefill)
	if w := signIn(testToken); w.Code != http.StatusSeeOther || len(w.Result().Cookies()) != 1 {
		t.Fatalf("right token after the lockout: %d %v", w.Code, w.Header())
	}
}

func TestSessionForgery(t *testing.T) {
	f := newFixture(t, nil)
	good, _ := f.login()
	payload, mac, _ := strings.Cut(good, ".")
	p, _ := b64.DecodeString(payload)
	later := append([]byte(nil), p...)
	later[3]++ // a later expiry
	other, err := New("another-token-0123456789", http.NotFoundHandler())
	if err != nil {
		t.Fatal(err)
	}
	otherValue, _ := other.newSession()
	for name, v := range map[string]string{
		"token as cookie":    testToken,
		"no signature":       payload,
		"empty signature":    payload + ".",
		"other payload":      b64.EncodeToString(later) + "." + mac,
		"signature altered":  payload + "." + strings.Repeat("A", len(mac)),
		"other token's":      otherValue,
		"not base64":         "!!!." + mac,
		"short payload":      b64.EncodeToString(p[:10]) + "." + mac,
		"two dots":           good + ".x",
		"trailing garbage":   good + "A",
		"csrf token instead": "x." + f.c.csrfToken(p),
	} {
		if w := f.do(req{method: "GET", target: "/console/session", cookie: v}); w.Code != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", name, w.Code)
		}
		if w := f.do(req{method: "GET", target: "/console/", cookie: v}); strings.Contains(w.Body.String(), "app.js") {
			t.Errorf("%s: the console's page was served", name)
		}
	}
	if w := f.do(req{method: "GET", target: "/console/session", cookie: good}); w.Code != 200 {
		t.Fatalf("the minted session: %d", w.Code)
	}
	f.advance(DefaultSessionTTL - time.Second)
	if w := f.do(req{method: "GET", target: "/console/session", cookie: good}); w.Code != 200 {
		t.Errorf("a second before expiry: %d", w.Code)
	}
	f.advance(time.Second)
	if w := f.do(req{method: "GET", target: "/console/session", cookie: good}); w.Code != http.StatusUnauthorized {
		t.Errorf("expired session: %d", w.Code)
	}
}

// Requests that change something need the session's CSRF token and must not come from
// another site.
func TestCSRF(t *testing.T) {
	f := newFixture(t, nil)
	ck, csrf := f.login()
	ck2, csrf2 := f.login()
	for name, h := range map[string]map[string]string{
		"no token":                    {},
		"wrong token":                 {CSRFHeader: "x" + csrf},
		"other session's token":       {CSRFHeader: csrf2},
		"cross-site origin":           {CSRFHeader: csrf, "Origin": "https://evil.example"},
		"other port":                  {CSRFHeader: csrf, "Origin": "http://example.com:8080"},
		"https origin to http":        {CSRFHeader: csrf, "Origin": "https://example.com"},
		"cross-site fetch":            {CSRFHeader: csrf, "Sec-Fetch-Site": "cross-site"},
		"same-site (another subhost)": {CSRFHeader: csrf, "Sec-Fetch-Site": "same-site"},
	} {
		for _, target := range []string{"/console/api/sluice/v1/probe", "/console/logout", "/console/data/explain"} {
			w := f.do(req{method: "POST", target: target, cookie: ck, body: `{"method":"GET","path":"/"}`, headers: h})
			if w.Code != http.StatusForbidden {
				t.Errorf("%s, POST %s: %d, want 403", name, target, w.Code)
			}
		}
	}
	if f.probe.Load() != nil {
		t.Fatal("a refused request reached the admin API")
	}
	// The console's own page: the token of its session, same origin.
	w := f.do(req{method: "POST", target: "/console/api/sluice/v1/probe", cookie: ck2,
		headers: map[string]string{CSRFHeader: csrf2, "Origin": "http://example.com", "Sec-Fetch-Site": "same-origin"}})
	if w.Code != http.StatusNoContent {
		t.Fatalf("same-origin POST with its CSRF token: %d %s", w.Code, w.Body)
	}
	got := *f.probe.Load()
	if got.Get("Authorization") != "Bearer "+testToken || got.Get("Cookie") != "" || got.Get(CSRFHeader) != "" {
		t.Errorf("the admin API got %v: want the bearer token, no cookie, no CSRF token", got)
	}
	// Only the admin API's /sluice/v1/ paths are forwarded.
	for _, p := range []string{"/console/api/metrics", "/console/api/", "/console/api/sluice/v2/x", "/console/api/healthz"} {
		if w := f.do(req{method: "GET", target: p, cookie: ck}); w.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, w.Code)
		}
	}
	// Sign-out clears the cookie.
	w = f.do(req{method: "POST", target: "/console/logout", cookie: ck, headers: map[string]string{CSRFHeader: csrf}})
	if c := sessionCookie(t, w); w.Code != http.StatusNoContent || c.MaxAge >= 0 || c.Value != "" {
		t.Errorf("logout: %d %+v", w.Code, c)
	}
}

func TestOverviewAndRules(t *testing.T) {
	f := newFixture(t, nil)
	ck, csrf := f.login()
	w := f.do(req{method: "GET", target: "/console/data/decisions", cookie: ck})
	var dec struct {
		Series []decisionSeries `json:"series"`
	}
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &dec) != nil {
		t.Fatalf("decisions: %d %s", w.Code, w.Body)
	}
	got := map[string]float64{}
	for _, s := range dec.Series {
		got[s.Rule+"/"+s.Outcome] = s.Total
	}
	if got["orders/deferred"] != 1 || got["orders/allowed"] != 1 || got["orders/rejected"] != 0 {
		t.Errorf("decisions %v", dec.Series)
	}

	w = f.do(req{method: "GET", target: "/console/data/reloads", cookie: ck})
	if w.Code != 200 || strings.Contains(w.Body.String(), `"last"`) {
		t.Errorf("reloads before any: %d %s", w.Code, w.Body)
	}
	_, perr := rules.Parse(rules.File{Name: "bad.yaml", Data: []byte("domain: x\ndescriptors: [{key: a, rate_limit: {unit: fortnight, requests_per_unit: 1}}]\n")})
	f.reloads.Observe(watch.ReloadResult{Err: perr})
	w = f.do(req{method: "GET", target: "/console/data/reloads", cookie: ck})
	var rl struct {
		Last *struct {
			OK       bool     `json:"ok"`
			Problems []string `json:"problems"`
		} `json:"last"`
		Failed int `json:"failed"`
	}
	if json.Unmarshal(w.Body.Bytes(), &rl) != nil || rl.Last == nil || rl.Last.OK || rl.Failed != 1 ||
		len(rl.Last.Problems) == 0 || !strings.Contains(rl.Last.Problems[0], "bad.yaml:") {
		t.Errorf("reloads after a refusal: %s", w.Body)
	}

	explain := func(body string) *httptest.ResponseRecorder {
		return f.do(req{method: "POST", target: "/console/data/explain", cookie: ck, body: body, headers: map[string]string{CSRFHeader: csrf}})
	}
	w = explain(`{"method":"post","path":"/v1/orders","headers":["X-User-ID: 7"],"ip":"192.0.2.1"}`)
	var ex explainView
	if w.Code != 200 || json.Unmarshal(w.Body.Bytes(), &ex) != nil || ex.Route == nil || ex.Route.Name != "orders" ||
		len(ex.Descriptors) != 1 || ex.Descriptors[0].Rule == nil || ex.Descriptors[0].Rule.Queue != "orders" ||
		ex.Descriptors[0].Rule.Limits[0] != "fixed_window 1/1h" {
		t.Errorf("explain: %d %s", w.Code, w.Body)
	}
	if w = explain(`{"method":"GET","path":"/health"}`); w.Code != 200 || !strings.Contains(w.Body.String(), `"route": null`) {
		t.Errorf("explain without route: %d %s", w.Code, w.Body)
	}
	for _, bad := range []string{`{"method":"G T","path":"/"}`, `{"method":"GET","path":"x"}`, `{"method":"GET","path":"/","ip":"300.1.1.1"}`,
		`{"method":"GET","path":"/","headers":["nocolon"]}`, `{"nope":1}`, `not json`} {
		if w := explain(bad); w.Code != http.StatusBadRequest {
			t.Errorf("explain %s: %d, want 400", bad, w.Code)
		}
	}
}

// Tickets and dead letters show metadata, never the order's or the downstream's
// headers and bodies, and never the admin token; requeue works through the console.
func TestNoBodiesOrSecrets(t *testing.T) {
	_, store := parktest.Store(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1"})
	q, err := store.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const secret = "s3cr3t-payload"
	park := func(order string) string {
		rc, err := store.Park(ctx, &queue.Request{Queue: "orders", Rule: "orders", Method: "POST", Path: "/v1/orders",
			Header: http.Header{"X-Card": {secret}, "Content-Type": {"application/json"}}, Body: []byte(`{"card":"` + secret + `","order":"` + order + `"}`)})
		if err != nil {
			t.Fatal(err)
		}
		return rc.Ticket
	}
	done, dead := park("1"), park("2")
	c := q.Consumer()
	if err := c.Ensure(ctx, queue.ConsumerConfig{AckWait: 30 * time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		var l *queue.Lease
		for l == nil {
			nctx, ncancel := context.WithTimeout(ctx, time.Second)
			l, err = c.Next(nctx)
			ncancel()
			if err != nil && !errors.Is(err, queue.ErrNoMessages) {
				t.Fatal(err)
			}
		}
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if l.Message().Ticket == done {
			err = l.Done(ctx, &queue.Result{StatusCode: 201, Header: http.Header{"X-Receipt": {secret}}, Body: []byte(secret)})
		} else {
			err = l.Dead(ctx, "downstream answered 500", 0)
		}
		if err != nil {
			t.Fatal(err)
		}
	}

	f := newFixture(t, store)
	ck, csrf := f.login()
	get := func(target string) string {
		t.Helper()
		w := f.do(req{method: "GET", target: target, cookie: ck})
		if w.Code != 200 {
			t.Fatalf("GET %s: %d %s", target, w.Code, w.Body)
		}
		body := w.Body.String()
		if strings.Contains(body, secret) || strings.Contains(body, testToken) {
			t.Errorf("GET %s shows a body, header or the token:\n%s", target, body)
		}
		return body
	}
	if b := get("/console/data/tickets/" + done); !strings.Contains(b, `"status": "done"`) || !strings.Contains(b, `"result_status": 201`) ||
		!strings.Contains(b, `"result_bytes": 14`) {
		t.Errorf("done ticket:\n%s", b)
	}
	if b := get("/console/data/tickets/" + dead); !strings.Contains(b, `"status": "dead"`) {
		t.Errorf("dead ticket:\n%s", b)
	}
	if b := get("/console/api/sluice/v1/queues/orders/dead"); !strings.Contains(b, dead) || !strings.Contains(b, `"body_bytes"`) {
		t.Errorf("dead letters:\n%s", b)
	}
	for _, p := range []string{"/console/", "/console/session", "/console/data/decisions", "/console/data/reloads",
		"/console/api/sluice/v1/queues", "/console/api/sluice/v1/rules", "/console/api/sluice/v1/status",
		"/console/static/app.js", "/console/static/login.js", "/console/static/style.css"} {
		get(p)
	}
	w := f.do(req{method: "GET", target: "/console/data/tickets/" + strings.Repeat("a", 26), cookie: ck})
	if w.Code != http.StatusNotFound {
		t.Errorf("unknown ticket: %d", w.Code)
	}
	if w := f.do(req{method: "GET", target: "/console/data/tickets/not-a-ticket", cookie: ck}); w.Code != http.StatusBadRequest {
		t.Errorf("malformed ticket: %d", w.Code)
	}

	// Requeue through the console, as its page does.
	w = f.do(req{method: "POST", target: "/console/api/sluice/v1/queues/orders/dead/requeue", cookie: ck,
		body: `{"tickets":["` + dead + `"]}`, headers: map[string]string{CSRFHeader: csrf, "Content-Type": "application/json"}})
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"requeued": 1`) {
		t.Errorf("requeue: %d %s", w.Code, w.Body)
	}
	if b := get("/console/data/tickets/" + dead); !strings.Contains(b, `"status": "queued"`) {
		t.Errorf("requeued ticket:\n%s", b)
	}
}

// The session cookie's parser takes any value without panicking and accepts only
// values the console minted.
func FuzzSessionCookie(f *testing.F) {
	c, err := New(testToken, http.NotFoundHandler())
	if err != nil {
		f.Fatal(err)
	}
	minted, _ := c.newSession()
	for _, s := range []string{"", ".", "a.b", minted, minted + "x", strings.Repeat(".", 40), "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA.AAAA"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		r := httptest.NewRequest("GET", "/console/", nil)
		r.Header.Set("Cookie", CookieName+"="+v)
		if _, _, ok := c.sessionOf(r); ok && v != minted {
			t.Errorf("accepted %q", v)
		}
	})
}
