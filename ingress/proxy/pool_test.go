package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingress/internal/headermap"
	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// writeGet is a HeadWriter of bodiless requests to r's path.
func writeGet(bw *bufio.Writer, r *http.Request, _, _ bool) error {
	bw.WriteString(r.Method)
	bw.WriteString(" ")
	bw.WriteString(r.URL.RequestURI())
	bw.WriteString(" HTTP/1.1\r\nHost: upstream\r\n\r\n")
	return nil
}

// outcome is what a client got through the pool.
type outcome struct {
	status  int
	header  http.Header
	body    string
	err     error // from Exchange
	aborted bool  // Relay aborted the client's connection
}

func newPool(t testing.TB, u *url.URL, opts ...Option) *Pool {
	t.Helper()
	p, err := New(u.Host, append([]Option{WithLogger(slog.New(slog.DiscardHandler)), WithResponseTimeout(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.CloseIdleConnections)
	return p
}

// do sends method path through p and relays the response into a recorder.
func do(p *Pool, method, path string) outcome { return doCtx(context.Background(), p, method, path) }

// doCtx is do with a context for the request.
func doCtx(ctx context.Context, p *Pool, method, path string) (o outcome) {
	r := httptest.NewRequest(method, "http://front"+path, nil).WithContext(ctx)
	res, err := p.Exchange(r, writeGet)
	if err != nil {
		return outcome{err: err}
	}
	w := httptest.NewRecorder()
	defer func() {
		if v := recover(); v != nil {
			if err, ok := v.(error); !ok || !errors.Is(err, http.ErrAbortHandler) {
				panic(v)
			}
			o.aborted = true
		}
		o.status, o.header, o.body = w.Code, w.Result().Header, w.Body.String()
	}()
	res.Relay(w, r)
	return o
}

// waitIdle waits until p has n idle connections.
func waitIdle(t *testing.T, p *Pool, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); p.Idle() != n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d idle connections, want %d", p.Idle(), n)
		}
	}
}

const real = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"

// forged is a complete response that, read as the answer to the next request, would
// be another client's.
const forged = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"

// TestFraming: each response whose end is ambiguous or malformed fails or is relayed
// and its connection closed, and the next request gets its own answer on a new
// connection; the well-framed ones keep theirs.
func TestFraming(t *testing.T) {
	for _, tc := range []struct {
		name   string
		method string
		first  string
		fails  error // from Exchange; nil: relayed
		body   string
		kept   bool // the connection stays in the pool
	}{
		{"content-length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", nil, "ok", true},
		{"chunked with trailer", "GET", "HTTP/1.1 200 OK\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n2;ext=1\r\nok\r\n0\r\nX-T: t\r\n\r\n", nil, "ok", true},
		{"103 then 200", "GET", "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", nil, "ok", true},
		{"HEAD without length", "HEAD", "HTTP/1.1 200 OK\r\n\r\n", nil, "", true},
		{"HEAD with Content-Length", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 39\r\n\r\n", nil, "", false},
		{"HEAD with a body", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 39\r\n\r\n" + forged, nil, "", false},
		{"HEAD chunked", "HEAD", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", nil, "", false},
		{"204 with Content-Length", "GET", "HTTP/1.1 204 No Content\r\nContent-Length: 6\r\n\r\n", nil, "", false},
		{"304 chunked", "GET", "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n", nil, "", false},
		{"HTTP/1.0 keep-alive", "GET", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok", nil, "ok", false},
		{"Connection: close", "GET", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", nil, "ok", false},
		{"until close", "GET", "HTTP/1.1 200 OK\r\n\r\nok", nil, "ok", false},
		{"a second response", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + forged, nil, "ok", false},
		{"Content-Length and Transfer-Encoding", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + forged, ErrBadResponse, "", false},
		{"two Content-Lengths", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 40\r\n\r\nok" + forged, ErrBadResponse, "", false},
		{"a list in Content-Length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2, 2\r\n\r\nok", ErrBadResponse, "", false},
		{"gzip transfer coding", "GET", "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", ErrBadResponse, "", false},
		{"Transfer-Encoding in HTTP/1.0", "GET", "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", ErrBadResponse, "", false},
		{"bare CR in a header", "GET", "HTTP/1.1 200 OK\r\nX-A: a\rContent-Length: 0\r\nContent-Length: 40\r\n\r\n" + forged, ErrBadResponse, "", false},
		{"101 unasked", "GET", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n" + forged, ErrBadResponse, "", false},
		{"1xx with a length", "GET", "HTTP/1.1 102 Processing\r\nContent-Length: 4\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", nil, "ok", true},
		{"status 600", "GET", "HTTP/1.1 600 Odd\r\nContent-Length: 0\r\n\r\n", ErrBadResponse, "", false},
		{"HTTP/2 status line", "GET", "HTTP/2 200 OK\r\nContent-Length: 0\r\n\r\n", ErrBadResponse, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := rawup.Start(t, func(c *rawup.Conn, req *http.Request, n int64) bool {
				if n == 1 {
					_, err := io.WriteString(c, tc.first)
					return err == nil && tc.name != "until close"
				}
				_, err := io.WriteString(c, real)
				return err == nil
			})
			p := newPool(t, u)
			o := do(p, tc.method, "/first")
			switch {
			case tc.fails != nil:
				if !errors.Is(o.err, tc.fails) {
					t.Fatalf("first exchange: %v, want %v", o.err, tc.fails)
				}
			case o.err != nil:
				t.Fatalf("first exchange: %v", o.err)
			case o.body != tc.body:
				t.Errorf("first body %q, want %q", o.body, tc.body)
			}
			if tc.kept {
				waitIdle(t, p, 1)
			} else if n := p.Idle(); n != 0 {
				t.Errorf("%d idle connections after the response, want 0", n)
			}
			if o := do(p, "GET", "/second"); o.err != nil || o.body != "real" {
				t.Errorf("second client got %q (%v), want its own answer %q", o.body, o.err, "real")
			}
		})
	}
}

// TestHeadBudget: a head over the limit fails with ErrHeadTooLarge, informational
// responses count toward it, and so does a trailer section; one at the limit passes.
func TestHeadBudget(t *testing.T) {
	const limit = 4096
	pad := func(n int) string { return "X-Pad: " + strings.Repeat("a", n) + "\r\n" }
	head := func(extra string) string { return "HTTP/1.1 200 OK\r\n" + extra + "Content-Length: 2\r\n\r\nok" }
	atLimit := head(pad(limit - len(head(pad(0))) + 2)) // the head is limit bytes, "ok" the body
	for _, tc := range []struct {
		name   string
		answer string
		err    error
	}{
		{"at the limit", atLimit, nil},
		{"one byte over", head(pad(limit - len(head(pad(0))) + 3)), ErrHeadTooLarge},
		{"one long line", "HTTP/1.1 200 OK\r\nX-Pad: " + strings.Repeat("a", 1<<20), ErrHeadTooLarge},
		{"a long status line", "HTTP/1.1 200 " + strings.Repeat("O", 1<<20), ErrHeadTooLarge},
		{"informational heads", strings.Repeat("HTTP/1.1 103 Early Hints\r\n"+pad(100)+"\r\n", 40) + head(""), ErrHeadTooLarge},
		{"a trailer section", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n" + pad(2*limit) + "\r\n", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := rawup.Start(t, rawup.Text(func(int64) string { return tc.answer }))
			p := newPool(t, u, WithMaxHeaderBytes(limit))
			o := do(p, "GET", "/")
			if !errors.Is(o.err, tc.err) {
				t.Fatalf("exchange: %v, want %v", o.err, tc.err)
			}
			if tc.name == "a trailer section" && !o.aborted {
				t.Error("a trailer section over the limit was relayed as a complete response")
			}
			if tc.err == nil && tc.name == "at the limit" && o.body != "ok" {
				t.Errorf("body %q", o.body)
			}
		})
	}
}

// TestDistrust: once an upstream sent bytes nobody asked for, its connections are not
// kept, even after clean responses.
func TestDistrust(t *testing.T) {
	u := rawup.Start(t, rawup.Text(func(n int64) string {
		if n == 1 {
			return "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + forged
		}
		return real
	}))
	p := newPool(t, u)
	if o := do(p, "GET", "/"); o.body != "ok" {
		t.Fatalf("first %q %v", o.body, o.err)
	}
	for i := range 3 {
		if o := do(p, "GET", "/"); o.body != "real" {
			t.Fatalf("request %d: %q %v", i, o.body, o.err)
		}
		if n := p.Idle(); n != 0 {
			t.Fatalf("request %d: %d idle connections to a distrusted upstream", i, n)
		}
	}
}

// TestIdleWatch: a connection the upstream closes, or writes on, while it idles
// leaves the pool at once.
func TestIdleWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		after func(c *rawup.Conn)
	}{
		{"closed", func(c *rawup.Conn) { c.Close() }},
		{"a stray byte", func(c *rawup.Conn) { _, _ = io.WriteString(c, "H") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			act := make(chan *rawup.Conn, 1)
			u := rawup.Start(t, func(c *rawup.Conn, _ *http.Request, n int64) bool {
				_, _ = io.WriteString(c, real)
				if n == 1 {
					act <- c
				}
				return true
			})
			p := newPool(t, u)
			if o := do(p, "GET", "/"); o.body != "real" {
				t.Fatalf("%q %v", o.body, o.err)
			}
			waitIdle(t, p, 1)
			tc.after(<-act)
			waitIdle(t, p, 0)
		})
	}
}

// TestReuse: requests in turn to a well-behaved upstream share one connection (the
// look at a connection taken from the pool must not fail on the deadline that ended
// its watch), and each relays its own header fields alone (the connection's header
// map is reused, and replaced after a response of many fields).
func TestReuse(t *testing.T) {
	var many strings.Builder
	for i := range 2 * headermap.MaxReused {
		many.WriteString("X-Many-" + strconv.Itoa(i) + ": v\r\n")
	}
	answers := map[string]string{
		"/a":    "HTTP/1.1 200 OK\r\nX-A: a\r\nContent-Length: 1\r\n\r\na",
		"/b":    "HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nb",
		"/many": "HTTP/1.1 200 OK\r\n" + many.String() + "Content-Length: 1\r\n\r\nm",
	}
	var mu sync.Mutex
	conns := map[*rawup.Conn]bool{}
	u := rawup.Start(t, func(c *rawup.Conn, req *http.Request, _ int64) bool {
		mu.Lock()
		conns[c] = true
		mu.Unlock()
		_, err := io.WriteString(c, answers[req.URL.Path])
		return err == nil
	})
	p := newPool(t, u)
	paths := []string{"/a", "/b", "/many", "/b", "/a", "/b"}
	for _, path := range paths {
		o := do(p, "GET", path)
		want := map[string]int{"/a": 2, "/b": 1, "/many": 2*headermap.MaxReused + 1}[path]
		if o.err != nil || o.body != path[1:2] || len(o.header) != want {
			t.Errorf("%s: %q %v %v, want %d fields", path, o.body, o.header, o.err, want)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(conns) != 1 {
		t.Errorf("%d requests in turn used %d connections, want 1", len(paths), len(conns))
	}
}

// TestReuseAfter: with WithReuseAfter a connection carries no request until it has
// idled that long, so a stray written right after a response is caught by the watch
// instead of answering the next request; once it has idled long enough it is reused.
func TestReuseAfter(t *testing.T) {
	t.Run("a stray within the delay", func(t *testing.T) {
		first := make(chan *rawup.Conn, 1)
		u := rawup.Start(t, func(c *rawup.Conn, _ *http.Request, n int64) bool {
			_, err := io.WriteString(c, real)
			if n == 1 {
				first <- c
			}
			return err == nil
		})
		p := newPool(t, u, WithReuseAfter(time.Hour))
		if o := do(p, "GET", "/"); o.body != "real" {
			t.Fatalf("first: %q %v", o.body, o.err)
		}
		// The stray comes before the next request: without the delay the next request
		// could be written on this connection and read it.
		if _, err := io.WriteString(<-first, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			t.Fatal(err)
		}
		if o := do(p, "GET", "/"); o.body != "real" {
			t.Fatalf("second: %q %v, want its own answer", o.body, o.err)
		}
		waitIdle(t, p, 0) // the watch saw the stray: the upstream is distrusted
	})
	t.Run("reused once idle long enough", func(t *testing.T) {
		var mu sync.Mutex
		conns := map[*rawup.Conn]bool{}
		u := rawup.Start(t, func(c *rawup.Conn, _ *http.Request, _ int64) bool {
			mu.Lock()
			conns[c] = true
			mu.Unlock()
			_, err := io.WriteString(c, real)
			return err == nil
		})
		const after = 20 * time.Millisecond
		p := newPool(t, u, WithReuseAfter(after))
		for i := range 3 {
			if o := do(p, "GET", "/"); o.body != "real" {
				t.Fatalf("request %d: %q %v", i, o.body, o.err)
			}
			time.Sleep(2 * after) // longer is always fine
		}
		mu.Lock()
		defer mu.Unlock()
		if len(conns) != 1 {
			t.Errorf("3 requests, each after the delay, used %d connections, want 1", len(conns))
		}
	})
}

// TestTLSReuse: over TLS the pool sends, reads and relays as over plain TCP (the
// request flushed before its response is read, the socket under TLS peeked when a
// connection is taken), and keeps one connection for requests in turn.
func TestTLSReuse(t *testing.T) {
	var mu sync.Mutex
	remotes := map[string]bool{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		remotes[r.RemoteAddr] = true
		mu.Unlock()
		_, _ = io.WriteString(w, "secret "+r.URL.Path)
	}))
	srv.EnableHTTP2 = false
	srv.StartTLS()
	t.Cleanup(srv.Close)
	u, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	p := newPool(t, u, WithTLS(&tls.Config{RootCAs: roots, ServerName: "example.com"}))
	for i := range 5 {
		path := "/" + strconv.Itoa(i)
		if o := do(p, "GET", path); o.err != nil || o.status != http.StatusOK || o.body != "secret "+path {
			t.Fatalf("request %d: %d %q %v", i, o.status, o.body, o.err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(remotes) != 1 {
		t.Errorf("5 requests in turn used %d connections, want 1", len(remotes))
	}
}
