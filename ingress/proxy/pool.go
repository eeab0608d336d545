// Package proxy is the front door's HTTP/1.1 client to its upstream: a pool of
// keep-alive connections of its own, each request written and each response read
// and relayed on the handler's goroutine, bodies streamed through a copy buffer.
// Package ingress builds its reverse proxy (ingress.Proxy) on it; the pool knows
// nothing of rules, forwarding headers or metrics.
//
// # The invariant
//
// HTTP/1.1 tells responses apart by their order on a connection alone, so one byte
// too many or too few shifts every response after it onto the wrong request, which on
// a shared pool is another client's. A connection therefore goes back to the pool only
// when the response just read ended exactly where its framing says, nothing is
// buffered beyond it, and nothing arrives while it idles; otherwise it is closed.
// Concretely:
//
//   - an idle connection is watched once it has idled watchDelay (a read waits on
//     it, as net/http's Transport does): an unsolicited byte or an end of stream
//     closes it then; one taken again sooner, as under load, is never watched (the
//     look below sees what a watch would have), which spares each request a read
//     that meets EAGAIN, a goroutine and its wake-up;
//   - it is looked at again when it is taken (the watch ends, then a peek at the
//     socket), and a request is never written on a connection with unread bytes;
//   - a response whose end cannot be checked is never followed by another request on
//     its connection: one that ends with the connection, an HTTP/1.0 one (keep-alive
//     or not), one with Connection: close, and one that has no body but announces a
//     length (a HEAD answered with Content-Length other than 0 or Transfer-Encoding, a
//     204 or 304 with them): an upstream that sent that body anyway would have it read
//     as the next response;
//   - a framing error is a failure (ErrBadResponse) and closes the connection:
//     Transfer-Encoding with Content-Length (RFC 9112 section 6.3), Content-Length
//     values that differ, a Transfer-Encoding other than chunked, a malformed chunk, a
//     status line or header field that does not parse (a bare CR in it included), a
//     101 to a request that asked for no upgrade; so does a body that ends early or
//     that the client stops reading;
//   - once an upstream has sent bytes nobody asked for, the pool keeps none of its
//     connections for distrustFor: they are closed after their response (and those
//     idle at once), so that the responses a broken upstream sends late cannot be read
//     as answers to other clients' requests. What no check can catch is bytes that
//     arrive late enough to pass every look and soon enough to come before the answer
//     to the next request written on the connection: on a connection in use that is
//     the first time, and the distrust bounds it to the requests in flight then;
//   - WithReuseAfter closes that gap for bytes that come within its delay: a
//     connection carries no new request until it has idled, watched, that long, so a
//     late stray is seen by the watch (the connection closed, the upstream
//     distrusted) before any request could take it for its answer.
//
// Response heads (the status line, the header fields and any informational responses
// before them) and trailer sections are read through a budget (WithMaxHeaderBytes):
// past it the exchange fails with ErrHeadTooLarge, whatever the upstream sends, so
// the memory a response takes is bounded.
package proxy

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
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/headermap"
	"github.com/sluicehq/sluice/ingress/internal/warn"
)

// DefaultMaxHeaderBytes is the default limit on a response head (WithMaxHeaderBytes).
const DefaultMaxHeaderBytes = 1 << 20

// DefaultResponseTimeout is how long the pool waits, by default, for the upstream to
// begin its response once the request has been sent.
const DefaultResponseTimeout = 60 * time.Second

// distrustFor is how long the pool keeps no connection of an upstream that sent
// bytes nobody asked for.
const distrustFor = time.Minute

// Option configures New.
type Option func(*Pool)

// WithTLS speaks TLS to the upstream with cfg (HTTP/1.1 is the only protocol offered).
func WithTLS(cfg *tls.Config) Option {
	return func(p *Pool) {
		p.tlsConfig = cfg.Clone()
		p.tlsConfig.NextProtos = []string{"http/1.1"}
	}
}

// WithMaxHeaderBytes sets the largest response head the pool reads, in bytes: the
// status line and header fields, together with the informational (1xx) responses
// before them, and the trailer section of a chunked body (default
// DefaultMaxHeaderBytes). A longer one, or a longer single line, fails the exchange
// with ErrHeadTooLarge. It must be positive.
func WithMaxHeaderBytes(n int64) Option { return func(p *Pool) { p.maxHeader = n } }

// WithResponseTimeout sets how long the upstream has to begin its response once the
// request, body included, has been sent (default DefaultResponseTimeout); past it
// the exchange fails with a net.Error whose Timeout is true. It does not bound how
// long a response body may take to stream. It must be positive.
func WithResponseTimeout(d time.Duration) Option { return func(p *Pool) { p.timeout = d } }

// WithReuseAfter sets how long a connection must idle, watched, before it carries
// another request (default 0: at once). Bytes an upstream sends within d of the end
// of a response are then always seen as unsolicited, never read as the answer to the
// next request; the price is more connections, about the request rate times d, and
// a new one dialled whenever none has idled long enough. It must not be negative.
func WithReuseAfter(d time.Duration) Option { return func(p *Pool) { p.reuseAfter = d } }

// WithMaxHold bounds how long after Exchange was called the request may still begin
// to be sent (default 0: no bound). A request held longer (its process was stopped
// or stalled, a connection took that long to open) fails with ErrHeldTooLong, nothing
// of it sent: its client has most likely given up and sent it again elsewhere. The
// bound is checked right before the request's first byte is written, so a stall after
// that check is not caught. It must not be negative.
func WithMaxHold(d time.Duration) Option { return func(p *Pool) { p.maxHold = d } }

// WithLogger sets the logger of the pool's warnings (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(p *Pool) { p.log = l } }

// Pool is a pool of HTTP/1.1 connections to one upstream address (see the package
// documentation for when a connection is kept). Safe for concurrent use.
type Pool struct {
	addr       string
	tlsConfig  *tls.Config // nil: plain HTTP
	dialer     net.Dialer
	maxHeader  int64
	timeout    time.Duration
	log        *slog.Logger
	strays     *warn.Sometimes
	distrusted atomic.Int64 // Unix nanoseconds until which no connection is kept
	copyBufs   sync.Pool
	mu         sync.Mutex
	idle       []*conn // most recently used last
	maxIdle    int
	idleExpiry time.Duration
	reuseAfter time.Duration
	maxHold    time.Duration
}

// New returns a pool of connections to addr (host:port). It fails when an option was
// given an invalid value.
func New(addr string, opts ...Option) (*Pool, error) {
	p := &Pool{
		addr:       addr,
		dialer:     net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxHeader:  DefaultMaxHeaderBytes,
		timeout:    DefaultResponseTimeout,
		log:        slog.Default(),
		strays:     warn.Every(10 * time.Second),
		maxIdle:    512,
		idleExpiry: IdleExpiry,
	}
	for _, o := range opts {
		o(p)
	}
	switch {
	case p.log == nil:
		return nil, errors.New("proxy: WithLogger(nil)")
	case p.timeout <= 0:
		return nil, fmt.Errorf("proxy: WithResponseTimeout(%v): the timeout must be positive", p.timeout)
	case p.maxHeader <= 0:
		return nil, fmt.Errorf("proxy: WithMaxHeaderBytes(%d): the limit must be positive", p.maxHeader)
	case p.maxHold < 0:
		return nil, fmt.Errorf("proxy: WithMaxHold(%v): the bound must not be negative", p.maxHold)
	case p.reuseAfter < 0:
		return nil, fmt.Errorf("proxy: WithReuseAfter(%v): the delay must not be negative", p.reuseAfter)
	}
	p.copyBufs.New = func() any { b := make([]byte, 32<<10); return &b }
	return p, nil
}

// IdleExpiry is how long a connection may idle in the pool before it is closed.
const IdleExpiry = 90 * time.Second

// Dialer returns the dialer of the pool's connections, for a transport that carries
// what the pool does not (protocol switches) to the same upstream.
func (p *Pool) Dialer() *net.Dialer { return &p.dialer }

// conn is one connection to the upstream.
type conn struct {
	pool *Pool
	conn net.Conn
	sock *socket // the TCP socket under conn
	lr   budget  // under br: bounds what a head takes
	br   *bufio.Reader
	tp   *textproto.Reader // over br
	bw   *bufio.Writer
	body body
	// header is the header map of the response last read (emptyHeader).
	header    http.Header
	idleSince time.Time
	reused    bool
	watched   chan bool // the idle watch's verdict: whether the connection may be used
	// watching: the idle watch runs (under pool.mu); watchTimer starts it
	// watchDelay into an idle spell (lateWatch).
	watching   bool
	watchTimer *time.Timer
	// sendFirst: the next read is the first of a response, and what the request left
	// in bw goes out from within it (upReader); sendErr is that send's failure.
	sendFirst bool
	sendErr   error
	flushFn   func() error    // c.flushRequest, made once
	abortFn   func()          // c.abort, made once
	watchFn   func()          // the pool's watch of c, made once: go needs no closure per put
	lateFn    func()          // the pool's lateWatch of c, made once
	ctx       context.Context // the exchange's, while its response head is read
}

// upReader is the reader under a connection's budget: conn's, except for the first
// read of a response whose request still has bytes in bw (conn.sendFirst), which
// sends them and then waits for the answer without trying first
// (socket.sendThenRead): a system call fewer per request.
type upReader struct{ c *conn }

func (r upReader) Read(p []byte) (int, error) {
	c := r.c
	if !c.sendFirst {
		return c.conn.Read(p)
	}
	c.sendFirst = false
	n, sendErr, err := c.sock.sendThenRead(p, c.flushFn)
	if sendErr != nil {
		c.sendErr = sendErr
		return 0, sendErr
	}
	return n, err
}

// emptyHeader returns c's header map, cleared, for the head about to be read: the
// map of the previous response on c, which nothing uses any more (Response.Relay;
// see headermap.Reset).
func (c *conn) emptyHeader() http.Header {
	c.header = headermap.Reset(c.header)
	return c.header
}

// abort makes the connection's blocked reads and writes return at once: the client's
// context is done.
func (c *conn) abort() { _ = c.conn.SetDeadline(aLongTimeAgo) }

// flushRequest sends what the request left in bw and starts the response's time
// (WithResponseTimeout).
func (c *conn) flushRequest() error {
	if err := c.bw.Flush(); err != nil {
		return err
	}
	setReadDeadline(c.ctx, c.conn, time.Now().Add(c.pool.timeout))
	return nil
}

// idleState is what a look at an idle connection found.
type idleState uint8

const (
	quiet       idleState = iota // nothing: the connection may be used
	closed                       // an end of stream or an error
	unsolicited                  // bytes nobody asked for
)

// aLongTimeAgo is a deadline in the past: setting it makes blocked reads and writes
// of a connection return at once.
var aLongTimeAgo = time.Unix(1, 0)

// get returns an idle connection that is still open and has nothing to read, or a
// new one.
func (p *Pool) get(ctx context.Context) (*conn, error) {
	now := time.Now()
	for {
		p.mu.Lock()
		c := p.takeIdle(now)
		watched := c != nil && c.watching
		p.mu.Unlock()
		if c == nil {
			break
		}
		// End the watch, if it started; then look at the socket itself, where
		// bytes may have arrived after the watch's last look (or while nothing
		// watched). The read deadline stays in the past: the peek does not look at
		// it, and the exchange sets its own before it reads.
		ok := true
		if watched {
			_ = c.conn.SetReadDeadline(aLongTimeAgo)
			ok = <-c.watched
		} else {
			c.watchTimer.Stop() // lateWatch finds c out of the pool if it runs anyway
		}
		if ok && now.Sub(c.idleSince) < p.idleExpiry && c.br.Buffered() == 0 {
			switch c.sock.peek() {
			case quiet:
				c.reused = true
				return c, nil
			case unsolicited:
				p.distrust()
			}
		}
		_ = c.conn.Close()
	}
	raw, err := p.dialer.DialContext(ctx, "tcp", p.addr)
	if err != nil {
		return nil, err
	}
	c := &conn{pool: p, conn: raw, sock: newSocket(raw), watched: make(chan bool, 1)}
	c.flushFn, c.abortFn = c.flushRequest, c.abort
	c.watchFn = func() { p.watch(c) }
	c.lateFn = func() { p.lateWatch(c) }
	if p.tlsConfig != nil {
		tc := tls.Client(raw, p.tlsConfig)
		if err := tc.HandshakeContext(ctx); err != nil {
			_ = raw.Close()
			return nil, err
		}
		c.conn = tc
	}
	c.lr = budget{r: upReader{c}, n: -1}
	c.br = bufio.NewReaderSize(&c.lr, 4096)
	c.tp = textproto.NewReader(c.br)
	c.bw = bufio.NewWriterSize(c.conn, 4096)
	return c, nil
}

// takeIdle removes from the pool and returns the most recently used connection that
// has idled at least reuseAfter, or nil. p.mu must be held.
func (p *Pool) takeIdle(now time.Time) *conn {
	// The pool is ordered by idleSince: the first from the top old enough is the one.
	for i := len(p.idle) - 1; i >= 0; i-- {
		if c := p.idle[i]; now.Sub(c.idleSince) >= p.reuseAfter {
			p.idle = slices.Delete(p.idle, i, i+1)
			return c
		}
	}
	return nil
}

// put returns c to the pool, or closes it when the pool is full or the upstream is
// distrusted. The pool is used last in, first out, so that connections beyond what
// the load needs age at its bottom: each put closes the oldest one when it has been
// idle too long.
func (p *Pool) put(c *conn) {
	c.idleSince = time.Now()
	if c.idleSince.UnixNano() < p.distrusted.Load() {
		_ = c.conn.Close()
		return
	}
	var stale *conn
	p.mu.Lock()
	if len(p.idle) > 0 && c.idleSince.Sub(p.idle[0].idleSince) > p.idleExpiry {
		stale = p.idle[0]
		p.idle = slices.Delete(p.idle, 0, 1)
	}
	if len(p.idle) < p.maxIdle {
		p.idle = append(p.idle, c)
		switch {
		case p.reuseAfter > 0:
			// The delay is there for the watch to see late strays: from the start.
			c.watching = true
			go c.watchFn()
		case c.watchTimer == nil:
			c.watching = false
			c.watchTimer = time.AfterFunc(watchDelay, c.lateFn)
		default:
			c.watching = false
			c.watchTimer.Reset(watchDelay)
		}
		c = nil
	}
	p.mu.Unlock()
	for _, dead := range []*conn{stale, c} {
		if dead != nil {
			_ = dead.conn.Close()
		}
	}
}

// watchDelay is how long a connection idles before its watch starts: one taken
// sooner is looked at when taken (get), and most are under load.
const watchDelay = 5 * time.Millisecond

// lateWatch starts the watch of c, watchDelay into an idle spell, unless c has been
// taken since or its watch runs.
func (p *Pool) lateWatch(c *conn) {
	p.mu.Lock()
	start := !c.watching && slices.Contains(p.idle, c)
	c.watching = c.watching || start
	p.mu.Unlock()
	if start {
		p.watch(c)
	}
}

// watch waits on the idle connection c for anything to read: the deadline get sets
// when it takes c ends the wait, and anything else (a byte nobody asked for, an end of
// stream, an error) closes c, at once rather than when a request would take it.
// It sends its verdict on c.watched.
func (p *Pool) watch(c *conn) {
	_, err := c.br.Peek(1)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		c.watched <- true // get took c
		return
	}
	if err == nil {
		p.distrust()
	}
	p.mu.Lock()
	i := slices.Index(p.idle, c)
	if i >= 0 {
		p.idle = slices.Delete(p.idle, i, i+1)
	}
	p.mu.Unlock()
	if i >= 0 {
		_ = c.conn.Close()
	}
	c.watched <- false
}

// distrust keeps no connection for distrustFor: the upstream sent bytes nobody asked
// for, and the next ones may come when a connection carries another request.
func (p *Pool) distrust() {
	now := time.Now()
	p.distrusted.Store(now.Add(distrustFor).UnixNano())
	p.strays.Warn(p.log, "the upstream sent bytes after a response: its connections are not kept alive for a while",
		"upstream", p.addr, "for", distrustFor)
	p.CloseIdleConnections()
}

// CloseIdleConnections closes the pooled connections that no request uses.
func (p *Pool) CloseIdleConnections() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		// The watch of c sees the close and finds c out of the pool.
		_ = c.conn.Close()
	}
}

// HeadWriter writes the request line and header fields of the request sent for r,
// ending with the blank line: a body follows (of r.ContentLength bytes, chunked when
// it is -1) when hasBody, and Expect: 100-continue is asked for when expect.
type HeadWriter func(bw *bufio.Writer, r *http.Request, hasBody, expect bool) error

// ErrClientBody wraps a failure to read the client's request body (an
// http.MaxBytesError of a body over the limit included).
var ErrClientBody = errors.New("proxy: reading the request body")

// Response is the head of the upstream's response to one request; Relay sends it,
// body included, to the client. Its Header map is the connection's: once Relay has
// returned, it is the next response's, and must not be used (Relay copies its
// values' slices, which stay).
type Response struct {
	*http.Response
	c *conn
	// stop detaches the connection from the client's context; false when the
	// context was done first (the connection's deadline is then in the past).
	stop func() bool
	// keep: the head allows another request on the connection once the body has
	// been read to its end.
	keep bool
}

// ErrHeldTooLong is returned by Exchange for a request it could not begin to send
// within the pool's max hold (WithMaxHold); nothing of it was sent.
var ErrHeldTooLong = errors.New("proxy: the request was held too long to be sent")

// Exchange sends the request for r (its head written by head, then r's body) on a
// pooled connection and reads the response's head. A request that may be repeated
// (no body, an idempotent method) is sent once more on a new connection when a
// kept-alive one turns out closed. Errors: ErrClientBody (wrapped) when r's body
// could not be read, ErrHeldTooLong, ErrHeadTooLarge, ErrBadResponse (wrapped), a net.Error that is a
// Timeout when the upstream did not answer in time (WithResponseTimeout), or the
// connection's error.
func (p *Pool) Exchange(r *http.Request, head HeadWriter) (Response, error) {
	ctx := r.Context()
	var taken time.Time
	if p.maxHold > 0 {
		taken = time.Now()
	}
	for attempt := 0; ; attempt++ {
		c, err := p.get(ctx)
		if err != nil {
			return Response{}, err
		}
		if p.maxHold > 0 && time.Since(taken) > p.maxHold {
			_ = c.conn.SetReadDeadline(time.Time{}) // get left it in the past
			p.put(c)                                // nothing was written on it
			return Response{}, ErrHeldTooLong
		}
		res, retryable, err := p.exchange(ctx, c, r, head)
		if err == nil {
			return res, nil
		}
		_ = c.conn.Close()
		if attempt == 0 && retryable && c.reused && ctx.Err() == nil {
			continue // a kept-alive connection the upstream had closed: once more on a new one
		}
		return Response{}, err
	}
}

// exchange sends r on c and reads the response's head. retryable: nothing of the
// request can have reached the upstream's handler, or the request may be sent twice,
// and nothing of a response was read.
func (p *Pool) exchange(ctx context.Context, c *conn, r *http.Request, head HeadWriter) (res Response, retryable bool, err error) {
	nc := c.conn
	stop := context.AfterFunc(ctx, c.abortFn)
	res = Response{c: c, stop: stop}
	fail := func(retry bool, err error) (Response, bool, error) {
		stop()
		return Response{}, retry, err
	}
	hasBody := r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody
	expect := hasBody && HasToken(r.Header, "Expect", "100-continue")
	if err := head(c.bw, r, hasBody, expect); err != nil {
		return fail(false, err)
	}
	// Every head read for this request (informational responses included) shares
	// one budget. Nothing is buffered yet: get saw to it.
	c.lr.n = p.maxHeader
	defer func() { c.lr.n = -1 }()
	if expect {
		// Let the upstream decide whether it wants the body: wait a while for its
		// answer before sending it, as a client would.
		if err := c.bw.Flush(); err != nil {
			return fail(true, err) // nothing of the body was read
		}
		setReadDeadline(ctx, nc, time.Now().Add(time.Second))
		_, err := c.br.Peek(1)
		clearReadDeadline(ctx, nc)
		if err == nil {
			resp, _, err := p.readResponse(c, r, true)
			if err != nil {
				return fail(false, err)
			}
			if resp.StatusCode != http.StatusContinue {
				// The body was not sent: the connection cannot carry another request.
				res.Response, res.keep = resp, false
				return res, false, nil
			}
		} else if !isTimeout(err) || ctx.Err() != nil {
			return fail(true, err)
		}
	}
	if hasBody {
		if err := p.writeBody(c.bw, r); err != nil {
			if errors.Is(err, ErrClientBody) {
				return fail(false, err)
			}
			// The upstream may have answered before reading the whole body (a 413 of
			// its own): that answer is better than a 502.
			setReadDeadline(ctx, nc, time.Now().Add(time.Second))
			resp, _, rerr := p.readResponse(c, r, false)
			clearReadDeadline(ctx, nc)
			if rerr != nil {
				return fail(false, err)
			}
			res.Response, res.keep = resp, false
			return res, false, nil
		}
	}
	if p.tlsConfig == nil && !expect {
		// The response's first read sends the rest and then waits (upReader). The
		// deadline until then is only for the send; flushRequest sets the response's.
		setReadDeadline(ctx, nc, time.Now().Add(p.timeout))
		c.ctx, c.sendFirst = ctx, true
	} else {
		if err := c.bw.Flush(); err != nil {
			return fail(!hasBody, err)
		}
		setReadDeadline(ctx, nc, time.Now().Add(p.timeout))
	}
	resp, keep, err := p.readResponse(c, r, false)
	c.ctx, c.sendFirst = nil, false
	if sendErr := c.sendErr; sendErr != nil {
		c.sendErr = nil
		return fail(!hasBody, sendErr)
	}
	if err != nil {
		// Nothing came back at all: the upstream closed a kept-alive connection
		// under the request. Only a request that may be repeated is sent again.
		retry := !hasBody && idempotent(r.Method) && c.br.Buffered() == 0 &&
			(errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err))
		return fail(retry, err)
	}
	clearReadDeadline(ctx, nc)
	res.Response, res.keep = resp, keep
	return res, false, nil
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
func (p *Pool) readResponse(c *conn, r *http.Request, continued bool) (*http.Response, bool, error) {
	for {
		resp, keep, err := readHead(c, r.Method)
		if err != nil {
			return nil, false, err
		}
		switch {
		case resp.StatusCode == http.StatusSwitchingProtocols:
			return nil, false, badResponse("the upstream switched protocols on a request that did not ask to")
		case resp.StatusCode >= 200 || continued && resp.StatusCode == http.StatusContinue:
			resp.Request = r
			return resp, keep, nil
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

// writeBody streams r's body to bw: as is when its length is known, chunked (with
// r's trailers) otherwise. Errors reading the body wrap ErrClientBody.
func (p *Pool) writeBody(bw *bufio.Writer, r *http.Request) error {
	bufp := p.copyBufs.Get().(*[]byte)
	defer p.copyBufs.Put(bufp)
	buf := *bufp
	if r.ContentLength > 0 {
		n, err := copyBody(bw, io.LimitReader(r.Body, r.ContentLength), buf)
		if err == nil && n < r.ContentLength {
			err = fmt.Errorf("%w: %w", ErrClientBody, io.ErrUnexpectedEOF)
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
			WriteField(bw, k, v)
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
			return n, fmt.Errorf("%w: %w", ErrClientBody, rerr)
		}
	}
}

// WriteField writes the header field k: v and its line end.
func WriteField(bw *bufio.Writer, k, v string) {
	bw.WriteString(k)
	bw.WriteString(": ")
	bw.WriteString(v)
	bw.WriteString("\r\n")
}

// Relay sends the response to the client through w (for the request r), body and
// trailers included, and returns the connection to the pool when the exchange left
// it clean (see the package documentation); otherwise it closes it. A body that
// breaks off before its end aborts the client's connection (panic
// http.ErrAbortHandler, which http.Server handles), so that the client sees a
// truncated response rather than a complete one.
func (res *Response) Relay(w http.ResponseWriter, r *http.Request) {
	resp, c, p := res.Response, res.c, res.c.pool
	h := w.Header()
	connection := resp.Header["Connection"]
	for k, vv := range resp.Header {
		if HopByHop(k, connection) {
			continue
		}
		if prev, ok := h[k]; ok {
			h[k] = append(prev, vv...)
		} else {
			h[k] = vv
		}
	}
	if len(resp.Trailer) > 0 {
		h["Trailer"] = []string{strings.Join(slices.Sorted(keys(resp.Trailer)), ", ")}
	}
	w.WriteHeader(resp.StatusCode)
	complete := p.copyResponse(w, resp)
	for k, vv := range resp.Trailer {
		h[http.TrailerPrefix+k] = vv
	}
	// Bytes already read past the response (a second response nobody asked for, a
	// body sent to HEAD) would be taken for the next request's response, which may be
	// another client's: such a connection is closed.
	buffered := c.br.Buffered() > 0
	if !res.stop() || !complete || !res.keep || buffered {
		_ = c.conn.Close()
		if complete && buffered {
			p.distrust()
		}
		if !complete && r.Context().Err() == nil {
			// The upstream broke off: end the client's connection too, so that it
			// cannot take what it got for the whole response.
			panic(http.ErrAbortHandler)
		}
		return
	}
	p.put(c)
}

func keys(h http.Header) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range h {
			if !yield(k) {
				return
			}
		}
	}
}

// copyResponse streams resp's body to w, flushing whenever the upstream has nothing
// more at hand, and reports whether the body was read to its end.
func (p *Pool) copyResponse(w http.ResponseWriter, resp *http.Response) bool {
	if resp.Body == http.NoBody {
		return true
	}
	bufp := p.copyBufs.Get().(*[]byte)
	defer p.copyBufs.Put(bufp)
	buf := *bufp
	var rc *http.ResponseController // made at the first flush
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
		case done(resp.Body):
			// Nothing is left to read: the server writes what is buffered once the
			// handler returns, with no flush of its own before.
			return true
		case n < len(buf):
			// A short read: the upstream paused. What it sent so far goes out now
			// rather than waiting in buffers for the rest.
			if rc == nil {
				rc = http.NewResponseController(w)
			}
			if err := rc.Flush(); err != nil {
				return false
			}
		}
	}
}

// done reports whether r, a response body, has been read to its end though it has not
// yet said io.EOF: a length-framed body with no byte left.
func done(r io.Reader) bool {
	b, ok := r.(*body)
	return ok && b.framing == length && b.left == 0 && b.err == nil
}

func isConnReset(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func isTimeout(err error) bool {
	ne := net.Error(nil)
	return errors.As(err, &ne) && ne.Timeout()
}

// Idle returns the number of connections idle in the pool.
func (p *Pool) Idle() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.idle)
}
