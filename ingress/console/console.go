// Package console serves the operator console: a few browser pages on the admin
// listener, under Prefix, over the admin API (ingress.Admin and ingress/queueapi).
//
// The pages, their script and style sheet are embedded in the binary and load nothing
// from elsewhere. An operator signs in with the admin token once, or with a one-time
// sign-in code (NewSignInCode) carried in the fragment of a URL that the sign-in page
// posts and then removes from the address bar; the console then
// keeps a session cookie that is not the token but an HMAC-signed expiry, and calls
// the admin API for the browser (Prefix + "api/sluice/v1/…"), adding the bearer token
// itself, so the token never reaches the page's script. Every request that changes
// something needs the session's CSRF token in a header, and a same-origin Origin
// (or Sec-Fetch-Site) when the browser sends one.
//
// The overview is the cluster's (see Cluster): every replica publishes its decision
// counters and its view of the queues to the NATS key-value bucket ReportsBucket every
// ReportInterval; the console sums every replica's decisions per second by outcome and
// rule, lists the replicas, and keeps the last hour in memory (HistoryPoints points,
// one every HistoryStep) for its charts of decisions by outcome, queue depth, and
// achieved against configured outflow, drawn as inline SVG. GET Prefix+"data/cluster"
// is the JSON the page reads. Without NATS the overview is this process's, and says so.
package console

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/queue"
)

// Prefix is the path under which the console is served.
const Prefix = "/console/"

// Names the console uses on the wire.
const (
	// CookieName is the session cookie.
	CookieName = "sluice_console"
	// CSRFHeader carries the session's CSRF token on requests that change something.
	CSRFHeader = "X-Sluice-Csrf"
)

// ErrInvalidOption is wrapped by New's errors for an unusable option.
var ErrInvalidOption = errors.New("console: invalid option")

// DefaultSessionTTL is how long a sign-in lasts unless WithSessionTTL says otherwise.
const DefaultSessionTTL = 8 * time.Hour

//go:embed static
var staticFS embed.FS

// Console is the operator console's handler. Create it with New.
type Console struct {
	token    string
	guard    *ingress.TokenGuard
	key      []byte // HMAC key of sessions and CSRF tokens, derived from the token
	api      http.Handler
	gatherer prometheus.Gatherer
	rules    ingress.RulesSource
	store    interface{ Load() *queue.Store }
	reloads  *Reloads
	cluster  *Cluster
	lazy     bool // cluster is the console's own, ticked by its readers
	ttl      time.Duration
	now      func() time.Time
	log      *slog.Logger
	static   fs.FS
	mux      *http.ServeMux

	codeMu    sync.Mutex
	codeHash  [sha256.Size]byte // of the one-time sign-in code; zero: none
	codeUntil time.Time
}

// Option configures a Console.
type Option func(*Console) error

// WithGatherer is where the overview reads sluice_decisions_total; without it the
// overview shows no decisions.
func WithGatherer(g prometheus.Gatherer) Option {
	return func(c *Console) error { c.gatherer = g; return nil }
}

// WithRules is the active rules set, for the explain form.
func WithRules(r ingress.RulesSource) Option {
	return func(c *Console) error { c.rules = r; return nil }
}

// WithQueueStore is the queue store, for the ticket lookup (its Load may return nil
// while NATS is unreachable: the lookup answers 503 meanwhile).
func WithQueueStore(s interface{ Load() *queue.Store }) Option {
	return func(c *Console) error { c.store = s; return nil }
}

// WithReloads is the record of rules reloads the rules page shows.
func WithReloads(r *Reloads) Option {
	return func(c *Console) error { c.reloads = r; return nil }
}

// WithCluster is where the overview reads the decisions of every replica and the
// history (run its Run meanwhile). Without it the overview shows this process only,
// read when the page asks (no history while no page is open).
func WithCluster(cl *Cluster) Option {
	return func(c *Console) error {
		if cl == nil {
			return fmt.Errorf("%w: nil cluster", ErrInvalidOption)
		}
		c.cluster = cl
		return nil
	}
}

// WithSessionTTL sets how long a sign-in lasts (at least a minute, at most 30 days).
func WithSessionTTL(d time.Duration) Option {
	return func(c *Console) error {
		if d < time.Minute || d > 30*24*time.Hour {
			return fmt.Errorf("%w: session TTL %s is not between 1m and 720h", ErrInvalidOption, d)
		}
		c.ttl = d
		return nil
	}
}

// WithClock replaces time.Now, for tests of expiry.
func WithClock(now func() time.Time) Option {
	return func(c *Console) error {
		if now == nil {
			return fmt.Errorf("%w: nil clock", ErrInvalidOption)
		}
		c.now = now
		return nil
	}
}

// WithTokenGuard checks sign-ins with g (share the admin API's, ingress.Admin.Guard,
// so that a guesser has one allowance for both); by default the console has one of its
// own.
func WithTokenGuard(g *ingress.TokenGuard) Option {
	return func(c *Console) error {
		if g == nil {
			return fmt.Errorf("%w: nil token guard", ErrInvalidOption)
		}
		c.guard = g
		return nil
	}
}

// WithLogger receives sign-ins and refusals; default slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(c *Console) error {
		if l == nil {
			return fmt.Errorf("%w: nil logger", ErrInvalidOption)
		}
		c.log = l
		return nil
	}
}

// New returns the console in front of api, the admin listener's handler that token
// guards (ingress.Admin.Handler with Admin.Token set to token). The token must not be
// empty: a console without sign-in would let any page the operator's browser opens
// drive the queues.
func New(token string, api http.Handler, opts ...Option) (*Console, error) {
	if token == "" {
		return nil, fmt.Errorf("%w: the console needs the admin token", ErrInvalidOption)
	}
	if api == nil {
		return nil, fmt.Errorf("%w: nil admin API handler", ErrInvalidOption)
	}
	mac := hmac.New(sha256.New, []byte(token))
	mac.Write([]byte("sluice console session key v1"))
	c := &Console{token: token, key: mac.Sum(nil), api: api, ttl: DefaultSessionTTL, now: time.Now, log: slog.Default()}
	for _, o := range opts {
		if err := o(c); err != nil {
			return nil, err
		}
	}
	if c.guard == nil {
		c.guard = ingress.NewTokenGuard(token, c.now)
	}
	if c.cluster == nil {
		cl, err := NewCluster(NewReplicaID(), LocalReport(c.gatherer, c.store), WithClusterClock(c.now), WithClusterLogger(c.log))
		if err != nil {
			return nil, err
		}
		c.cluster, c.lazy = cl, true
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.static = static
	m := http.NewServeMux()
	m.HandleFunc("GET "+Prefix+"{$}", c.index)
	m.HandleFunc("GET "+Prefix+"login", c.loginPage)
	m.HandleFunc("POST "+Prefix+"login", c.login)
	m.HandleFunc("POST "+Prefix+"logout", c.authed(c.logout))
	m.HandleFunc("GET "+Prefix+"static/{file}", c.asset)
	m.HandleFunc("GET "+Prefix+"session", c.authed(c.session))
	m.HandleFunc("GET "+Prefix+"data/decisions", c.authed(c.decisions))
	m.HandleFunc("GET "+Prefix+"data/cluster", c.authed(c.clusterData))
	m.HandleFunc("GET "+Prefix+"data/tickets/{ticket}", c.authed(c.ticket))
	m.HandleFunc("GET "+Prefix+"data/reloads", c.authed(c.reloadsView))
	m.HandleFunc("POST "+Prefix+"data/explain", c.authed(c.explain))
	m.HandleFunc(Prefix+"api/", c.authed(c.forward))
	c.mux = m
	return c, nil
}

// Handler serves the console under Prefix and passes every other request to the
// admin API unchanged.
func (c *Console) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path+"/" == Prefix {
			http.Redirect(w, r, Prefix, http.StatusFound)
			return
		}
		if !strings.HasPrefix(r.URL.Path, Prefix) {
			c.api.ServeHTTP(w, r)
			return
		}
		h := w.Header()
		// The pages load only their own script and style, are never framed, and leak
		// no URL to other sites.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Frame-Options", "DENY")
		h.Set("X-Content-Type-Options", "nosniff")
		// same-origin, not no-referrer: with no-referrer browsers send "Origin: null" on
		// the sign-in form's POST, which sameOrigin must refuse.
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		c.mux.ServeHTTP(w, r)
	})
}

// session values: base64url(expiry (8 bytes, Unix seconds) | nonce (16 bytes)) "."
// base64url(HMAC-SHA256(key, "session" 0 payload)).
const payloadLen = 8 + 16

func (c *Console) sign(purpose string, payload []byte) []byte {
	mac := hmac.New(sha256.New, c.key)
	mac.Write([]byte(purpose))
	mac.Write([]byte{0})
	mac.Write(payload)
	return mac.Sum(nil)
}

var b64 = base64.RawURLEncoding

// newSession returns a fresh cookie value and its expiry.
func (c *Console) newSession() (string, time.Time) {
	exp := c.now().Add(c.ttl).Truncate(time.Second)
	p := make([]byte, payloadLen)
	binary.BigEndian.PutUint64(p, uint64(exp.Unix()))
	_, _ = rand.Read(p[8:]) // crypto/rand.Read never fails (Go 1.24)
	return b64.EncodeToString(p) + "." + b64.EncodeToString(c.sign("session", p)), exp
}

// sessionOf returns the payload of r's valid, unexpired session cookie.
func (c *Console) sessionOf(r *http.Request) (payload []byte, exp time.Time, ok bool) {
	ck, err := r.Cookie(CookieName)
	if err != nil {
		return nil, exp, false
	}
	ps, ms, found := strings.Cut(ck.Value, ".")
	if !found {
		return nil, exp, false
	}
	p, err1 := b64.DecodeString(ps)
	m, err2 := b64.DecodeString(ms)
	if err1 != nil || err2 != nil || len(p) != payloadLen || !hmac.Equal(m, c.sign("session", p)) {
		return nil, exp, false
	}
	exp = time.Unix(int64(binary.BigEndian.Uint64(p)), 0)
	if !c.now().Before(exp) {
		return nil, exp, false
	}
	return p, exp, true
}

func (c *Console) csrfToken(payload []byte) string {
	return b64.EncodeToString(c.sign("csrf", payload))
}

// sameOrigin reports whether a state-changing request comes from the console's own
// pages: no Origin or one equal to this host, and no Sec-Fetch-Site other than
// same-origin (browsers send both on cross-site POSTs; other clients send neither).
func sameOrigin(r *http.Request) bool {
	if s := r.Header.Get("Sec-Fetch-Site"); s != "" && s != "same-origin" {
		return false
	}
	o := r.Header.Get("Origin")
	if o == "" {
		return true
	}
	u, err := url.Parse(o)
	return err == nil && u.Host == r.Host && (u.Scheme == "https") == (r.TLS != nil)
}

type sessionHandler func(w http.ResponseWriter, r *http.Request, payload []byte)

// authed lets through requests with a valid session; those that change something
// also need the CSRF token and a same-origin request.
func (c *Console) authed(h sessionHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		p, _, ok := c.sessionOf(r)
		if !ok {
			ingress.WriteProblem(w, http.StatusUnauthorized, "Sign in to the console first.")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			got := r.Header.Get(CSRFHeader)
			if !sameOrigin(r) || subtle.ConstantTimeCompare([]byte(got), []byte(c.csrfToken(p))) != 1 {
				c.log.Warn("console: request refused: cross-site or without its CSRF token", "method", r.Method, "path", r.URL.Path)
				ingress.WriteProblem(w, http.StatusForbidden, "Cross-site request refused: reload the console.")
				return
			}
		}
		h(w, r, p)
	}
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, value string, exp time.Time) {
	ck := &http.Cookie{Name: CookieName, Value: value, Path: Prefix, HttpOnly: true, Secure: r.TLS != nil,
		SameSite: http.SameSiteStrictMode}
	if value == "" {
		ck.MaxAge = -1
	} else {
		ck.Expires = exp
	}
	http.SetCookie(w, ck)
}

func (c *Console) index(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := c.sessionOf(r); !ok {
		c.servePage(w, "login.html", http.StatusOK)
		return
	}
	c.servePage(w, "index.html", http.StatusOK)
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := c.sessionOf(r); ok {
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	c.servePage(w, "login.html", http.StatusOK)
}

func (c *Console) servePage(w http.ResponseWriter, name string, status int) {
	b, err := fs.ReadFile(c.static, name)
	if err != nil {
		ingress.WriteProblem(w, http.StatusInternalServerError, "The console's page is missing.")
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// maxLoginBody bounds the sign-in form.
const maxLoginBody = 4 << 10

func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		ingress.WriteProblem(w, http.StatusForbidden, "Cross-site sign-in refused.")
		return
	}
	// The capped body goes on a copy of r: net/http's server looks at the request's
	// own Body after the handler, and an unread Expect: 100-continue body (a sign-in
	// that is not a form) must not be waited for.
	capped := *r
	capped.Body = http.MaxBytesReader(w, r.Body, maxLoginBody)
	r = &capped
	if err := r.ParseForm(); err != nil {
		ingress.WriteProblem(w, http.StatusBadRequest, "The sign-in form could not be read.")
		return
	}
	code := r.PostForm.Get("code")
	if code != "" && c.useSignInCode(code) {
		v, exp := c.newSession()
		c.setCookie(w, r, v, exp)
		c.log.Info("console: signed in with the one-time code", "remote", r.RemoteAddr, "until", exp)
		http.Redirect(w, r, Prefix, http.StatusSeeOther)
		return
	}
	// A wrong, used or expired code counts as a wrong token.
	ok, retryAfter := c.guard.Check(r, cmp.Or(code, r.PostForm.Get("token")))
	if retryAfter > 0 {
		c.log.Warn("console: sign-in refused, too many wrong tokens from this address", "remote", r.RemoteAddr, "retry_after", retryAfter)
		ingress.WriteLockedOut(w, retryAfter)
		return
	}
	if !ok {
		c.log.Warn("console: sign-in with a wrong token", "remote", r.RemoteAddr)
		http.Redirect(w, r, Prefix+"login?failed=1", http.StatusSeeOther)
		return
	}
	v, exp := c.newSession()
	c.setCookie(w, r, v, exp)
	c.log.Info("console: signed in", "remote", r.RemoteAddr, "until", exp)
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// SignInCodeTTL bounds how long NewSignInCode's code lasts unused.
const SignInCodeTTL = time.Hour

// NewSignInCode returns a one-time sign-in code, good for one sign-in within
// SignInCodeTTL, and voids the one before. Open Prefix + "#code=" + the code: the
// sign-in page posts it as the form field "code" and drops it from the address bar and
// history; a fragment is never sent to a server, so it reaches no access log, proxy or
// Referer. It is 128 random bits, kept only as a hash in memory: it dies with the
// process. It is for printing at start (sluice serve does, once, for the token it
// generates), where the terminal can be trusted with it for a while but the token
// should not sit in logs for good.
func (c *Console) NewSignInCode() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)           // crypto/rand.Read never fails (Go 1.24)
	code := hex.EncodeToString(b) // no - or _ that would end a double-click selection
	c.codeMu.Lock()
	defer c.codeMu.Unlock()
	c.codeHash = sha256.Sum256([]byte(code))
	c.codeUntil = c.now().Add(SignInCodeTTL)
	return code
}

// useSignInCode reports whether code is the live one-time code, and voids it if so.
func (c *Console) useSignInCode(code string) bool {
	h := sha256.Sum256([]byte(code))
	c.codeMu.Lock()
	defer c.codeMu.Unlock()
	if c.codeHash == ([sha256.Size]byte{}) || !c.now().Before(c.codeUntil) || subtle.ConstantTimeCompare(h[:], c.codeHash[:]) != 1 {
		return false
	}
	c.codeHash = [sha256.Size]byte{}
	return true
}

// logout clears the cookie. The session value itself stays valid until it expires
// (sessions are not stored); rotating the admin token ends every session.
func (c *Console) logout(w http.ResponseWriter, r *http.Request, _ []byte) {
	c.setCookie(w, r, "", time.Time{})
	w.WriteHeader(http.StatusNoContent)
}

func (c *Console) asset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	var ctype string
	switch {
	case strings.HasSuffix(name, ".js"):
		ctype = "text/javascript; charset=utf-8"
	case strings.HasSuffix(name, ".css"):
		ctype = "text/css; charset=utf-8"
	default:
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(c.static, name)
	if err != nil {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write(b)
}

func (c *Console) session(w http.ResponseWriter, _ *http.Request, p []byte) {
	exp := time.Unix(int64(binary.BigEndian.Uint64(p)), 0).UTC()
	writeJSON(w, http.StatusOK, map[string]any{"csrf": c.csrfToken(p), "expires_at": exp})
}

// forward passes Prefix+"api/sluice/v1/…" to the admin API as "/sluice/v1/…" with the
// admin token. Other paths (/metrics among them) are not the console's.
func (c *Console) forward(w http.ResponseWriter, r *http.Request, _ []byte) {
	rest := strings.TrimPrefix(r.URL.Path, Prefix+"api")
	if !strings.HasPrefix(rest, "/sluice/v1/") {
		ingress.WriteProblem(w, http.StatusNotFound, "Not an admin API path.")
		return
	}
	r2 := r.Clone(r.Context())
	r2.URL.Path, r2.URL.RawPath = rest, ""
	r2.RequestURI = ""
	r2.Header.Del("Cookie")
	r2.Header.Del(CSRFHeader)
	r2.Header.Set("Authorization", "Bearer "+c.token)
	c.api.ServeHTTP(w, r2)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
