package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/headermap"
)

// served is a Server on a loopback listener, and whether each request reached the
// fast path or net/http.
type served struct {
	s    *Server
	addr string
	fast atomic.Int64 // requests the fast path served
	slow atomic.Int64 // requests net/http served
	errs chan error
}

// serveH1 serves h on the fast path, with sluice serve's server timeouts, counting
// which server answered each request.
func serveH1(t *testing.T, h http.Handler) *served {
	t.Helper()
	return serveTimeouts(t, h, 10*time.Second, 60*time.Second, 90*time.Second, 120*time.Second)
}

func (sv *served) dial(t *testing.T) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", sv.addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

func send(t *testing.T, c net.Conn, raw string) {
	t.Helper()
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
}

func readResponse(t *testing.T, br *bufio.Reader, method string) (*http.Response, string) {
	t.Helper()
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// echo answers with the method, target, Host, the sorted header and the body.
var echo = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	fmt.Fprintf(w, "%s %s %s %q %s", r.Method, r.RequestURI, r.Host, r.Header.Get("X-A"), b)
})

func TestKeepAliveAndPipelining(t *testing.T) {
	sv := serveH1(t, echo)
	c, br := sv.dial(t)
	send(t, c, "GET /a HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\n")
	resp, body := readResponse(t, br, "GET")
	if resp.StatusCode != 200 || body != `GET /a h "1" ` || resp.ContentLength != int64(len(body)) || resp.Close {
		t.Fatalf("first: %d %q (length %d, close %v)", resp.StatusCode, body, resp.ContentLength, resp.Close)
	}
	if resp.Header.Get("Date") == "" || resp.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Errorf("header %v: want a Date and the sniffed Content-Type", resp.Header)
	}
	// Two requests in one write, the second with a body split from its head.
	send(t, c, "POST /b HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhelloPOST /c HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nab")
	time.Sleep(10 * time.Millisecond) // not an assertion: lets the body arrive in two reads
	send(t, c, "c")
	for _, want := range []string{`POST /b h "" hello`, `POST /c h "" abc`} {
		if _, body := readResponse(t, br, "POST"); body != want {
			t.Fatalf("got %q, want %q", body, want)
		}
	}
	if sv.fast.Load() != 3 || sv.slow.Load() != 0 {
		t.Errorf("fast %d, net/http %d: want 3 and 0", sv.fast.Load(), sv.slow.Load())
	}
}

func TestUnusualRequestsGoToNetHTTP(t *testing.T) {
	sv := serveH1(t, echo)
	c, br := sv.dial(t)
	send(t, c, "GET /a HTTP/1.1\r\nHost: h\r\n\r\n")
	readResponse(t, br, "GET")
	// A chunked body after a request the fast path served: net/http takes the
	// connection over, with the bytes already read.
	send(t, c, "POST /b HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\nGET /c HTTP/1.1\r\nHost: h\r\n\r\n")
	if _, body := readResponse(t, br, "POST"); body != `POST /b h "" abc` {
		t.Fatalf("chunked: %q", body)
	}
	if _, body := readResponse(t, br, "GET"); body != `GET /c h "" ` {
		t.Fatalf("after it: %q", body)
	}
	if sv.fast.Load() != 1 || sv.slow.Load() != 2 {
		t.Errorf("fast %d, net/http %d: want 1 and 2", sv.fast.Load(), sv.slow.Load())
	}
}

// TestRefusedAsNetHTTPRefuses sends each smuggling case to the fast path and to
// net/http's server alone: the status lines must be the same.
func TestRefusedAsNetHTTPRefuses(t *testing.T) {
	sv := serveH1(t, echo)
	plain := &http.Server{Handler: echo, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10, ErrorLog: log.New(io.Discard, "", 0)}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(ln)
	t.Cleanup(func() { plain.Close() })
	huge := "GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X-Long: "+strings.Repeat("x", 1000)+"\r\n", 80) + "\r\n"
	mid := "GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X-Long: "+strings.Repeat("x", 1000)+"\r\n", 8) + "\r\n"
	for _, raw := range append(append([]string{}, smuggling...), huge, mid, "GET / HTTP/1.1\r\nHost: a\r\n") {
		got := statusLine(t, sv.addr, raw)
		want := statusLine(t, ln.Addr().String(), raw)
		if got != want {
			t.Errorf("%.80q: %q, net/http alone %q", raw, got, want)
		}
	}
	if n := sv.fast.Load(); n != 0 {
		t.Errorf("the fast path served %d of them", n)
	}
}

// statusLine sends raw on a connection of its own, half-closes it and returns the
// first line of the answer ("" when there is none).
func statusLine(t *testing.T, addr, raw string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	go func() {
		io.WriteString(c, raw)
		c.(*net.TCPConn).CloseWrite()
	}()
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	line, _ := bufio.NewReader(c).ReadString('\n')
	return line
}

func TestLargeAndStreamedResponses(t *testing.T) {
	big := strings.Repeat("0123456789", 2000)
	release := make(chan struct{})
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			io.WriteString(w, big)
		case "/length":
			w.Header().Set("Content-Length", strconv.Itoa(len(big)))
			io.WriteString(w, big)
		case "/stream":
			io.WriteString(w, "first")
			if err := http.NewResponseController(w).Flush(); err != nil {
				t.Error(err)
			}
			<-release
			io.WriteString(w, "second")
		case "/trailer":
			w.Header().Set("Trailer", "X-Sum")
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "42")
		case "/none":
			w.WriteHeader(http.StatusNoContent)
			if _, err := w.Write([]byte("x")); !errors.Is(err, http.ErrBodyNotAllowed) {
				t.Errorf("a body on 204: %v", err)
			}
		}
	}))
	c, br := sv.dial(t)
	send(t, c, "GET /big HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := readResponse(t, br, "GET")
	if body != big || len(resp.TransferEncoding) != 1 {
		t.Fatalf("big: %d bytes, %v", len(body), resp.TransferEncoding)
	}
	send(t, c, "GET /length HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp, body := readResponse(t, br, "GET"); body != big || resp.ContentLength != int64(len(big)) {
		t.Fatalf("length: %d bytes, length %d", len(body), resp.ContentLength)
	}
	send(t, c, "GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, first); err != nil || string(first) != "first" {
		t.Fatalf("streamed: %q %v", first, err)
	}
	close(release)
	if rest, _ := io.ReadAll(resp.Body); string(rest) != "second" {
		t.Fatalf("streamed rest: %q", rest)
	}
	send(t, c, "GET /trailer HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp, body := readResponse(t, br, "GET"); body != "body" || resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("trailer: %q %v", body, resp.Trailer)
	}
	send(t, c, "GET /none HTTP/1.1\r\nHost: h\r\n\r\n")
	if resp, body := readResponse(t, br, "GET"); resp.StatusCode != 204 || body != "" || resp.Header["Content-Length"] != nil {
		t.Fatalf("204: %q %v", body, resp.Header)
	}
	// Still one connection.
	send(t, c, "GET /none HTTP/1.1\r\nHost: h\r\n\r\n")
	readResponse(t, br, "GET")
}

func TestConnectionEnds(t *testing.T) {
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abort":
			io.WriteString(w, "part")
			panic(http.ErrAbortHandler)
		case "/unread":
		case "/short":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "abc")
		}
	}))
	for _, tc := range []struct {
		raw       string
		answered  bool // a response comes back
		keepAlive bool
	}{
		{"GET /abort HTTP/1.1\r\nHost: h\r\n\r\n", false, false},
		{"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n", true, false},
		{"POST /unread HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nhello", true, true},
		{"POST /unread HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n\r\nhello", true, false},
		{"GET /short HTTP/1.1\r\nHost: h\r\n\r\n", true, false},
	} {
		c, br := sv.dial(t)
		send(t, c, tc.raw)
		_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
		resp, err := http.ReadResponse(br, nil)
		if (err == nil) != tc.answered {
			t.Errorf("%.40q: answer %v, want one: %v", tc.raw, err, tc.answered)
			continue
		}
		if err == nil {
			io.ReadAll(resp.Body)
		}
		// A connection kept alive answers another request; a closed one reads EOF.
		send(t, c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
		_, err = http.ReadResponse(br, nil)
		if (err == nil) != tc.keepAlive {
			t.Errorf("%.40q: next request: %v, want kept alive: %v", tc.raw, err, tc.keepAlive)
		}
	}
}

func TestClientGoneEndsTheContext(t *testing.T) {
	ended := make(chan error, 1)
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/post" {
			io.ReadAll(r.Body)
		}
		<-r.Context().Done()
		ended <- r.Context().Err()
	}))
	for _, raw := range []string{
		"GET /wait HTTP/1.1\r\nHost: h\r\n\r\n",
		"POST /post HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc",
	} {
		c, _ := sv.dial(t)
		send(t, c, raw)
		time.Sleep(2 * watchAfter) // not an assertion: the watch starts either way
		c.Close()
		if err := <-ended; !errors.Is(err, context.Canceled) {
			t.Errorf("%.30q: %v", raw, err)
		}
	}
}

func TestResponseController(t *testing.T) {
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for name, err := range map[string]error{
			"EnableFullDuplex": rc.EnableFullDuplex(),
			"SetReadDeadline":  rc.SetReadDeadline(time.Now().Add(time.Minute)),
			"SetWriteDeadline": rc.SetWriteDeadline(time.Now().Add(time.Minute)),
			"Flush":            rc.Flush(),
		} {
			if err != nil {
				fmt.Fprintf(w, "%s: %v\n", name, err)
			}
		}
	}))
	c, br := sv.dial(t)
	send(t, c, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	if _, body := readResponse(t, br, "GET"); body != "" {
		t.Fatal(body)
	}
}

func TestShutdown(t *testing.T) {
	inside, release := make(chan struct{}), make(chan struct{})
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(inside)
			<-release
		}
		io.WriteString(w, "done")
	}))
	hooked := make(chan struct{})
	var once sync.Once
	sv.s.Fallback.RegisterOnShutdown(func() { once.Do(func() { close(hooked) }) })
	idle, idleBR := sv.dial(t)
	send(t, idle, "GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	readResponse(t, idleBR, "GET")
	busy, busyBR := sv.dial(t)
	send(t, busy, "GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inside
	shut := make(chan error, 1)
	go func() { shut <- sv.s.Shutdown(context.Background()) }()
	<-hooked
	// The idle connection is closed; the busy one gets its answer.
	_ = idle.SetReadDeadline(time.Now().Add(20 * time.Second))
	if n, err := idleBR.ReadByte(); err == nil {
		t.Errorf("idle connection read %q", n)
	}
	close(release)
	if _, body := readResponse(t, busyBR, "GET"); body != "done" {
		t.Errorf("busy: %q", body)
	}
	if err := <-shut; err != nil {
		t.Error(err)
	}
	if err := <-sv.errs; !errors.Is(err, http.ErrServerClosed) {
		t.Errorf("Serve: %v", err)
	}
}

// TestResponseHeaderStartsEmpty: each request's handler gets an empty header and
// answers with its own fields alone, on a connection whose earlier responses set
// others (the connection's response and its header map are reused, and one that held
// many fields is replaced).
func TestResponseHeaderStartsEmpty(t *testing.T) {
	sv := serveH1(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n := len(w.Header()); n != 0 {
			t.Errorf("%s: the handler's header has %d fields at its start", r.URL.Path, n)
		}
		switch r.URL.Path {
		case "/a":
			w.Header().Set("X-A", "a")
		case "/many":
			for i := range 2 * headermap.MaxReused {
				w.Header().Set("X-Many-"+strconv.Itoa(i), "v")
			}
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	c, br := sv.dial(t)
	for _, path := range []string{"/a", "/b", "/many", "/b", "/a", "/b"} {
		send(t, c, "GET "+path+" HTTP/1.1\r\nHost: h\r\n\r\n")
		resp, _ := readResponse(t, br, http.MethodGet)
		var want []string
		switch path {
		case "/a":
			want = []string{"X-A"}
		case "/many":
			for i := range 2 * headermap.MaxReused {
				want = append(want, "X-Many-"+strconv.Itoa(i))
			}
		}
		delete(resp.Header, "Date")
		if len(resp.Header) != len(want) {
			t.Errorf("%s: answered with %v, want the fields %v and Date", path, resp.Header, want)
		}
		for _, k := range want {
			if resp.Header.Get(k) == "" {
				t.Errorf("%s: no %s in %v", path, k, resp.Header)
			}
		}
	}
	if n := sv.fast.Load(); n != 6 {
		t.Errorf("the fast path served %d requests, want 6", n)
	}
}
