package ingress

import (
	"bufio"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/warn"
	"github.com/sluicehq/sluice/ingress/proxy"
)

// ProxyOption configures NewProxy.
type ProxyOption func(*proxyConfig)

type proxyConfig struct {
	log       *slog.Logger
	reg       prometheus.Registerer
	ids       *ClientIdentity
	timeout   time.Duration
	maxHeader int64
	// reuseAfter: how long a connection idles before it carries another request.
	reuseAfter time.Duration
	maxHold    time.Duration
}

// DefaultProxyMaxHold is how long after the proxy took a request it may still send it
// on, by default (see WithProxyMaxHold).
const DefaultProxyMaxHold = 10 * time.Second

// WithProxyMaxHold bounds how long after the proxy took a request it may still send it
// to the upstream (default DefaultProxyMaxHold). A request held longer (the process
// was stopped by SIGSTOP or a paused VM, or stalled; the upstream's connection took
// that long) is answered 503 with Retry-After and never sent: its client has most
// likely given up and sent it again elsewhere, and the upstream would get it twice.
// See ingress/proxy's WithMaxHold. It must be positive.
func WithProxyMaxHold(d time.Duration) ProxyOption { return func(c *proxyConfig) { c.maxHold = d } }

// DefaultProxyTimeout is how long the proxy waits, by default, for the upstream to
// begin its response once the request has been sent.
const DefaultProxyTimeout = proxy.DefaultResponseTimeout

// DefaultMaxUpstreamHeader is the largest response head the proxy reads by default
// (WithProxyMaxHeaderBytes).
const DefaultMaxUpstreamHeader = proxy.DefaultMaxHeaderBytes

// WithProxyLogger sets the proxy's logger (default slog.Default()).
func WithProxyLogger(l *slog.Logger) ProxyOption { return func(c *proxyConfig) { c.log = l } }

// WithProxyRegisterer registers the upstream metrics (sluice_upstream_requests_total,
// sluice_upstream_duration_seconds) on reg.
func WithProxyRegisterer(reg prometheus.Registerer) ProxyOption {
	return func(c *proxyConfig) { c.reg = reg }
}

// WithProxyClientIdentity keeps the chain of requests that come from trusted proxies,
// read from the header id reads (see WithForwardedHeader) and sent on as
// X-Forwarded-For; others start a new chain with their peer address.
func WithProxyClientIdentity(id *ClientIdentity) ProxyOption {
	return func(c *proxyConfig) { c.ids = id }
}

// WithProxyTimeout sets how long the upstream has to begin its response (its status
// line) once the request, body included, has been sent (default DefaultProxyTimeout);
// past it the client gets 504. It does not bound how long a response body may take to
// stream. It must be positive.
func WithProxyTimeout(d time.Duration) ProxyOption { return func(c *proxyConfig) { c.timeout = d } }

// WithProxyMaxHeaderBytes sets the largest response head the proxy reads from the
// upstream, in bytes (default DefaultMaxUpstreamHeader): the status line and header
// fields with any informational responses before them, or a chunked body's trailer
// section. Past it, and past it in a single line, the client gets 502 and the
// connection is closed; what a head takes in memory stays bounded whatever the
// upstream sends. It must be positive.
func WithProxyMaxHeaderBytes(n int64) ProxyOption { return func(c *proxyConfig) { c.maxHeader = n } }

// WithProxyReuseAfter makes a kept-alive connection to the upstream idle d, watched,
// before it carries another request (default 0: at once), so that bytes a broken
// upstream sends up to d after a response are seen as unsolicited (the connection is
// closed and the upstream distrusted) instead of being read as the answer to another
// client's request. It costs about the request rate times d connections more. See
// ingress/proxy's WithReuseAfter. It must not be negative.
func WithProxyReuseAfter(d time.Duration) ProxyOption {
	return func(c *proxyConfig) { c.reuseAfter = d }
}

// Proxy is the front door's reverse proxy to one upstream, an http.Handler. It speaks
// HTTP/1.1 to the upstream over a pool of keep-alive connections of its own (package
// ingress/proxy, whose documentation says when a connection is kept), writing each
// request and reading each response on the handler's goroutine, with no buffering of
// bodies beyond a copy buffer: the
// request body is streamed to the upstream as it is read from the client (a limit set
// by the middleware's WithMaxBody still applies: over it the client gets 413) and the
// response body is streamed to the client as it arrives, flushed whenever the upstream
// pauses. Request and response trailers are relayed; Expect: 100-continue is passed
// to the upstream, which decides whether the body is sent.
//
// Hop-by-hop headers (Connection and the headers it names, Keep-Alive,
// Proxy-Connection, Proxy-Authenticate, Proxy-Authorization, TE except "trailers",
// Trailer, Transfer-Encoding, Upgrade) are dropped both ways; Forwarded and
// X-Forwarded-* are set from the real client connection (see WithProxyClientIdentity);
// a client's Sluice-Ticket, which only the dispatcher sets, is dropped; the Host
// header is the one the client sent.
//
// Requests to switch protocols (Connection: upgrade, as WebSocket) and CONNECT are
// proxied by an httputil.ReverseProxy with the same rewriting, errors and metrics. An
// offer of h2c is never passed on: a request offering nothing else is proxied as an
// ordinary one, without Upgrade and HTTP2-Settings (see withoutH2C).
//
// When the upstream cannot be reached, breaks the exchange, sends a response whose
// length is ambiguous (Content-Length with Transfer-Encoding, two Content-Lengths)
// or a head over the limit (WithProxyMaxHeaderBytes) the client gets 502, when it
// does not begin its response in time 504, both with a problem body. A
// response that fails part-way through its body aborts the client's connection, so
// that the client sees a truncated response rather than a complete one.
type Proxy struct {
	pool      *proxy.Pool
	head      proxy.HeadWriter // writeHead
	upstream  *url.URL
	plainPath bool // the upstream URL has neither path nor query: requests keep theirs
	ids       *ClientIdentity
	log       *slog.Logger
	failures  *warn.Sometimes // "upstream request failed", once per warnInterval
	timeout   time.Duration
	maxHeader int64
	maxHold   time.Duration
	byClass   [len(statusClasses)]classMetrics
	upgrades  *httputil.ReverseProxy
	upgradeTr *http.Transport
}

// classMetrics are the upstream series of one status class, resolved once.
type classMetrics struct {
	requests prometheus.Counter
	duration prometheus.Observer
}

// errorClass is the index of the error class in statusClasses.
const errorClass = len(statusClasses) - 1

func classIndex(code int) int {
	if code < 100 || code > 599 {
		return errorClass
	}
	return code/100 - 1
}

// NewProxy returns a reverse proxy to upstream (see Proxy). It fails when upstream is
// not an absolute http or https URL, an option was given nil or a non-positive
// timeout, or the metrics cannot be registered (several proxies share the series of
// one registry).
func NewProxy(upstream *url.URL, opts ...ProxyOption) (*Proxy, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("ingress: proxy upstream %v is not an absolute URL", upstream)
	}
	if upstream.Scheme != "http" && upstream.Scheme != "https" {
		return nil, fmt.Errorf("ingress: proxy upstream %v: the scheme must be http or https", upstream)
	}
	cfg := proxyConfig{log: slog.Default(), timeout: DefaultProxyTimeout, maxHeader: DefaultMaxUpstreamHeader, maxHold: DefaultProxyMaxHold}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		return nil, errors.New("ingress: WithProxyLogger(nil)")
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("ingress: WithProxyTimeout(%v): the timeout must be positive", cfg.timeout)
	}
	if cfg.maxHold <= 0 {
		return nil, fmt.Errorf("ingress: WithProxyMaxHold(%v): the bound must be positive", cfg.maxHold)
	}
	if cfg.maxHeader <= 0 {
		return nil, fmt.Errorf("ingress: WithProxyMaxHeaderBytes(%d): the limit must be positive", cfg.maxHeader)
	}
	metrics, err := newUpstreamMetrics(cfg.reg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		failures:  warn.Every(warnInterval),
		upstream:  upstream,
		plainPath: (upstream.Path == "" || upstream.Path == "/") && upstream.RawQuery == "",
		ids:       cfg.ids,
		log:       cfg.log,
		timeout:   cfg.timeout,
		maxHeader: cfg.maxHeader,
		maxHold:   cfg.maxHold,
	}
	p.head = p.writeHead
	addr := upstream.Host
	if upstream.Port() == "" {
		port := "80"
		if upstream.Scheme == "https" {
			port = "443"
		}
		addr = net.JoinHostPort(upstream.Hostname(), port)
	}
	popts := []proxy.Option{proxy.WithLogger(cfg.log), proxy.WithResponseTimeout(cfg.timeout), proxy.WithMaxHeaderBytes(cfg.maxHeader), proxy.WithReuseAfter(cfg.reuseAfter), proxy.WithMaxHold(cfg.maxHold)}
	if upstream.Scheme == "https" {
		popts = append(popts, proxy.WithTLS(&tls.Config{ServerName: upstream.Hostname()}))
	}
	if p.pool, err = proxy.New(addr, popts...); err != nil {
		return nil, err
	}
	for i, class := range statusClasses {
		p.byClass[i] = classMetrics{metrics.requests.WithLabelValues(class), metrics.duration.WithLabelValues(class)}
	}
	p.upgrades = p.reverseProxy(metrics)
	return p, nil
}

// reverseProxy is the proxy of requests the pool does not carry: protocol switches
// (WebSocket) and CONNECT.
func (p *Proxy) reverseProxy(metrics *upstreamMetrics) *httputil.ReverseProxy {
	p.upgradeTr = &http.Transport{
		Proxy:                  nil, // the upstream is addressed directly, whatever the environment says
		DialContext:            p.pool.Dialer().DialContext,
		MaxIdleConnsPerHost:    16,
		IdleConnTimeout:        proxy.IdleExpiry,
		MaxResponseHeaderBytes: p.maxHeader,
		TLSHandshakeTimeout:    5 * time.Second,
		ExpectContinueTimeout:  time.Second,
		ResponseHeaderTimeout:  p.timeout,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(p.upstream)
			delete(pr.Out.Header, "Http2-Settings") // a hop header ReverseProxy does not know
			setForwarded(p.ids, pr.In, pr.Out.Header)
			pr.Out.Host = pr.In.Host // the upstream sees the host the client asked for
		},
		Transport:    instrumentedTransport{next: p.upgradeTr, metrics: metrics},
		ErrorHandler: p.fail,
	}
}

// warnInterval is how often a warning that each failing request repeats (an upstream
// down, the queues unreachable) is logged: once, then at most once per interval.
const warnInterval = 10 * time.Second

// fail answers the client when no response came from the upstream.
func (p *Proxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	if r.Context().Err() != nil {
		return // the client went away; nobody to answer
	}
	if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
		writeProblem(w, simpleProblem(http.StatusRequestEntityTooLarge,
			"The request body is larger than "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes."))
		return
	}
	if errors.Is(err, proxy.ErrClientBody) {
		writeProblem(w, simpleProblem(http.StatusBadRequest, "The request body could not be read."))
		return
	}
	if errors.Is(err, proxy.ErrHeldTooLong) {
		p.failures.Warn(p.log, "not forwarding a request held too long (this process stalled, or the upstream's connection took that long)",
			"max_hold", p.maxHold, "method", r.Method, "path", r.URL.Path)
		decide.SetRetryAfter(w.Header(), time.Second)
		writeProblem(w, simpleProblem(http.StatusServiceUnavailable,
			"The request was held too long before it could be sent on, and was not sent; retry."))
		return
	}
	p.failures.Warn(p.log, "upstream request failed", "err", err, "method", r.Method, "path", r.URL.Path)
	switch ne := net.Error(nil); {
	case errors.Is(err, proxy.ErrHeadTooLarge):
		writeProblem(w, simpleProblem(http.StatusBadGateway,
			"The upstream's response head is larger than "+strconv.FormatInt(p.maxHeader, 10)+" bytes."))
	case errors.Is(err, proxy.ErrBadResponse):
		writeProblem(w, simpleProblem(http.StatusBadGateway, "The upstream's response is not valid HTTP/1.1."))
	case errors.As(err, &ne) && ne.Timeout():
		writeProblem(w, simpleProblem(http.StatusGatewayTimeout, "The upstream did not answer in time."))
	default:
		writeProblem(w, simpleProblem(http.StatusBadGateway, "The upstream could not be reached."))
	}
}

// ServeHTTP proxies r to the upstream (see Proxy).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = withoutH2C(r)
	if r.Method == http.MethodConnect || proxy.HasToken(r.Header, "Connection", "upgrade") {
		p.upgrades.ServeHTTP(w, r)
		return
	}
	start := time.Now()
	res, err := p.pool.Exchange(r, p.head)
	if err != nil {
		p.observe(errorClass, start)
		p.fail(w, r, err)
		return
	}
	p.observe(classIndex(res.StatusCode), start)
	res.Relay(w, r)
}

// CloseIdleConnections closes the upstream connections that no request uses.
func (p *Proxy) CloseIdleConnections() {
	p.upgradeTr.CloseIdleConnections()
	p.pool.CloseIdleConnections()
}

func (p *Proxy) observe(class int, start time.Time) {
	m := &p.byClass[class]
	m.requests.Inc()
	m.duration.Observe(time.Since(start).Seconds())
}

// errBadHeader is a request header that cannot go on the wire as it is.
var errBadHeader = errors.New("ingress: a request header holds a line break or a NUL (or its name a colon or a space)")

// writeHead writes the request line and headers of the request forwarded for r, with
// a body (of r.ContentLength, chunked when -1) when hasBody. It fails when a header
// cannot be written as it is (never for the requests of an http.Server).
func (p *Proxy) writeHead(bw *bufio.Writer, r *http.Request, hasBody, expect bool) error {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	p.writeRequestURI(bw, r.URL)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	host := r.Host
	if host == "" {
		host = p.upstream.Host
	}
	bw.WriteString(host)
	bw.WriteString("\r\n")
	conn := r.Header["Connection"]
	for k, vv := range r.Header {
		switch k {
		case "Host", "Content-Length", "Expect":
			continue
		}
		if replacedHeaders[k] || proxy.HopByHop(k, conn) {
			continue
		}
		if strings.ContainsAny(k, "\r\n\x00: ") {
			return errBadHeader
		}
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n\x00") {
				return errBadHeader
			}
			proxy.WriteField(bw, k, v)
		}
	}
	if proxy.HasToken(r.Header, "Te", "trailers") {
		proxy.WriteField(bw, "Te", "trailers")
	}
	xff, fwdHost, proto := forwarded(p.ids, r)
	if xff != "" {
		proxy.WriteField(bw, "X-Forwarded-For", xff)
	}
	proxy.WriteField(bw, "X-Forwarded-Host", fwdHost)
	proxy.WriteField(bw, "X-Forwarded-Proto", proto)
	switch {
	case !hasBody:
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			// Some servers want a length on these methods (411 otherwise).
			proxy.WriteField(bw, "Content-Length", "0")
		}
	case r.ContentLength > 0:
		proxy.WriteField(bw, "Content-Length", strconv.FormatInt(r.ContentLength, 10))
	default:
		proxy.WriteField(bw, "Transfer-Encoding", "chunked")
		if len(r.Trailer) > 0 {
			proxy.WriteField(bw, "Trailer", strings.Join(slices.Sorted(maps.Keys(r.Trailer)), ", "))
		}
	}
	if expect {
		proxy.WriteField(bw, "Expect", "100-continue")
	}
	_, err := bw.WriteString("\r\n")
	return err
}

// writeRequestURI writes p.requestURI(u) to bw, without building the string when
// requests keep their path and query (u.RequestURI's bytes, written in parts).
func (p *Proxy) writeRequestURI(bw *bufio.Writer, u *url.URL) {
	if !p.plainPath || u.Opaque != "" {
		bw.WriteString(p.requestURI(u))
		return
	}
	if path := u.EscapedPath(); path != "" {
		bw.WriteString(path)
	} else {
		bw.WriteByte('/')
	}
	if u.ForceQuery || u.RawQuery != "" {
		bw.WriteByte('?')
		bw.WriteString(u.RawQuery)
	}
}

// requestURI is the request target of the request forwarded for u: u's path and
// query appended to the upstream URL's, as httputil.ProxyRequest.SetURL joins them.
func (p *Proxy) requestURI(u *url.URL) string {
	if p.plainPath {
		return u.RequestURI()
	}
	joined := strings.TrimSuffix(p.upstream.EscapedPath(), "/") + "/" + strings.TrimPrefix(u.EscapedPath(), "/")
	out := url.URL{Path: joined}
	if path, err := url.PathUnescape(joined); err == nil {
		out.Path, out.RawPath = path, joined
	}
	switch {
	case p.upstream.RawQuery == "" || u.RawQuery == "":
		out.RawQuery = p.upstream.RawQuery + u.RawQuery
	default:
		out.RawQuery = p.upstream.RawQuery + "&" + u.RawQuery
	}
	return out.RequestURI()
}

// withoutTokens sets header k of h to its comma-separated tokens other than drop (any
// case), joined in one value, or deletes it when none is left.
func withoutTokens(h http.Header, k string, drop ...string) {
	var rest []string
	for _, v := range h[k] {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" && !slices.ContainsFunc(drop, func(d string) bool { return strings.EqualFold(tok, d) }) {
				rest = append(rest, tok)
			}
		}
	}
	if len(rest) == 0 {
		delete(h, k)
		return
	}
	h[k] = []string{strings.Join(rest, ", ")}
}

// withoutH2C returns r, or when r's Upgrade offers h2c a copy of it that does not.
// An upstream that took the upgrade would carry HTTP/2 streams on the connection,
// requests that no rule decided. Refusing the request would break clients that offer
// h2c on the chance (curl --http2 on an http:// URL): a server that does not speak h2c
// ignores the offer and answers in HTTP/1.1 (RFC 9113 section 3.1 deprecated the
// upgrade), which is what the client gets here. With nothing else offered, the copy
// has no Upgrade and no Connection token for it, and goes through the pool as an
// ordinary request (which refuses a 101 answer); other protocols stay offered.
// HTTP2-Settings is dropped always (hopHeaders).
func withoutH2C(r *http.Request) *http.Request {
	if !proxy.HasToken(r.Header, "Upgrade", "h2c") {
		return r
	}
	r2 := r.WithContext(r.Context()) // a shallow copy
	r2.Header = r.Header.Clone()
	if withoutTokens(r2.Header, "Upgrade", "h2c"); r2.Header["Upgrade"] == nil {
		withoutTokens(r2.Header, "Connection", "upgrade", "http2-settings")
	}
	return r2
}

// replacedHeaders are a client's headers that never go on as it sent them: those that
// tell a server who asked and how, which setForwarded and writeHead write from the real
// connection, and Sluice-Ticket (ticketHeader).
var replacedHeaders = map[string]bool{
	"Forwarded": true, "X-Forwarded-For": true, "X-Forwarded-Host": true, "X-Forwarded-Proto": true,
	ticketHeader: true,
}

// ticketHeader is queue.HeaderTicket, which the dispatcher sets on the deliveries of
// parked orders so that a downstream may recognise one: a client's own is never passed
// on, neither proxied nor parked. (Package ingress does not import the queues.)
const ticketHeader = "Sluice-Ticket"

// setForwarded sets the forwarding headers of a request made on behalf of in, into out
// (see forwarded): the client's Forwarded and X-Forwarded-* are dropped, and so is its
// Sluice-Ticket. Proxied requests and parked (deferred) ones both get their headers
// from forwarded, so a downstream sees the same either way.
func setForwarded(ids *ClientIdentity, in *http.Request, out http.Header) {
	for h := range replacedHeaders {
		delete(out, h)
	}
	xff, host, proto := forwarded(ids, in)
	if xff != "" {
		out["X-Forwarded-For"] = []string{xff}
	}
	out["X-Forwarded-Host"] = []string{host}
	out["X-Forwarded-Proto"] = []string{proto}
}

// forwarded returns the values of X-Forwarded-For, -Host and -Proto for a request made
// on behalf of in, as httputil.ProxyRequest.SetXForwarded sets them: X-Forwarded-For is
// the peer address, appended to the chain the peer sent only when the peer is a
// trusted proxy (ids), in the header ids reads (Forwarded's for= addresses when the
// proxies write Forwarded: the chain the upstream gets is the one sluice believed),
// and empty (no header) when in's RemoteAddr is not host:port;
// X-Forwarded-Host is in's host, X-Forwarded-Proto "https" over TLS, else "http".
func forwarded(ids *ClientIdentity, in *http.Request) (xff, host, proto string) {
	if ip, _, err := net.SplitHostPort(in.RemoteAddr); err == nil {
		xff = ip
		if ids != nil && ids.peerTrusted(in) {
			if chain := ids.chain(in.Header); len(chain) > 0 {
				xff = strings.Join(chain, ", ") + ", " + ip
			}
		}
	}
	proto = "http"
	if in.TLS != nil {
		proto = "https"
	}
	return xff, in.Host, proto
}
