package ingress

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/internal/warn"
)

// ProxyOption configures NewProxy.
type ProxyOption func(*proxyConfig)

type proxyConfig struct {
	log     *slog.Logger
	reg     prometheus.Registerer
	ids     *ClientIdentity
	timeout time.Duration
}

// DefaultProxyTimeout is how long the proxy waits, by default, for the upstream to
// begin its response once the request has been sent.
const DefaultProxyTimeout = 60 * time.Second

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

// Proxy is the front door's reverse proxy to one upstream, an http.Handler. It speaks
// HTTP/1.1 to the upstream over a pool of keep-alive connections of its own, writing
// each request and reading each response on the handler's goroutine, with no
// per-connection goroutines and no buffering of bodies beyond a copy buffer: the
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
// When the upstream cannot be reached or breaks the exchange the client gets 502,
// when it does not begin its response in time 504, both with a problem body. A
// response that fails part-way through its body aborts the client's connection, so
// that the client sees a truncated response rather than a complete one.
type Proxy struct {
	addr       string      // host:port to dial
	tlsConfig  *tls.Config // nil: plain HTTP
	upstream   *url.URL
	plainPath  bool // the upstream URL has neither path nor query: requests keep theirs
	ids        *ClientIdentity
	log        *slog.Logger
	failures   *warn.Sometimes // "upstream request failed", once per warnInterval
	timeout    time.Duration
	dialer     net.Dialer
	byClass    [len(statusClasses)]classMetrics
	upgrades   *httputil.ReverseProxy
	upgradeTr  *http.Transport
	copyBufs   sync.Pool
	mu         sync.Mutex
	idle       []*upstreamConn // most recently used last
	maxIdle    int
	idleExpiry time.Duration
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
	cfg := proxyConfig{log: slog.Default(), timeout: DefaultProxyTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		return nil, errors.New("ingress: WithProxyLogger(nil)")
	}
	if cfg.timeout <= 0 {
		return nil, fmt.Errorf("ingress: WithProxyTimeout(%v): the timeout must be positive", cfg.timeout)
	}
	metrics, err := newUpstreamMetrics(cfg.reg)
	if err != nil {
		return nil, err
	}
	p := &Proxy{
		failures:   warn.Every(warnInterval),
		upstream:   upstream,
		plainPath:  (upstream.Path == "" || upstream.Path == "/") && upstream.RawQuery == "",
		ids:        cfg.ids,
		log:        cfg.log,
		timeout:    cfg.timeout,
		dialer:     net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle:    512,
		idleExpiry: 90 * time.Second,
	}
	p.addr = upstream.Host
	if upstream.Port() == "" {
		port := "80"
		if upstream.Scheme == "https" {
			port = "443"
		}
		p.addr = net.JoinHostPort(upstream.Hostname(), port)
	}
	if upstream.Scheme == "https" {
		// HTTP/1.1 only: the pool speaks nothing else.
		p.tlsConfig = &tls.Config{ServerName: upstream.Hostname(), NextProtos: []string{"http/1.1"}}
	}
	for i, class := range statusClasses {
		p.byClass[i] = classMetrics{metrics.requests.WithLabelValues(class), metrics.duration.WithLabelValues(class)}
	}
	p.copyBufs.New = func() any { b := make([]byte, 32<<10); return &b }
	p.upgrades = p.reverseProxy(metrics)
	return p, nil
}

// reverseProxy is the proxy of requests the pool does not carry: protocol switches
// (WebSocket) and CONNECT.
func (p *Proxy) reverseProxy(metrics *upstreamMetrics) *httputil.ReverseProxy {
	p.upgradeTr = &http.Transport{
		Proxy:                 nil, // the upstream is addressed directly, whatever the environment says
		DialContext:           p.dialer.DialContext,
		MaxIdleConnsPerHost:   16,
		IdleConnTimeout:       p.idleExpiry,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: p.timeout,
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
	var bad *clientBodyError
	if errors.As(err, &bad) {
		writeProblem(w, simpleProblem(http.StatusBadRequest, "The request body could not be read."))
		return
	}
	p.failures.Warn(p.log, "upstream request failed", "err", err, "method", r.Method, "path", r.URL.Path)
	if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		writeProblem(w, simpleProblem(http.StatusGatewayTimeout, "The upstream did not answer in time."))
		return
	}
	writeProblem(w, simpleProblem(http.StatusBadGateway, "The upstream could not be reached."))
}

// clientBodyError is a failure to read the client's request body; it wraps the
// http.MaxBytesError of a body over the limit.
type clientBodyError struct{ err error }

func (e *clientBodyError) Error() string { return "reading the request body: " + e.err.Error() }
func (e *clientBodyError) Unwrap() error { return e.err }

// upstreamConn is one pooled connection to the upstream.
type upstreamConn struct {
	conn      net.Conn
	raw       net.Conn // the TCP connection under conn (the same without TLS)
	br        *bufio.Reader
	bw        *bufio.Writer
	idleSince time.Time
	reused    bool
}

// aLongTimeAgo is a deadline in the past: setting it makes blocked reads and writes
// of a connection return at once.
var aLongTimeAgo = time.Unix(1, 0)

// ServeHTTP proxies r to the upstream (see Proxy).
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r = withoutH2C(r)
	if r.Method == http.MethodConnect || headerHasToken(r.Header, "Connection", "upgrade") {
		p.upgrades.ServeHTTP(w, r)
		return
	}
	ctx := r.Context()
	start := time.Now()
	for attempt := 0; ; attempt++ {
		c, err := p.get(ctx)
		if err != nil {
			p.observe(errorClass, start)
			p.fail(w, r, err)
			return
		}
		res, err := p.exchange(ctx, c, r)
		if err == nil {
			p.observe(classIndex(res.resp.StatusCode), start)
			p.relay(w, r, c, res)
			return
		}
		_ = c.conn.Close()
		if attempt == 0 && res.retryable && c.reused && ctx.Err() == nil {
			continue // a kept-alive connection the upstream had closed: once more on a new one
		}
		p.observe(errorClass, start)
		p.fail(w, r, err)
		return
	}
}

func (p *Proxy) observe(class int, start time.Time) {
	m := &p.byClass[class]
	m.requests.Inc()
	m.duration.Observe(time.Since(start).Seconds())
}

// get returns an idle connection that is still open, or a new one.
func (p *Proxy) get(ctx context.Context) (*upstreamConn, error) {
	now := time.Now()
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.idle[n-1]
		p.idle[n-1] = nil
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		idle := now.Sub(c.idleSince)
		// A connection idle for a while may have been closed by the upstream (its
		// keep-alive timeout), and one the upstream wrote on after its response (a
		// second response nobody asked for, even a moment later) holds bytes that would
		// be read as this request's response: look before using it, however short the
		// idle time, so that neither happens.
		if idle < p.idleExpiry && connAlive(c.raw) {
			c.reused = true
			return c, nil
		}
		_ = c.conn.Close()
	}
	conn, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	c := &upstreamConn{conn: conn, raw: conn}
	if p.tlsConfig != nil {
		tc := tls.Client(conn, p.tlsConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = conn.Close()
			return nil, err
		}
		c.conn = tc
	}
	c.br = bufio.NewReaderSize(c.conn, 4096)
	c.bw = bufio.NewWriterSize(c.conn, 4096)
	return c, nil
}

// put returns c to the pool, or closes it when the pool is full. The pool is used
// last in, first out, so that connections beyond what the load needs age at its
// bottom: each put closes the oldest one when it has been idle too long.
func (p *Proxy) put(c *upstreamConn) {
	c.idleSince = time.Now()
	var stale *upstreamConn
	p.mu.Lock()
	if len(p.idle) > 0 && c.idleSince.Sub(p.idle[0].idleSince) > p.idleExpiry {
		stale = p.idle[0]
		p.idle = slices.Delete(p.idle, 0, 1)
	}
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		c = nil
	}
	p.mu.Unlock()
	for _, dead := range []*upstreamConn{stale, c} {
		if dead != nil {
			_ = dead.conn.Close()
		}
	}
}

// CloseIdleConnections closes the pooled connections that no request uses.
func (p *Proxy) CloseIdleConnections() {
	p.upgradeTr.CloseIdleConnections()
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.conn.Close()
	}
}

// exchanged is what exchange got from the upstream.
type exchanged struct {
	resp *http.Response
	// stop detaches the connection from the client's context; false when the
	// context was done first (the connection's deadline is then in the past).
	stop func() bool
	// retryable: nothing of the request can have reached the upstream's handler,
	// or the request may be sent twice, and nothing of a response was read.
	retryable bool
	// bodyUnsent: the upstream answered before the request body was sent, so the
	// connection cannot carry another request.
	bodyUnsent bool
}

// exchange sends r on c and reads the response's head.
func (p *Proxy) exchange(ctx context.Context, c *upstreamConn, r *http.Request) (exchanged, error) {
	conn := c.conn
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(aLongTimeAgo) })
	res := exchanged{stop: stop}
	fail := func(err error) (exchanged, error) {
		stop()
		return res, err
	}
	hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
	expect := hasBody && headerHasToken(r.Header, "Expect", "100-continue")
	if err := p.writeHead(c.bw, r, hasBody, expect); err != nil {
		return fail(err)
	}
	if expect {
		// Let the upstream decide whether it wants the body: wait a while for its
		// answer before sending it, as a client would.
		if err := c.bw.Flush(); err != nil {
			res.retryable = true // nothing of the body was read
			return fail(err)
		}
		setReadDeadline(ctx, conn, time.Now().Add(time.Second))
		_, err := c.br.Peek(1)
		clearReadDeadline(ctx, conn)
		if err == nil {
			resp, err := p.readResponse(c, r, true)
			if err != nil {
				return fail(err)
			}
			if resp.StatusCode != http.StatusContinue {
				res.resp, res.bodyUnsent = resp, true
				return res, nil
			}
		} else if ne := net.Error(nil); !errors.As(err, &ne) || !ne.Timeout() || ctx.Err() != nil {
			res.retryable = true
			return fail(err)
		}
	}
	if hasBody {
		if err := p.writeBody(c.bw, r); err != nil {
			var bodyErr *clientBodyError
			if errors.As(err, &bodyErr) {
				return fail(err)
			}
			// The upstream may have answered before reading the whole body (a 413 of
			// its own): that answer is better than a 502.
			setReadDeadline(ctx, conn, time.Now().Add(time.Second))
			resp, rerr := p.readResponse(c, r, false)
			clearReadDeadline(ctx, conn)
			if rerr != nil {
				return fail(err)
			}
			res.resp, res.bodyUnsent = resp, true
			return res, nil
		}
	}
	if err := c.bw.Flush(); err != nil {
		res.retryable = !hasBody
		return fail(err)
	}
	setReadDeadline(ctx, conn, time.Now().Add(p.timeout))
	resp, err := p.readResponse(c, r, false)
	if err != nil {
		// Nothing came back at all: the upstream closed a kept-alive connection
		// under the request. Only a request that may be repeated is sent again.
		res.retryable = !hasBody && idempotent(r.Method) && c.br.Buffered() == 0 &&
			(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err))
		return fail(err)
	}
	clearReadDeadline(ctx, conn)
	res.resp = resp
	return res, nil
}

// setReadDeadline sets conn's read deadline to t, unless ctx is done: the deadline in
// the past that ctx's end set (maybe just before) must stay, or a cancelled request
// would wait out t.
func setReadDeadline(ctx context.Context, conn net.Conn, t time.Time) {
	_ = conn.SetReadDeadline(t)
	if ctx.Err() != nil {
		_ = conn.SetDeadline(aLongTimeAgo)
	}
}

// clearReadDeadline lifts conn's read deadline, unless ctx is done (see setReadDeadline).
func clearReadDeadline(ctx context.Context, conn net.Conn) { setReadDeadline(ctx, conn, time.Time{}) }

// readResponse reads the next final response from c, skipping informational ones
// (other than 100 Continue when continued is true).
func (p *Proxy) readResponse(c *upstreamConn, r *http.Request, continued bool) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(c.br, r)
		if err != nil {
			return nil, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("ingress: the upstream switched protocols on a request that did not ask to")
		case resp.StatusCode >= 200 || continued && resp.StatusCode == http.StatusContinue:
			return resp, nil
		}
	}
}

func idempotent(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// hopHeaders are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), and never go through the proxy; Host, Content-Length and
// Expect the proxy writes itself.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// HTTP/2's upgrade settings are for the connection that would switch (RFC 7540
	// section 3.2.1), whether Connection names them or not.
	"Http2-Settings": true,
}

// skipHeader reports whether header k of a message whose Connection header is conn
// stays out of the forwarded message.
func skipHeader(k string, conn []string) bool {
	if hopHeaders[k] {
		return true
	}
	for _, v := range conn {
		for tok := range strings.SplitSeq(v, ",") {
			if textproto.CanonicalMIMEHeaderKey(strings.TrimSpace(tok)) == k {
				return true
			}
		}
	}
	return false
}

// errBadHeader is a request header that cannot go on the wire as it is.
var errBadHeader = errors.New("ingress: a request header holds a line break or a NUL (or its name a colon or a space)")

// writeHead writes the request line and headers of the request forwarded for r, with
// a body (of r.ContentLength, chunked when -1) when hasBody. It fails when a header
// cannot be written as it is (never for the requests of an http.Server).
func (p *Proxy) writeHead(bw *bufio.Writer, r *http.Request, hasBody, expect bool) error {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(p.requestURI(r.URL))
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
		if replacedHeaders[k] || skipHeader(k, conn) {
			continue
		}
		if strings.ContainsAny(k, "\r\n\x00: ") {
			return errBadHeader
		}
		for _, v := range vv {
			if strings.ContainsAny(v, "\r\n\x00") {
				return errBadHeader
			}
			writeField(bw, k, v)
		}
	}
	if headerHasToken(r.Header, "Te", "trailers") {
		writeField(bw, "Te", "trailers")
	}
	xff, fwdHost, proto := forwarded(p.ids, r)
	if xff != "" {
		writeField(bw, "X-Forwarded-For", xff)
	}
	writeField(bw, "X-Forwarded-Host", fwdHost)
	writeField(bw, "X-Forwarded-Proto", proto)
	switch {
	case !hasBody:
		switch r.Method {
		case http.MethodPost, http.MethodPut, http.MethodPatch:
			// Some servers want a length on these methods (411 otherwise).
			writeField(bw, "Content-Length", "0")
		}
	case r.ContentLength > 0:
		writeField(bw, "Content-Length", strconv.FormatInt(r.ContentLength, 10))
	default:
		writeField(bw, "Transfer-Encoding", "chunked")
		if len(r.Trailer) > 0 {
			writeField(bw, "Trailer", strings.Join(slices.Sorted(mapsKeys(r.Trailer)), ", "))
		}
	}
	if expect {
		writeField(bw, "Expect", "100-continue")
	}
	_, err := bw.WriteString("\r\n")
	return err
}

func mapsKeys(h http.Header) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}
}

func writeField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
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

// writeBody streams r's body to bw: as is when its length is known, chunked (with
// r's trailers) otherwise. Errors reading the body are *clientBodyError.
func (p *Proxy) writeBody(bw *bufio.Writer, r *http.Request) error {
	bufp := p.copyBufs.Get().(*[]byte)
	defer p.copyBufs.Put(bufp)
	buf := *bufp
	if r.ContentLength > 0 {
		n, err := copyBody(bw, io.LimitReader(r.Body, r.ContentLength), buf)
		if err == nil && n < r.ContentLength {
			err = &clientBodyError{io.ErrUnexpectedEOF}
		}
		return err
	}
	cw := httputil.NewChunkedWriter(bw)
	if _, err := copyBody(cw, r.Body, buf); err != nil {
		return err
	}
	if err := cw.Close(); err != nil {
		return err
	}
	for k, vv := range r.Trailer {
		for _, v := range vv {
			writeField(bw, k, v)
		}
	}
	_, err := bw.WriteString("\r\n")
	return err
}

// copyBody copies the client's body src to dst, telling its errors from dst's.
func copyBody(dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		nr, rerr := src.Read(buf)
		if nr > 0 {
			nw, werr := dst.Write(buf[:nr])
			n += int64(nw)
			if werr != nil {
				return n, werr
			}
		}
		switch {
		case rerr == io.EOF:
			return n, nil
		case rerr != nil:
			return n, &clientBodyError{rerr}
		}
	}
}

// relay sends the upstream's response to the client, and returns c to the pool when
// the exchange left it clean.
func (p *Proxy) relay(w http.ResponseWriter, r *http.Request, c *upstreamConn, res exchanged) {
	resp := res.resp
	h := w.Header()
	conn := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if skipHeader(k, conn) {
			continue
		}
		if prev, ok := h[k]; ok {
			h[k] = append(prev, vv...)
		} else {
			h[k] = vv
		}
	}
	if len(resp.Trailer) > 0 {
		h["Trailer"] = []string{strings.Join(slices.Sorted(mapsKeys(resp.Trailer)), ", ")}
	}
	w.WriteHeader(resp.StatusCode)
	complete := p.copyResponse(w, resp)
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
	// Bytes already read past the response (a second response nobody asked for, a
	// body sent to HEAD) would be taken for the next request's response, which may be
	// another client's: such a connection is closed, as net/http's Transport does.
	if !res.stop() || !complete || resp.Close || res.bodyUnsent || c.br.Buffered() > 0 {
		_ = c.conn.Close()
		if !complete && r.Context().Err() == nil {
			// The upstream broke off: end the client's connection too, so that it
			// cannot take what it got for the whole response.
			panic(http.ErrAbortHandler)
		}
		return
	}
	p.put(c)
}

// copyResponse streams resp's body to w, flushing whenever the upstream has nothing
// more at hand, and reports whether the body was read to its end.
func (p *Proxy) copyResponse(w http.ResponseWriter, resp *http.Response) bool {
	if resp.Body == http.NoBody {
		return true
	}
	bufp := p.copyBufs.Get().(*[]byte)
	defer p.copyBufs.Put(bufp)
	buf := *bufp
	rc := http.NewResponseController(w)
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if _, err := w.Write(buf[:n]); err != nil {
				return false
			}
		}
		switch {
		case rerr == io.EOF:
			return true
		case rerr != nil:
			return false
		case n < len(buf):
			// A short read: the upstream paused. What it sent so far goes out now
			// rather than waiting in buffers for the rest.
			if err := rc.Flush(); err != nil {
				return false
			}
		}
	}
}

// headerHasToken reports whether a comma-separated list in header k of h holds token,
// compared without case.
func headerHasToken(h http.Header, k, token string) bool {
	for _, v := range h[k] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
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
	if !headerHasToken(r.Header, "Upgrade", "h2c") {
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

func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}
