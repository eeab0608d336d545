package ingress

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/proxy"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/telemetry"
	"github.com/sluicehq/sluice/rules"
)

// RulesSource gives the active rules set; *watch.Watcher (rules/watch) is one.
type RulesSource interface {
	Set() *rules.Set
}

// StaticRules is a RulesSource that never changes.
type StaticRules struct{ S *rules.Set }

// Set implements RulesSource.
func (s StaticRules) Set() *rules.Set { return s.S }

// Deferrer parks a request that a defer rule found over its limit and answers the
// client: 202 Accepted once the request is stored, or an error status. Package
// ingress/deferral provides one, on the queue package; without a Deferrer, defer
// rules reject like reject rules.
type Deferrer interface {
	Defer(w http.ResponseWriter, r *http.Request, d Deferral)
}

// RepeatAnswerer is a Deferrer that tells a repeat of an order it accepted from a new
// request (ingress/deferral's is one). On a route that can defer, a request within
// its limits that carries an Idempotency-Key is first looked up: when an accepted order
// holds its key, it is answered as a repeat of that order's defer (202 with the
// ticket and its status, or 422 for another payload) and never proxied, so that the
// downstream does not get an order twice by two paths.
type RepeatAnswerer interface {
	// AnswerRepeat looks for the order that r's Idempotency-Key names in d's queue.
	// Found, it answers r and reports true; otherwise it writes nothing and returns
	// the request to proxy, its body intact (r, or a copy holding the body it read).
	AnswerRepeat(w http.ResponseWriter, r *http.Request, d Deferral) (*http.Request, bool)
}

// Deferral is what a Deferrer needs to park one request.
type Deferral struct {
	Queue *rules.Queue
	Rule  *rules.Rule
	// Client is the idempotency scope of the caller: a hash of its address group and
	// of the route's idempotency_scope sources (by default its Authorization and Cookie
	// headers), never a raw address or credential. Callers with different credentials
	// behind one address never share a key.
	Client string
	// Header is what to park of the request's header: the client's, with the
	// forwarding headers set as on a proxied request (nil: use the request's).
	Header http.Header
	// RetryAfter is when the request would have been allowed.
	RetryAfter time.Duration
	// Priority and Tenant are the values of the route's priority source and of the
	// queue's fair_by source (see rules.Route.Lane): they choose the order's lane.
	Priority string
	Tenant   string
	// Flow is the value of the queue's flow_by source (see rules.Queue.FlowKey): the
	// key whose own outflow the order waits for.
	Flow string
}

// ParkHeader is the header to park for r: d.Header, or when it is nil r's own header
// without its hop-by-hop headers, with the forwarding headers set as on a proxied
// request (peers not trusted).
func (d Deferral) ParkHeader(r *http.Request) http.Header {
	if d.Header != nil {
		return d.Header
	}
	return parkHeader(nil, r)
}

// parkHeader is the header to park for r, as a proxied request of r would carry it:
// r's own without its hop-by-hop headers (those Connection names included), then the
// forwarding headers set from the connection (see setForwarded). Hop-by-hop headers
// go first, as the proxy drops them: a client that names X-Forwarded-For in
// Connection must not have the queue drop the forwarding headers sluice set.
func parkHeader(ids *ClientIdentity, r *http.Request) http.Header {
	h := r.Header.Clone()
	conn := h["Connection"]
	for k := range h {
		if proxy.HopByHop(k, conn) {
			delete(h, k)
		}
	}
	setForwarded(ids, r, h)
	return h
}

// Middleware checks requests against rules. Create it with New.
type Middleware struct {
	rules    RulesSource
	engine   *decide.Engine
	ids      *ClientIdentity
	deferrer Deferrer
	shadow   bool
	maxBody  int64
	scopeKey []byte
	log      *slog.Logger
	reg      prometheus.Registerer
	tp       trace.TracerProvider
	tracer   trace.Tracer // nil: tracing off

	checks sync.Pool // *[]rules.Check, reused across requests
	scopes sync.Pool // *scopeHash, reused across requests
}

// Option configures a Middleware.
type Option func(*Middleware)

// WithClientIdentity sets how client addresses are found (default: the peer address,
// no trusted proxies, IPv6 grouped by /64).
func WithClientIdentity(id *ClientIdentity) Option { return func(m *Middleware) { m.ids = id } }

// WithDeferrer sets what parks requests of defer rules.
func WithDeferrer(d Deferrer) Option { return func(m *Middleware) { m.deferrer = d } }

// WithShadow puts every rule in shadow mode: decisions are computed, counted and
// logged, never enforced.
func WithShadow(on bool) Option { return func(m *Middleware) { m.shadow = on } }

// WithMaxBody caps request bodies: larger ones are answered 413 (default 10 MiB; 0 or
// less means no cap).
func WithMaxBody(n int64) Option { return func(m *Middleware) { m.maxBody = n } }

// WithIdempotencyScopeKey keys the hash that names idempotency scopes (HMAC-SHA256)
// with a secret every replica shares, so that what is stored in NATS cannot be tested
// against guessed credentials. Without it the hash is a plain SHA-256.
func WithIdempotencyScopeKey(key []byte) Option {
	return func(m *Middleware) { m.scopeKey = slices.Clone(key) }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(m *Middleware) { m.log = l } }

// WithRegisterer registers the middleware's metrics on reg (see decide.NewMetrics:
// several middlewares, and the Envoy services, share the series of one registry).
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(m *Middleware) { m.reg = reg }
}

// WithTracerProvider sets where the decision spans go (default otel.GetTracerProvider(),
// which records nothing until the program sets a provider). Each request that a rule
// applies to gets a span "sluice.decide", a child of the request's W3C traceparent (or
// of the span already in its context), with the attributes sluice.route, sluice.rule
// (the rule that decided: the one over its limit, else the one closest to it) and
// sluice.outcome; never a client's address or key. A deferred request's context, this
// span's, goes to the Deferrer. noop.NewTracerProvider() turns tracing off at no cost
// per request; the global provider, while none is set, costs two small allocations.
func WithTracerProvider(tp trace.TracerProvider) Option { return func(m *Middleware) { m.tp = tp } }

// DefaultMaxBody is the default request body cap.
const DefaultMaxBody = 10 << 20

// New returns a Middleware deciding with lim on the rules src provides. It fails when
// src or lim is nil, an option was given nil, or the metrics cannot be registered.
func New(src RulesSource, lim limiter.Limiter, opts ...Option) (*Middleware, error) {
	if src == nil || lim == nil {
		return nil, errors.New("ingress: New needs a rules source and a limiter")
	}
	ids, err := NewClientIdentity(nil, 0)
	if err != nil {
		return nil, err
	}
	m := &Middleware{rules: src, ids: ids, maxBody: DefaultMaxBody, log: slog.Default()}
	for _, o := range opts {
		o(m)
	}
	switch {
	case m.ids == nil:
		return nil, errors.New("ingress: WithClientIdentity(nil)")
	case m.log == nil:
		return nil, errors.New("ingress: WithLogger(nil)")
	}
	if m.engine, err = decide.New(lim, decide.WithShadow(m.shadow), decide.WithLogger(m.log), decide.WithRegisterer(m.reg)); err != nil {
		return nil, fmt.Errorf("ingress: %w", err)
	}
	m.tracer = telemetry.Tracer(m.tp)
	m.checks.New = func() any { s := make([]rules.Check, 0, 8); return &s }
	m.scopes.New = func() any { return newScopeHash(m.scopeKey) }
	return m, nil
}

// Wrap returns a handler that decides each request before next sees it. Requests that
// no route matches pass untouched.
func (m *Middleware) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next, "", false) })
}

// Authorize decides r as Wrap would, for an authorization check that a proxy (Envoy
// ext_authz, nginx auth_request, Traefik ForwardAuth) makes on behalf of a request it
// holds. It reports whether r may pass, having set on w the rate-limit headers for the
// proxy to add to the response; otherwise it has answered on w what the proxy should
// send the client: a 429 problem, or the 202 of an order parked by a defer rule.
// noPark, when not empty, says why r must not be parked (its body did not reach sluice
// whole, or the proxy would take a 202 for "allowed"): a defer rule over its limit then
// answers 429 with that in the problem's detail, and a request asking for scheduled
// delivery (Sluice-Not-Before) 400.
//
// A path that is not in normal form (CheckNormalPath: `//`, `.` or `..` segments,
// encoded dots, slashes or backslashes) is refused with a 400 problem saying why,
// whatever the rules: sluice would decide on the cleaned path while the proxy routes
// and forwards the one it holds (`/v1/orders/../../admin` counted as /admin). A proxy
// that normalises paths first (Envoy's normalize_path and merge_slashes) never sends
// one.
func (m *Middleware) Authorize(w http.ResponseWriter, r *http.Request, noPark string) bool {
	if err := CheckNormalPath(r.URL.EscapedPath()); err != nil {
		writeProblem(w, simpleProblem(http.StatusBadRequest, notNormalDetail(err)))
		return false
	}
	allowed := false
	m.serve(w, r, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { allowed = true }), noPark, true)
	return allowed
}

// serve decides r and answers it or passes it to next. check is set for Authorize,
// which cannot hold a request for a wait rule's slot (see answerWait).
func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler, noPark string, check bool) {
	r, ok := m.capBody(w, r)
	if !ok {
		return
	}
	set := m.rules.Set()
	m.engine.Use(set)
	x := exchange{w: w, r: r, next: next, noPark: noPark, check: check}
	var clientIP netip.Addr // the zero Addr when no rule reads it
	if set.ReadsClientAddr() {
		clientIP = m.client(&x).Addr()
	}
	buf := m.checks.Get().(*[]rules.Check)
	defer m.checks.Put(buf)
	x.route, x.checks = set.Match(r, clientIP, (*buf)[:0])
	*buf = x.checks[:0]
	if err := set.Repeated(r, x.route); err != nil {
		writeProblem(w, repeatedProblem(err))
		return
	}
	if x.route == nil || len(x.checks) == 0 {
		m.passUnruled(w, r, next)
		return
	}
	ctx := r.Context()
	var span trace.Span
	if m.tracer != nil {
		ctx, span = m.startDecision(r)
	}
	// Over a defer rule, a request is parked only with a deferrer and a body that
	// reached sluice whole; otherwise it is refused, and counted so.
	parks := m.deferrer != nil && noPark == ""
	v := m.decide(ctx, &x, parks)
	deferring := parks && v.Violated != nil && v.Violated.Parks()
	if span != nil {
		endDecision(span, x.route, &v, deferring)
	}
	switch {
	case v.Violated == nil && m.scheduled(r):
		m.schedule(&x)
	case v.Violated == nil:
		m.pass(ctx, &x, &v)
	case deferring:
		if span != nil {
			x.r = r.WithContext(ctx) // the park's span is the decision's child
		}
		m.park(&x, &v)
	default:
		m.refuse(&x, &v)
	}
}

// exchange is the request serve decides and what its steps share about it.
type exchange struct {
	w      http.ResponseWriter
	r      *http.Request
	next   http.Handler
	noPark string // why r must not be parked (see Authorize); "" when it may be
	check  bool   // for Authorize: a wait rule's slot cannot be held
	route  *rules.Route
	checks []rules.Check

	client      netip.Prefix // see Middleware.client
	clientFound bool
}

// client returns x's client address group (ClientIdentity.Group of its Addr), found
// on first use: a request that no rule counts by its address and that is not parked
// needs none.
func (m *Middleware) client(x *exchange) netip.Prefix {
	if !x.clientFound {
		x.client, x.clientFound = m.ids.Group(m.ids.Addr(x.r)), true
	}
	return x.client
}

// capBody caps r's body at the middleware's maximum. A body declared larger is
// answered 413 and capBody reports false; otherwise it returns the request to go on
// with: r, or a copy of r whose body reads at most the maximum.
func (m *Middleware) capBody(w http.ResponseWriter, r *http.Request) (*http.Request, bool) {
	if m.maxBody <= 0 {
		return r, true
	}
	if r.ContentLength > m.maxBody {
		writeProblem(w, simpleProblem(http.StatusRequestEntityTooLarge,
			"The request body is larger than "+strconv.FormatInt(m.maxBody, 10)+" bytes."))
		return nil, false
	}
	if r.Body == nil || r.Body == http.NoBody {
		// A request without a body (most GETs) has nothing to cap: the wrapper
		// would be an allocation per request.
		return r, true
	}
	// The capped body goes on a copy of r: net/http's server looks at the request's
	// own Body after the handler (to tell an unread Expect: 100-continue body, which
	// it must not wait for, from one it may drain), and a handler must not modify r.
	capped := *r
	capped.Body = http.MaxBytesReader(w, r.Body, m.maxBody)
	return &capped, true
}

// scheduled reports whether r asks for a delivery time that a deferrer can honour.
func (m *Middleware) scheduled(r *http.Request) bool {
	return m.deferrer != nil && r.Header[HeaderNotBefore] != nil
}

// passUnruled passes to next a request that no rule applies to, unless it asks for
// scheduled delivery: nothing would park it, and passed on it would be delivered now,
// before the time it asks for (as on a route whose rules defer into no queue), so it
// is answered 400.
func (m *Middleware) passUnruled(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.scheduled(r) {
		writeProblem(w, simpleProblem(http.StatusBadRequest,
			HeaderNotBefore+" asks for scheduled delivery, but no rule applies to this request to defer it into a queue."))
		return
	}
	next.ServeHTTP(w, r)
}

// decide decides x's checks, reserves the slots of its wait rules when it is within
// its limits and is not to be scheduled, and sets the rate-limit headers of the limit
// closest to running out.
func (m *Middleware) decide(ctx context.Context, x *exchange, parks bool) decide.Verdict {
	v := m.engine.Decide(ctx, &decide.Request{Checks: x.checks, Hold: true, RejectOnly: !parks})
	if v.Violated == nil && !m.scheduled(x.r) {
		m.engine.Reserve(ctx, x.checks, &v)
	}
	if v.ClosestRule != nil {
		v.Fields().SetHeaders(x.w.Header())
	}
	return v
}

// schedule parks a request within its limits that asks for a delivery time: a client
// that asks for one wants its order queued, over the limit or not, in the queue of the
// route's defer rule. Without such a rule, or when x must not be parked, it is
// answered 400.
func (m *Middleware) schedule(x *exchange) {
	rule := schedulingRule(x.checks)
	switch {
	case rule == nil:
		writeProblem(x.w, simpleProblem(http.StatusBadRequest,
			HeaderNotBefore+" asks for scheduled delivery, but no rule of this route defers into a queue."))
	case x.noPark != "":
		writeProblem(x.w, simpleProblem(http.StatusBadRequest, HeaderNotBefore+" asks for scheduled delivery, but "+x.noPark))
	default: // in its lane, as over the limit
		m.deferrer.Defer(x.w, x.r, m.deferral(x.route, rule, x.r, m.client(x)))
	}
}

// pass passes a request within its limits to next: unless it repeats an order the
// queue holds (see RepeatAnswerer), once it holds the slots of its wait rules, or,
// for Authorize, answers how long to wait for them (see answerWait).
func (m *Middleware) pass(ctx context.Context, x *exchange, v *decide.Verdict) {
	if m.answeredRepeat(ctx, x, v) {
		return
	}
	switch {
	case !v.Holding():
	case x.check && v.Wait > 0:
		m.answerWait(ctx, x.w, v)
		return
	case !m.engine.Hold(x.r.Context(), v):
		return // the client went away; its slots were given back
	default:
		x.w.Header().Set(HeaderWaited, formatWaited(v.Wait))
	}
	x.next.ServeHTTP(x.w, x.r)
}

// answeredRepeat reports whether the deferrer answered x as the repeat of an order
// the queue holds under its Idempotency-Key: its places among max_waiting and its
// slots then go back, as it is not held. Otherwise x.r is the request to proxy, its
// body intact.
func (m *Middleware) answeredRepeat(ctx context.Context, x *exchange, v *decide.Verdict) bool {
	ra, ok := m.deferrer.(RepeatAnswerer)
	if !ok || x.noPark != "" || x.r.Header["Idempotency-Key"] == nil {
		return false
	}
	rule := schedulingRule(x.checks)
	if rule == nil {
		return false
	}
	var answered bool
	if x.r, answered = ra.AnswerRepeat(x.w, x.r, m.deferral(x.route, rule, x.r, m.client(x))); answered {
		m.engine.Cancel(ctx, v)
	}
	return answered
}

// park hands a request over a defer rule's limit to the deferrer.
func (m *Middleware) park(x *exchange, v *decide.Verdict) {
	d := m.deferral(x.route, v.Violated, x.r, m.client(x))
	d.RetryAfter = v.RetryAfter
	m.deferrer.Defer(x.w, x.r, d)
}

// refuse answers a request over a limit 429 with its Retry-After, saying when a
// defer rule's request could not be parked why.
func (m *Middleware) refuse(x *exchange, v *decide.Verdict) {
	m.log.Debug("rate limited", "rule", v.Violated.Name, "route", x.route.Name,
		"client", clientHash(m.client(x)), "retry_after", v.RetryAfter)
	decide.SetRetryAfter(x.w.Header(), v.RetryAfter)
	p := quotaExceeded(v.ViolatedNames, v.Closest.Limit, v.RetryAfter)
	if v.Violated.Parks() && x.noPark != "" {
		p.Detail += " The rule defers requests over its limit, but " + x.noPark
	}
	writeProblem(x.w, p)
}

// notNormalDetail is the problem detail of a check whose path CheckNormalPath refuses.
func notNormalDetail(err error) string {
	return "The request's path is not in normal form (" + strings.TrimPrefix(err.Error(), ErrPathNotNormal.Error()+": ") +
		"): sluice decides on the normalised path, which may name another resource than the one the proxy routes and forwards. " +
		"Normalise paths in the proxy (Envoy: normalize_path, merge_slashes, path_with_escaped_slashes_action) or send the normal form."
}

// repeatedProblem is the 400 for a request that gives a rate-limit key more than one
// value, or gives one a route's match compares more than one (rules.Set.Repeated):
// deciding on one of them while the upstream may read another would let a client be
// counted on a key, or take a route, of its choosing.
func repeatedProblem(err error) problem {
	var re *rules.RepeatedError
	if !errors.As(err, &re) {
		return simpleProblem(http.StatusBadRequest, err.Error())
	}
	kind, name, _ := strings.Cut(re.Source, ":")
	what := "header " + name
	if kind == "query" {
		what = "query parameter " + name
	}
	how := "is sent more than once"
	if re.Comma {
		how = "holds a comma-separated list"
	}
	return simpleProblem(http.StatusBadRequest, "The request's "+what+" "+how+
		", but sluice chooses the route or the rate-limit key by it and takes exactly one value: send "+name+" once, with one value.")
}

// deferral is what Defer needs to park r by rule of route: its queue, the client's
// idempotency scope, the header as a proxied request would carry it, and its lane (the
// route's priority, the queue's tenant).
func (m *Middleware) deferral(route *rules.Route, rule *rules.Rule, r *http.Request, client netip.Prefix) Deferral {
	priority, tenant := route.Lane(r, client.Addr(), rule.Queue)
	return Deferral{Queue: rule.Queue, Rule: rule, Client: m.idempotencyScope(route, r, client),
		Header: parkHeader(m.ids, r), Priority: priority, Tenant: tenant, Flow: rule.Queue.FlowKey(r, client.Addr())}
}

// HeaderNotBefore is the request header by which a client asks that its order be
// delivered not before a time: an HTTP-date, or a number of seconds from now. A
// request carrying it on a route with a defer rule is parked in that rule's queue
// whether or not it is over the limit (the queue's max_delay bounds the time); on a
// route without one it is refused (400). Package ingress/deferral reads the value.
const HeaderNotBefore = "Sluice-Not-Before"

// schedulingRule returns the rule whose queue takes a scheduled request of a route:
// the first defer rule whose queue has a max_delay, else the first defer rule (its
// queue then refuses the time, naming itself), else nil.
func schedulingRule(checks []rules.Check) *rules.Rule {
	var first *rules.Rule
	for i := range checks {
		r := checks[i].Rule
		if r.OnLimit != rules.Defer || r.Queue == nil {
			continue
		}
		if r.Queue.MaxDelay > 0 {
			return r
		}
		if first == nil {
			first = r
		}
	}
	return first
}

// startDecision starts the decision span of r: a child of the span in r's context, else
// of the request's traceparent.
func (m *Middleware) startDecision(r *http.Request) (context.Context, trace.Span) {
	ctx := r.Context()
	// Looked up by canonical name first: Extract's lower-case lookup costs an
	// allocation, which requests without a traceparent need not pay.
	if len(r.Header["Traceparent"]) > 0 && !trace.SpanContextFromContext(ctx).IsValid() {
		ctx = telemetry.TraceContext.Extract(ctx, propagation.HeaderCarrier(r.Header))
	}
	return m.tracer.Start(ctx, "sluice.decide")
}

// endDecision describes verdict v on span and ends it. Attributes are built only for a
// recording span.
func endDecision(span trace.Span, route *rules.Route, v *decide.Verdict, deferring bool) {
	if span.IsRecording() {
		outcome, rule := decide.OutcomeAllowed, ""
		switch {
		case v.Violated != nil && deferring:
			outcome, rule = decide.OutcomeDeferred, v.Violated.Name
		case v.Violated != nil:
			outcome, rule = decide.OutcomeRejected, v.Violated.Name
		case v.ClosestRule != nil:
			rule = v.ClosestRule.Name
		}
		span.SetAttributes(
			attribute.String("sluice.route", route.Name),
			attribute.String("sluice.rule", rule),
			attribute.String("sluice.outcome", outcome),
		)
	}
	span.End()
}

// idempotencyScope names the caller of r for Idempotency-Key scoping: a hash of its
// address group and of the route's idempotency_scope sources (rules.Route.WriteScope).
func (m *Middleware) idempotencyScope(rt *rules.Route, r *http.Request, client netip.Prefix) string {
	sh := m.scopes.Get().(*scopeHash)
	defer m.scopes.Put(sh)
	sh.h.Reset()
	_, _ = sh.WriteString("sluice idempotency scope v1\x00")
	rt.WriteScope(sh, r, client.Addr())
	sh.buf, _ = client.AppendText(sh.buf[:0])
	sh.h.Write(sh.buf)
	sh.buf = sh.h.Sum(sh.buf[:0])
	return hex.EncodeToString(sh.buf[:16])
}

// scopeHash is the hash of idempotency scopes (HMAC-SHA256 under the scope key, or
// SHA-256) with a small scratch buffer, reused across requests: a string written to
// it is hashed through the buffer, a piece at a time, rather than converted (so a
// long header value does not grow what the pool keeps).
type scopeHash struct {
	h   hash.Hash
	buf []byte // 64 bytes or more of capacity
}

func (s *scopeHash) Write(p []byte) (int, error) { return s.h.Write(p) }

func (s *scopeHash) WriteString(v string) (int, error) {
	n := len(v)
	for len(v) > 0 {
		k := min(len(v), cap(s.buf))
		s.buf = append(s.buf[:0], v[:k]...)
		s.h.Write(s.buf)
		v = v[k:]
	}
	return n, nil
}

// newScopeHash returns a scopeHash keyed with key (none: SHA-256).
func newScopeHash(key []byte) *scopeHash {
	sh := &scopeHash{h: sha256.New(), buf: make([]byte, 0, 64)}
	if len(key) > 0 {
		sh.h = hmac.New(sha256.New, key)
	}
	return sh
}

// clientHash names a client in logs without its address.
func clientHash(p netip.Prefix) string {
	b, _ := p.MarshalText()
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}
