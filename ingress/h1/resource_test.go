package h1

import (
	"bufio"
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// TestMain fails the package when a test leaves a goroutine behind: every
// connection the fast path served, handed over or closed must end.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// serveTimeouts serves h on the fast path with the fallback's timeouts given (short
// ones for the resource attacks, which wait for them to pass), counting which server
// answered each request.
func serveTimeouts(t *testing.T, h http.Handler, readHeader, read, write, idle time.Duration) *served {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	sv := &served{addr: ln.Addr().String(), errs: make(chan error, 1)}
	fb := &http.Server{
		ReadHeaderTimeout: readHeader, ReadTimeout: read, WriteTimeout: write, IdleTimeout: idle,
		MaxHeaderBytes: 64 << 10, ErrorLog: log.New(io.Discard, "", 0),
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if _, ok := w.(*response); ok {
				sv.fast.Add(1)
			} else {
				sv.slow.Add(1)
			}
			h.ServeHTTP(w, r)
		}),
	}
	sv.s = &Server{Fallback: fb}
	go func() { sv.errs <- sv.s.Serve(ln) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = sv.s.Shutdown(ctx)
	})
	return sv
}

// dribble writes raw one byte at a time, every gap, until the server closes the
// connection or all of raw is written; it returns how many bytes went out and
// what the server sent.
func dribble(t *testing.T, c net.Conn, raw string, gap time.Duration) (sent int, answer string) {
	t.Helper()
	read := make(chan string, 1)
	closed := make(chan struct{})
	go func() {
		b, _ := io.ReadAll(c)
		close(closed)
		read <- string(b)
	}()
	for sent < len(raw) {
		select {
		case <-closed:
			return sent, <-read
		case <-time.After(gap):
		}
		if _, err := c.Write([]byte{raw[sent]}); err != nil {
			break
		}
		sent++
	}
	c.(*net.TCPConn).CloseWrite()
	return sent, <-read
}

// TestSlowlorisHeadTimesOut dribbles a head byte by byte, far slower than
// ReadHeaderTimeout allows in all (100 times longer): the server must close the
// connection before the head is whole, on a connection's first request, on one
// kept alive, after a POST, after a request whose client was watched, and with the
// head's first bytes in the buffer already.
func TestSlowlorisHeadTimesOut(t *testing.T) {
	const readHeader = 200 * time.Millisecond
	const gap = 20 * time.Millisecond
	head := "GET /slow HTTP/1.1\r\nHost: a\r\nX-Pad: " + strings.Repeat("x", 1000) + "\r\n\r\n" // 20 s at gap
	sv := serveTimeouts(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/watched" {
			time.Sleep(4 * watchAfter) // not an assertion: the watch starts or not
		}
		io.ReadAll(r.Body)
		io.WriteString(w, r.URL.Path)
	}), readHeader, 0, 0, 10*time.Second)
	for _, lead := range []string{
		"",
		"GET /first HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST /first HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"GET /watched HTTP/1.1\r\nHost: a\r\n\r\n",
	} {
		for _, pre := range []string{"", "GET /sl"} {
			c, err := net.Dial("tcp", sv.addr)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.WriteString(c, lead+pre); err != nil {
				t.Fatal(err)
			}
			sent, answer := dribble(t, c, head[len(pre):], gap)
			c.Close()
			if sent == len(head)-len(pre) || strings.Contains(answer, "/slow") {
				t.Errorf("lead %q, %q first: the whole head went out (%d bytes) and got %q", lead, pre, sent, answer)
			}
		}
	}
}

// TestSlowBodyTimesOut dribbles a declared body: ReadTimeout ends it.
func TestSlowBodyTimesOut(t *testing.T) {
	got := make(chan error, 1)
	sv := serveTimeouts(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got <- err
	}), time.Second, 200*time.Millisecond, 0, 10*time.Second)
	c, err := net.Dial("tcp", sv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	body := strings.Repeat("x", 1000)
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1000\r\n\r\n")
	if sent, _ := dribble(t, c, body, 20*time.Millisecond); sent == len(body) {
		t.Errorf("the whole body went out")
	}
	if err := <-got; err == nil {
		t.Errorf("the handler read the whole body")
	}
}

// TestClientThatNeverReads: a handler writes far more than the socket buffers hold
// to a client that reads nothing; WriteTimeout ends the write, the handler returns,
// the connection closes, and nothing stays behind (TestMain).
func TestClientThatNeverReads(t *testing.T) {
	done := make(chan error, 1)
	sv := serveTimeouts(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		chunk := make([]byte, 64<<10)
		var err error
		for i := 0; i < 1024 && err == nil; i++ { // 64 MiB
			_, err = w.Write(chunk)
		}
		done <- err
	}), time.Second, 0, 300*time.Millisecond, 10*time.Second)
	c, err := net.Dial("tcp", sv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.(*net.TCPConn).SetReadBuffer(4 << 10)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if err := <-done; err == nil {
		t.Fatal("64 MiB written to a client that reads nothing")
	}
}

// TestManyIdleConnections keeps 1,000 connections idle after a request each, then
// shuts down: every one is closed, Shutdown returns without waiting for a timeout,
// and nothing stays behind (TestMain).
func TestManyIdleConnections(t *testing.T) {
	sv := serveH1(t, echo)
	const n = 1000
	conns := make([]net.Conn, 0, n)
	readers := make([]*bufio.Reader, 0, n)
	for range n {
		c, err := net.Dial("tcp", sv.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		io.WriteString(c, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
		conns = append(conns, c)
		readers = append(readers, bufio.NewReader(c))
	}
	for _, br := range readers {
		readResponse(t, br, "GET")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sv.s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown with %d idle connections: %v", n, err)
	}
	for i, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if b, err := readers[i].ReadByte(); err == nil {
			t.Fatalf("idle connection %d read %q after Shutdown", i, b)
		}
	}
}

// TestShutdownClosesSilentConnections: a connection that has sent nothing does not
// hold Shutdown up for its head's timeout (an hour here): it is closed once it has
// been open newConnGrace, as net/http closes a new connection, while one that has
// begun a head is left to finish it.
func TestShutdownClosesSilentConnections(t *testing.T) {
	sv := serveTimeouts(t, echo, time.Hour, 0, 0, time.Hour)
	silent, err := net.Dial("tcp", sv.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	begun, br := sv.dial(t)
	send(t, begun, "GET / HTTP/1.1\r\n")
	// The server has the connections once a request on a third one is answered.
	probe, probeBR := sv.dial(t)
	send(t, probe, "GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	readResponse(t, probeBR, "GET")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	shut := make(chan error, 1)
	go func() { shut <- sv.s.Shutdown(ctx) }()
	_ = silent.SetReadDeadline(time.Now().Add(30 * time.Second))
	if b, err := bufio.NewReader(silent).ReadByte(); err == nil {
		t.Fatalf("the silent connection read %q after Shutdown", b)
	} else if ne := net.Error(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatal("Shutdown left the silent connection open")
	}
	send(t, begun, "Host: a\r\n\r\n")
	if res, _ := readResponse(t, br, "GET"); res.StatusCode != http.StatusOK {
		t.Errorf("the begun head got %s", res.Status)
	}
	if err := <-shut; err != nil {
		t.Fatal(err)
	}
}

// TestClosedMidBody: a client that leaves within its body ends the handler's read
// with io.ErrUnexpectedEOF (net/http's error) and its connection.
func TestClosedMidBody(t *testing.T) {
	got := make(chan error, 1)
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, err := io.ReadAll(r.Body)
		got <- err
	}))
	c, err := net.Dial("tcp", sv.addr)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 100000\r\n\r\n"+strings.Repeat("x", 5000))
	c.Close()
	if err := <-got; !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("read of a body cut short: %v", err)
	}
}

// TestBodyOverTheCap answers a body larger than http.MaxBytesReader's cap 413, as
// the front door's cap does: with 256 KiB or more unread the answer says
// Connection: close and the connection ends; with less it is drained and the
// connection carries the next request.
func TestBodyOverTheCap(t *testing.T) {
	const limit = 1000
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit)); err != nil {
			http.Error(w, "too large", http.StatusRequestEntityTooLarge)
			return
		}
		io.WriteString(w, "ok")
	}))
	for _, tc := range []struct {
		size      int
		keepAlive bool
	}{
		{limit, true},
		{limit + 1, true},
		{100 << 10, true},
		{256<<10 + limit, true},
		{256<<10 + limit + 1, false},
		{1 << 20, false},
	} {
		c, br := sv.dial(t)
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		go func() {
			io.WriteString(c, "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: "+itoa(tc.size)+"\r\n\r\n"+strings.Repeat("x", tc.size)+
				"GET /next HTTP/1.1\r\nHost: a\r\n\r\n")
		}()
		resp, _ := readResponse(t, br, "POST")
		want := http.StatusOK
		if tc.size > limit {
			want = http.StatusRequestEntityTooLarge
		}
		if resp.StatusCode != want || resp.Close == tc.keepAlive {
			t.Errorf("%d bytes: %d close=%v, want %d close=%v", tc.size, resp.StatusCode, resp.Close, want, !tc.keepAlive)
			continue
		}
		if tc.keepAlive {
			if _, body := readResponse(t, br, "GET"); body != "ok" {
				t.Errorf("%d bytes: the next request got %q", tc.size, body)
			}
		}
	}
}

func itoa(n int) string {
	var b [20]byte
	i := len(b)
	for {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(b[i:])
		}
	}
}

// TestShutdownLeavesNoGoroutine serves a mix of everything (fast, handed over,
// watched, panicking) and shuts down; TestMain then finds no goroutine left.
func TestShutdownLeavesNoGoroutine(t *testing.T) {
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/panic":
			panic(http.ErrAbortHandler)
		case "/wait":
			time.Sleep(4 * watchAfter)
		}
		io.Copy(io.Discard, r.Body)
	}))
	var wg sync.WaitGroup
	for _, raw := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /wait HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /panic HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nx",
	} {
		wg.Go(func() { statusLine(t, sv.addr, raw) })
	}
	wg.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sv.s.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestExpectContinueAndUpgradeGoToNetHTTP: a client that waits for 100 Continue
// gets it from net/http before it sends its body, and an Upgrade reaches a handler
// that can hijack the connection.
func TestExpectContinueAndUpgradeGoToNetHTTP(t *testing.T) {
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") == "" {
			b, _ := io.ReadAll(r.Body)
			w.Write(b)
			return
		}
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		line, _ := brw.ReadString('\n')
		c.Write([]byte("echo " + line))
	}))
	c, br := sv.dial(t)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	send(t, c, "GET /lead HTTP/1.1\r\nHost: a\r\n\r\n")
	readResponse(t, br, "GET")
	send(t, c, "POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	if line, err := br.ReadString('\n'); err != nil || line != "HTTP/1.1 100 Continue\r\n" {
		t.Fatalf("before the body: %q %v", line, err)
	}
	br.ReadString('\n')
	send(t, c, "hello")
	if _, body := readResponse(t, br, "POST"); body != "hello" {
		t.Fatalf("after 100 Continue: %q", body)
	}
	send(t, c, "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	send(t, c, "ping\n")
	if line, err := br.ReadString('\n'); line != "echo ping\n" {
		t.Fatalf("on the upgraded connection: %q %v", line, err)
	}
	if sv.slow.Load() != 2 || sv.fast.Load() != 1 {
		t.Errorf("fast %d, net/http %d: want 1 and 2", sv.fast.Load(), sv.slow.Load())
	}
}
