// Package rawup is an HTTP/1.1 upstream written by hand for tests, on loopback, so
// that it can misbehave in ways net/http's server never does: write bytes after a
// response, lie about lengths, never finish a body, send heads of any size.
package rawup

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Answer writes the upstream's bytes for req, the n-th request the upstream read
// (from 1, across connections), on c; false ends the connection. It runs on the
// connection's goroutine: what it writes comes before anything about the next
// request on the connection.
type Answer func(c *Conn, req *http.Request, n int64) bool

// Conn is one connection the upstream accepted.
type Conn struct {
	net.Conn
	s *server
}

// Later writes data on c after d, from another goroutine, unless the upstream is
// closed first; the connection's requests go on meanwhile.
func (c *Conn) Later(d time.Duration, data string) {
	c.s.wg.Add(1)
	go func() {
		defer c.s.wg.Done()
		select {
		case <-time.After(d):
			_, _ = io.WriteString(c, data)
		case <-c.s.done:
		}
	}()
}

// Done is closed when the upstream closes: an answer that writes forever stops on it.
func (c *Conn) Done() <-chan struct{} { return c.s.done }

type server struct {
	ln    net.Listener
	wg    sync.WaitGroup
	done  chan struct{}
	mu    sync.Mutex
	conns []net.Conn
	count atomic.Int64
}

// Start starts an upstream on a free loopback port that answers each request with
// answer, and returns its URL. The upstream and its connections are closed when the
// test ends.
func Start(tb testing.TB, answer Answer) *url.URL {
	tb.Helper()
	return listen(tb, func(s *server, c *Conn) {
		br := bufio.NewReader(c)
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			_, _ = io.Copy(io.Discard, req.Body)
			if !answer(c, req, s.count.Add(1)) {
				return
			}
		}
	})
}

// Fixed starts an upstream on a free loopback port that answers every request head
// on every connection with answer, and returns its URL; it reads heads alone
// (requests without bodies), and allocates nothing per request, so that a
// benchmark's allocations are its own. The upstream and its connections are closed
// when the test ends.
func Fixed(tb testing.TB, answer string) *url.URL {
	tb.Helper()
	out := []byte(answer)
	return listen(tb, func(_ *server, c *Conn) {
		br := bufio.NewReader(c)
		for {
			line, err := br.ReadSlice('\n')
			if err != nil {
				return
			}
			if len(bytes.TrimRight(line, "\r\n")) == 0 {
				if _, err := c.Write(out); err != nil {
					return
				}
			}
		}
	})
}

// listen serves each connection accepted on a free loopback port with serve, on a
// goroutine of its own, until the test ends.
func listen(tb testing.TB, serve func(s *server, c *Conn)) *url.URL {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &server{ln: ln, done: make(chan struct{})}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			select {
			case <-s.done: // closed after Accept returned: the cleanup did not see nc
				nc.Close()
			default:
				s.conns = append(s.conns, nc)
			}
			s.mu.Unlock()
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				defer nc.Close()
				serve(s, &Conn{Conn: nc, s: s})
			}()
		}
	}()
	tb.Cleanup(func() {
		close(s.done)
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return &url.URL{Scheme: "http", Host: ln.Addr().String()}
}

// Text answers every request with the bytes answer gives for its number.
func Text(answer func(n int64) string) Answer {
	return func(c *Conn, _ *http.Request, n int64) bool {
		_, err := io.WriteString(c, answer(n))
		return err == nil
	}
}
