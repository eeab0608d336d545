// Package h1 is the front door's fast path for plaintext HTTP/1.1: a server that
// serves a strict, common subset of requests itself (see parseHead) and hands every
// other connection, with the bytes it has read of it, to net/http's own server, so
// that anything unusual (chunked bodies, Expect, Upgrade, obs-fold, bare LF, HTTP/1.0,
// a head past 4 KiB, anything malformed) gets net/http's answer.
//
// Why: net/http's server starts a background read for every request without a body
// (a system call that meets EAGAIN and a goroutine, to notice a client that leaves),
// which is a tenth of the front door's system calls. The fast path reads a request
// with one read, answers with one write (head and a buffered body together), and
// watches for a client that leaves only when a request has been in the handler for
// longer than watchAfter (a request held by a wait rule, a slow upstream).
//
// What a handler sees is net/http's: an *http.Request as net/http's server builds it
// for the same bytes (the same method, target, URL, header, Host and framing:
// FuzzParseHead checks it against net/http), and an http.ResponseWriter that
// supports Flush, full duplex and read and write deadlines through
// http.ResponseController. Not supported on the fast path: Hijack (an upgrade goes to
// net/http), HEAD (net/http's rules for its Content-Length), trailers declared
// by a request.
package h1

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/headermap"
)

// readBuffer is the size of a connection's read buffer: the largest head the fast
// path serves. Anything longer goes to net/http, which applies MaxHeaderBytes.
const readBuffer = 4096

// watchAfter is how long a request stays in the handler before its connection is
// watched for the client leaving (its context then ends).
const watchAfter = 5 * time.Millisecond

// newConnGrace is how long Shutdown leaves a connection that has sent nothing yet
// before it closes it (net/http's rule for a new connection): its request may be on
// the way.
const newConnGrace = 5 * time.Second

// shutdownPoll is how often Shutdown looks again for connections to close.
const shutdownPoll = 500 * time.Millisecond

// maxDiscard is the most of an unread request body read and dropped after the
// handler so that the connection can carry another request; past it the connection
// closes (net/http's rule).
const maxDiscard = 256 << 10

// Server serves HTTP/1.1 on a listener: the subset of requests the fast path takes
// itself, every other connection through Fallback.
type Server struct {
	// Fallback serves the connections handed over, and gives the fast path its
	// Handler, ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout and
	// ErrorLog. Its Shutdown runs its OnShutdown functions; Server.Shutdown calls it.
	Fallback *http.Server

	mu       sync.Mutex
	conns    map[*conn]struct{}
	ln       net.Listener
	handoff  *handoffListener
	closing  atomic.Bool
	active   sync.WaitGroup
	fallback chan error
}

// Serve accepts connections on ln and serves each on a goroutine of its own until ln
// fails or Shutdown is called (then it returns http.ErrServerClosed, as
// http.Server.Serve does). It starts Fallback's Serve on the connections handed over.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing.Load() {
		s.mu.Unlock()
		return http.ErrServerClosed
	}
	s.ln = ln
	s.conns = map[*conn]struct{}{}
	s.handoff = newHandoffListener(ln.Addr())
	s.fallback = make(chan error, 1)
	s.mu.Unlock()
	go func() { s.fallback <- s.Fallback.Serve(s.handoff) }()
	var delay time.Duration // of a retried Accept
	for {
		nc, err := ln.Accept()
		if err != nil {
			if s.closing.Load() {
				return http.ErrServerClosed
			}
			if !retryable(err) {
				return err
			}
			// Out of descriptors or memory for a moment: wait and retry, as
			// net/http does, 5 ms doubling up to 1 s.
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.logf("http: Accept error: %v; retrying in %v", err, delay)
			time.Sleep(delay)
			continue
		}
		delay = 0
		c := newConn(s, nc)
		s.mu.Lock()
		if s.closing.Load() {
			s.mu.Unlock()
			nc.Close()
			return http.ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.active.Add(1)
		s.mu.Unlock()
		go c.serve()
	}
}

// retryable reports whether an Accept error is a passing one.
func retryable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.ENOBUFS) || errors.Is(err, syscall.ENOMEM)
}

// Shutdown stops accepting, closes the idle connections (and those that have sent
// nothing once they have been open newConnGrace), lets every request under way finish
// (its connection then closes) and shuts Fallback down alongside (its OnShutdown
// functions run at once), until ctx ends.
func (s *Server) Shutdown(ctx context.Context) error {
	s.mu.Lock()
	s.closing.Store(true)
	var lnErr error
	if s.ln != nil {
		lnErr = s.ln.Close()
	}
	s.mu.Unlock()
	s.wakeIdle()
	fb := make(chan error, 1)
	go func() { fb <- s.Fallback.Shutdown(ctx) }()
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	// Connections that have sent nothing yet are closed once newConnGrace has passed
	// since they were accepted: Shutdown looks for them again every shutdownPoll.
	poll := time.NewTicker(shutdownPoll)
	defer poll.Stop()
	var err error
wait:
	for {
		select {
		case <-done:
			break wait
		case <-ctx.Done():
			err = ctx.Err()
			break wait
		case <-poll.C:
			s.wakeIdle()
		}
	}
	err = errors.Join(err, <-fb)
	if lnErr != nil && !errors.Is(lnErr, net.ErrClosed) {
		err = errors.Join(err, lnErr)
	}
	return err
}

// wakeIdle ends the reads of the connections waiting for a request (see
// conn.wakeIfIdle), for Shutdown.
func (s *Server) wakeIdle() {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.wakeIfIdle(now)
	}
}

func (s *Server) forget(c *conn) {
	s.mu.Lock()
	delete(s.conns, c)
	s.mu.Unlock()
	s.active.Done()
}

func (s *Server) logf(format string, args ...any) {
	if l := s.Fallback.ErrorLog; l != nil {
		l.Printf(format, args...)
	} else {
		log.Printf(format, args...)
	}
}

// conn is one connection the fast path serves.
type conn struct {
	s        *Server
	nc       net.Conn
	remote   string
	accepted time.Time
	ctx      context.Context // the requests' base context

	// buf[r:w] is read and not yet used.
	buf    []byte
	r, w   int
	served int // requests served
	// afterPost: the request served last was a POST, so up to 4 CR or LF bytes
	// before the next are dropped (net/http's tolerance of old clients that end a
	// POST body with a line break).
	afterPost bool
	// out is the response's bytes waiting for a write; body is a response body
	// buffered before its head is written.
	out, body []byte
	date      dateCache
	// resp is the response of the request being served, reset for each
	// (newResponse).
	resp response

	// mu guards the watch's state, idle and the deadlines.
	mu sync.Mutex
	// rdl and wdl are the read and write deadlines last set (setDeadline).
	rdl, wdl time.Time
	idle     bool
	fresh    bool // waits for its first request's first byte
	inReq    bool // a handler runs
	bodyDone bool // the request's body is read to its end (or it has none)
	late     bool // the request has been in the handler for watchAfter
	watching bool
	watchEnd chan struct{} // closed when the watch's read returns
	gone     bool          // the watch saw the client leave, or failed
	cancel   context.CancelFunc
	timer    *time.Timer
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{s: s, nc: nc, accepted: time.Now(), buf: make([]byte, readBuffer)}
	c.ctx = context.WithValue(context.WithValue(context.Background(), http.ServerContextKey, s.Fallback),
		http.LocalAddrContextKey, nc.LocalAddr())
	return c
}

// aLongTimeAgo is a deadline in the past: it ends a read at once.
var aLongTimeAgo = time.Unix(1, 0)

// wakeIfIdle ends the read of a connection waiting for a request, for Shutdown: one
// idle between requests, or one that has sent nothing since it was accepted
// newConnGrace before now.
func (c *conn) wakeIfIdle(now time.Time) {
	c.mu.Lock()
	if c.idle || c.fresh && now.Sub(c.accepted) >= newConnGrace {
		_ = c.setDeadlineLocked(&c.rdl, aLongTimeAgo, false)
	}
	c.mu.Unlock()
}

// serve serves requests on c until the connection ends or is handed over.
func (c *conn) serve() {
	defer c.s.forget(c)
	handedOver := false
	defer func() {
		if !handedOver {
			c.nc.Close()
		}
		if c.timer != nil {
			c.timer.Stop()
		}
	}()
	c.remote = c.nc.RemoteAddr().String()
	for {
		h, n, ok := c.readHead()
		if !ok {
			if n < 0 {
				return // closed, timed out, or shutting down
			}
			handedOver = c.handOver()
			return
		}
		if !c.serveRequest(h, n) {
			return
		}
		if c.s.closing.Load() {
			return
		}
	}
}

// readHead reads the next request's head. ok: h is in the fast path's subset and
// buf[r:r+n] is its bytes. Otherwise n < 0 when the connection is done (closed by
// the client before a whole head, a read error or timeout, shutting down), else the
// connection goes to net/http.
func (c *conn) readHead() (h head, n int, ok bool) {
	timed := false // the head's deadline is set
	for {
		if c.afterPost && c.w-c.r >= 4 {
			c.afterPost = false
			for i := 0; i < 4 && (c.buf[c.r] == '\r' || c.buf[c.r] == '\n'); i++ {
				c.r++
			}
		}
		// While afterPost, fewer than 4 bytes are no head yet (net/http peeks 4).
		if !c.afterPost {
			if end, bad := headEnd(c.buf[c.r:c.w]); bad {
				return head{}, 0, false
			} else if end > 0 {
				h, ok := parseHead(c.buf[c.r : c.r+end])
				return h, end, ok
			}
		}
		if c.r > 0 {
			c.w = copy(c.buf, c.buf[c.r:c.w])
			c.r = 0
		}
		if c.w == len(c.buf) {
			return head{}, 0, false // too long for the fast path: net/http's limits decide
		}
		// A connection's first request and every head once it has begun have
		// ReadHeaderTimeout, from its first byte; between requests the connection
		// may idle for IdleTimeout (net/http's rules).
		var deadline time.Time
		idle := c.w == 0 && c.served > 0
		if d := c.s.Fallback.IdleTimeout; idle && d > 0 {
			deadline = time.Now().Add(d)
		} else if d := c.s.Fallback.ReadHeaderTimeout; !idle && d > 0 {
			deadline = time.Now().Add(d)
		}
		if !c.beginRead(idle, deadline, !timed) {
			return head{}, -1, false
		}
		timed = timed || !idle
		m, err := c.nc.Read(c.buf[c.w:])
		c.w += m
		if !c.endRead() {
			return head{}, -1, false
		}
		if err != nil {
			// A partial head and then EOF: net/http answers it as it would, but
			// for fewer than 4 bytes after a request, which it drops unanswered
			// (it peeks 4 bytes before it reads another request).
			if c.w > 0 && errors.Is(err, io.EOF) && (c.served == 0 || c.w >= 4) {
				return head{}, 0, false
			}
			return head{}, -1, false
		}
	}
}

// beginRead records that c waits for a request (idle: for its first byte) and sets
// the read's deadline (when set is true); false when the server is shutting down and
// c has nothing of a request. Under c.mu, so that Shutdown's wake is not undone.
func (c *conn) beginRead(idle bool, deadline time.Time, set bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.s.closing.Load() && c.w == 0 {
		return false
	}
	c.idle = idle
	c.fresh = c.w == 0 && c.served == 0
	if set {
		_ = c.setDeadlineLocked(&c.rdl, deadline, true)
	}
	return true
}

// endRead records that c's read returned; false when the server is shutting down
// and c has nothing of a request.
func (c *conn) endRead() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.idle, c.fresh = false, false
	return !c.s.closing.Load() || c.w > 0
}

// handOver gives the connection, with what it has read and not used, to net/http.
func (c *conn) handOver() bool {
	_ = c.setDeadline(&c.rdl, time.Time{}, false)
	_ = c.setDeadline(&c.wdl, time.Time{}, false)
	rc := &replayConn{Conn: c.nc, pending: append([]byte(nil), c.buf[c.r:c.w]...)}
	return c.s.handoff.give(rc)
}

// serveRequest serves the request whose head h is buf[r:r+n]; it reports whether the
// connection may carry another.
func (c *conn) serveRequest(h head, n int) (keep bool) {
	c.r += n
	s := c.s.Fallback
	start := time.Now()
	if s.WriteTimeout > 0 {
		_ = c.setDeadline(&c.wdl, start.Add(s.WriteTimeout), true)
	}
	ctx, cancel := context.WithCancel(c.ctx)
	// A value here, so that only WithContext's copy is allocated.
	req := http.Request{
		Method: h.method, URL: h.url, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h.header, ContentLength: h.contentLength, Close: h.close, Host: h.host,
		RemoteAddr: c.remote, RequestURI: h.target, Body: http.NoBody,
	}
	var b *body
	if h.contentLength > 0 {
		if s.ReadTimeout > 0 {
			_ = c.setDeadline(&c.rdl, start.Add(s.ReadTimeout), true)
		} else {
			_ = c.setDeadline(&c.rdl, time.Time{}, false)
		}
		b = &body{c: c, left: h.contentLength}
		req.Body = b
	}
	r := req.WithContext(ctx)
	w := c.newResponse(h.close, b)

	c.mu.Lock()
	c.inReq, c.bodyDone, c.late, c.gone, c.cancel = true, b == nil, false, false, cancel
	c.mu.Unlock()
	if c.timer == nil {
		c.timer = time.AfterFunc(watchAfter, c.wantWatch)
	} else {
		c.timer.Reset(watchAfter)
	}

	ok := c.runHandler(w, r)
	c.served++
	c.afterPost = h.method == http.MethodPost

	c.timer.Stop()
	c.mu.Lock()
	c.inReq = false
	watching := c.watching
	c.mu.Unlock()
	if watching {
		c.endWatch()
	}
	if b != nil {
		b.close()
	}
	if ok {
		// A server shutting down says so (net/http's rule), and closes after.
		w.closeAfter = w.closeAfter || c.s.closing.Load()
		ok = w.finish() == nil
	}
	cancel()
	c.mu.Lock()
	gone := c.gone
	c.mu.Unlock()
	unread := b != nil && b.left > 0
	switch {
	case !ok || gone:
		return false
	case w.closeAfter:
		if unread {
			c.lingerClose()
		}
		return false
	case unread && !b.discard():
		c.lingerClose()
		return false
	}
	return true
}

// newResponse returns c's response, reset for the next request (closeAfter: the
// request asked to close; b: its body, nil without one). There is one per
// connection, its header map reused (headermap.Reset): a ResponseWriter, Header's
// map included, may not be used after its handler has returned (http.Handler).
func (c *conn) newResponse(closeAfter bool, b *body) *response {
	c.resp = response{c: c, header: headermap.Reset(c.resp.header), contentLength: -1, closeAfter: closeAfter, reqBody: b}
	return &c.resp
}

// rstAvoidanceDelay is how long a connection closed with some of a request's body
// unread waits after its FIN before it closes (net/http's 500 ms): closing with
// unread bytes sends a RST, which may destroy the answer before the client reads it.
const rstAvoidanceDelay = 500 * time.Millisecond

// lingerClose half-closes c and waits rstAvoidanceDelay, for a connection that
// closes with bytes of a request unread.
func (c *conn) lingerClose() {
	if cw, ok := c.nc.(interface{ CloseWrite() error }); ok && cw.CloseWrite() == nil {
		time.Sleep(rstAvoidanceDelay)
	}
}

// runHandler runs the handler on w and req; false when it panicked (the connection
// then closes, as net/http does, and a panic other than http.ErrAbortHandler is
// logged).
func (c *conn) runHandler(w *response, req *http.Request) (ok bool) {
	defer func() {
		if v := recover(); v != nil {
			ok = false
			if v != http.ErrAbortHandler { //nolint:errorlint // the sentinel itself is the panic value
				const size = 64 << 10
				buf := make([]byte, size)
				buf = buf[:runtime.Stack(buf, false)]
				c.s.logf("http: panic serving %v: %v\n%s", c.remote, v, buf)
			}
		}
	}()
	c.s.Fallback.Handler.ServeHTTP(w, req)
	return true
}

// wantWatch runs watchAfter into a request: the connection is watched for the
// client leaving once the request's body has been read.
func (c *conn) wantWatch() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.inReq {
		return
	}
	c.late = true
	c.startWatchLocked()
}

// bodyRead records that the request's body has been read to its end.
func (c *conn) bodyRead() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.bodyDone = true
	if c.inReq && c.late {
		c.startWatchLocked()
	}
}

// startWatchLocked starts the read that sees the client leave, unless one runs, the
// body is still to be read, or bytes of another request are at hand already (then
// the client has not left before sending them).
func (c *conn) startWatchLocked() {
	if c.watching || !c.bodyDone || c.r < c.w || c.gone {
		return
	}
	c.r, c.w = 0, 0
	// No deadline: the handler's writes have theirs. Cleared here, before
	// endWatch can set its own.
	_ = c.setDeadlineLocked(&c.rdl, time.Time{}, false)
	c.watching = true
	c.watchEnd = make(chan struct{})
	go c.watch(c.watchEnd)
}

// watch reads on the connection while a handler runs: bytes are the next request's
// (kept, and the watch ends); EOF or an error means the client left, and the request's
// context ends. endWatch ends it with a deadline in the past.
func (c *conn) watch(end chan struct{}) {
	defer close(end)
	n, err := c.nc.Read(c.buf[c.w:])
	c.mu.Lock()
	defer c.mu.Unlock()
	c.w += n
	if err != nil && n == 0 {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return // endWatch
		}
		c.gone = true
		c.cancel()
	}
}

// endWatch ends the watch's read and waits for it.
func (c *conn) endWatch() {
	_ = c.setDeadline(&c.rdl, aLongTimeAgo, false)
	<-c.watchEnd
	_ = c.setDeadline(&c.rdl, time.Time{}, false)
	c.mu.Lock()
	c.watching = false
	c.mu.Unlock()
}

// deadlineSlack is how much earlier than asked a deadline set coarsely may fall:
// a deadline within it of the one already set is not set again, which spares the
// runtime's timer work for nearly every request on a busy connection (the deadlines
// are timeouts of many seconds).
const deadlineSlack = time.Second

// setDeadline sets the read (at == &c.rdl) or write (&c.wdl) deadline to t; coarse:
// unless the one set already is in [t-deadlineSlack, t].
func (c *conn) setDeadline(at *time.Time, t time.Time, coarse bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.setDeadlineLocked(at, t, coarse)
}

func (c *conn) setDeadlineLocked(at *time.Time, t time.Time, coarse bool) error {
	if coarse && !at.IsZero() && !t.IsZero() && !at.After(t) && t.Sub(*at) <= deadlineSlack {
		return nil
	}
	*at = t
	if at == &c.rdl {
		return c.nc.SetReadDeadline(t)
	}
	return c.nc.SetWriteDeadline(t)
}

// handoffListener is the listener net/http's server accepts the handed over
// connections from.
type handoffListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newHandoffListener(addr net.Addr) *handoffListener {
	return &handoffListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// give hands c to the server; false when the listener is closed.
func (l *handoffListener) give(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *handoffListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *handoffListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *handoffListener) Addr() net.Addr { return l.addr }

// replayConn is a connection whose first reads return pending, the bytes the fast
// path read before it handed the connection over.
type replayConn struct {
	net.Conn
	pending []byte
}

func (c *replayConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}
