package h1

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

const benchRequest = "GET /orders/42?x=1 HTTP/1.1\r\nHost: api.example.com\r\nUser-Agent: wrk\r\nAccept: */*\r\n" +
	"Authorization: Bearer abc\r\nX-Request-Id: 7f3a\r\n\r\n"

// BenchmarkParseHead is the parse of a six-field head from memory.
func BenchmarkParseHead(b *testing.B) {
	raw := []byte(benchRequest)
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseHead(raw); !ok {
			b.Fatal("refused")
		}
	}
}

// memConn is a connection that reads the same request for ever and drops what is
// written: the fast path's own cost per request, no system call in it.
type memConn struct {
	req []byte
	n   int
	// ok counts the writes that begin with a 200's status line and end with
	// upstreamAnswer's body.
	ok int
}

func (c *memConn) Read(p []byte) (int, error) {
	c.n++
	return copy(p, c.req), nil
}
func (c *memConn) Write(p []byte) (int, error) {
	if bytes.HasPrefix(p, []byte("HTTP/1.1 200 OK\r\n")) && bytes.HasSuffix(p, []byte(`{"ok":true}`)) {
		c.ok++
	}
	return len(p), nil
}

func (c *memConn) Close() error                     { return nil }
func (c *memConn) LocalAddr() net.Addr              { return &net.TCPAddr{} }
func (c *memConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 40000} }
func (c *memConn) SetDeadline(time.Time) error      { return nil }
func (c *memConn) SetReadDeadline(time.Time) error  { return nil }
func (c *memConn) SetWriteDeadline(time.Time) error { return nil }

// benchServe serves benchRequest with h, as sluice serve's front door would (its
// server's timeouts, the peer's address set), on a connection from memory, for the
// benchmark's iterations; it returns the connection, which counted the answers.
func benchServe(b *testing.B, h http.Handler) *memConn {
	s := &Server{Fallback: &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, WriteTimeout: time.Minute,
		IdleTimeout: time.Minute}}
	mc := &memConn{req: []byte(benchRequest)}
	c := newConn(s, mc)
	c.remote = mc.RemoteAddr().String() // as serve sets it
	b.Cleanup(func() {
		if c.timer != nil {
			c.timer.Stop()
		}
	})
	b.ReportAllocs()
	for b.Loop() {
		head, n, ok := c.readHead()
		if !ok || !c.serveRequest(head, n) {
			b.Fatal("not served")
		}
	}
	return mc
}

// BenchmarkServeRequest is one request read, handled by a handler answering 204
// with two fields, and answered, on a connection from memory.
func BenchmarkServeRequest(b *testing.B) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Ratelimit-Remaining", "9")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNoContent)
	})
	s := &Server{Fallback: &http.Server{Handler: h, ReadHeaderTimeout: time.Second, WriteTimeout: time.Second,
		IdleTimeout: time.Second, ErrorLog: nil}}
	c := newConn(s, &memConn{req: []byte(benchRequest)})
	b.ReportAllocs()
	for b.Loop() {
		h, n, ok := c.readHead()
		if !ok || !c.serveRequest(h, n) {
			b.Fatal("not served")
		}
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	_ = io.Discard
}

// BenchmarkAppendFields is the writing of a response head's fields as sluice serve
// answers on sluice-bench's rules: the rate-limit fields and the Date added.
func BenchmarkAppendFields(b *testing.B) {
	h := http.Header{"X-Ratelimit-Limit": {"1000000000"}, "X-Ratelimit-Remaining": {"999999999"},
		"Ratelimit-Policy": {`"per_ip";q=1000000000;w=1`}, "Ratelimit": {`"per_ip";r=999999999;t=1`}}
	extra := []string{"Date", "Tue, 01 Dec 2026 12:00:00 GMT"}
	buf := make([]byte, 0, 1024)
	b.ReportAllocs()
	for b.Loop() {
		buf = appendFields(buf[:0], h, extra)
	}
}
