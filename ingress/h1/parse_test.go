package h1

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// oracle is net/http's server, the reference every head the fast path takes is
// checked against: what its handler sees of the first request on a connection that
// sends raw and closes.
type oracle struct {
	srv   *http.Server
	ln    *handoffListener
	mu    sync.Mutex
	seen  map[net.Conn]*seenRequest
	ended map[net.Conn]chan struct{}
}

// seenRequest is what net/http's handler saw of a request.
type seenRequest struct {
	req  *http.Request
	body []byte
	err  error // of reading the body
}

func newOracle(t testing.TB) *oracle {
	o := &oracle{ln: newHandoffListener(&net.TCPAddr{}), seen: map[net.Conn]*seenRequest{}, ended: map[net.Conn]chan struct{}{}}
	o.srv = &http.Server{
		ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
		ConnState: func(c net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				o.mu.Lock()
				ch := o.ended[c]
				o.mu.Unlock()
				close(ch)
			}
		},
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			c := r.Context().Value(connKey{}).(net.Conn)
			body, err := io.ReadAll(r.Body)
			o.mu.Lock()
			if o.seen[c] == nil {
				o.seen[c] = &seenRequest{req: r, body: body, err: err}
			}
			o.mu.Unlock()
		}),
	}
	go o.srv.Serve(o.ln)
	t.Cleanup(func() { o.srv.Close() })
	return o
}

// serve sends raw to net/http on a connection of its own, closes it, and returns
// what the handler saw of the first request, nil when it saw none (net/http refused
// the head).
func (o *oracle) serve(raw []byte) *seenRequest {
	client, server := net.Pipe()
	ended := make(chan struct{})
	o.mu.Lock()
	o.ended[server] = ended
	o.mu.Unlock()
	go io.Copy(io.Discard, client)
	go func() {
		client.Write(raw)
		client.Close()
	}()
	o.ln.give(server)
	<-ended
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.ended, server)
	s := o.seen[server]
	delete(o.seen, server)
	return s
}

// checkAgainstNetHTTP fails t when the fast path takes raw's first head and net/http
// does not, or reads it otherwise.
func checkAgainstNetHTTP(t *testing.T, o *oracle, raw []byte) (taken bool) {
	t.Helper()
	if len(raw) > readBuffer {
		raw = raw[:readBuffer]
	}
	end, bad := headEnd(raw)
	if bad || end == 0 {
		return false
	}
	h, ok := parseHead(raw[:end])
	if !ok {
		return false
	}
	u := h.url
	seen := o.serve(raw)
	if seen == nil {
		t.Fatalf("%q: the fast path takes the head, net/http refuses it", raw)
	}
	r := seen.req
	switch {
	case r.Method != h.method:
		t.Fatalf("%q: method %q, net/http %q", raw, h.method, r.Method)
	case r.RequestURI != h.target:
		t.Fatalf("%q: target %q, net/http %q", raw, h.target, r.RequestURI)
	case !reflect.DeepEqual(*r.URL, *u):
		t.Fatalf("%q: URL %#v, net/http %#v", raw, *u, *r.URL)
	case r.Host != h.host:
		t.Fatalf("%q: host %q, net/http %q", raw, h.host, r.Host)
	case !reflect.DeepEqual(r.Header, h.header):
		t.Fatalf("%q: header %q, net/http %q", raw, h.header, r.Header)
	case r.ContentLength != h.contentLength:
		t.Fatalf("%q: Content-Length %d, net/http %d", raw, h.contentLength, r.ContentLength)
	case r.Close != h.close:
		t.Fatalf("%q: close %v, net/http %v", raw, h.close, r.Close)
	case len(r.TransferEncoding) > 0:
		t.Fatalf("%q: net/http reads a transfer coding %q", raw, r.TransferEncoding)
	}
	if rest := raw[end:]; int64(len(rest)) >= h.contentLength {
		if want := rest[:h.contentLength]; !bytes.Equal(seen.body, want) || seen.err != nil {
			t.Fatalf("%q: body %q, net/http %q (%v)", raw, want, seen.body, seen.err)
		}
	}
	return true
}

// smuggling are heads the fast path must leave to net/http: each is either refused
// there or read with a meaning of its own (a transfer coding, a continuation).
var smuggling = []string{
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 03\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3 3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 99999999999999999999\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding\t: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 3\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n\tContent-Length: 3\r\n\r\nabc",
	"GET / HTTP/1.1\nHost: a\n\n",
	"GET / HTTP/1.1\r\nHost: a\nContent-Length: 3\r\n\r\nabc",
	"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX\x00: b\r\n\r\n",
	"GET /\x00 HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: \x7f\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	"GET / HTTP/1.1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
	"GET / http/1.1\r\nHost: a\r\n\r\n",
	"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
	"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
	"PATCH /%zz HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
	"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
	"HEAD / HTTP/1.1\r\nHost: a\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
	"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\nabc",
	"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nTrailer: X\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X-Long: "+strings.Repeat("x", 100)+"\r\n", 40) + "\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("x", maxName+1) + ": b\r\n\r\n",
}

// taken are heads the fast path serves itself.
var taken = []string{
	"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /a/b?c=d&e=%20f HTTP/1.1\r\nHost: example.com:8080\r\nUser-Agent: x\r\nAccept: */*\r\n\r\n",
	"POST /orders HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Type: text/plain\r\n\r\nabc",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n",
	"GET / HTTP/1.1\r\nHost:\r\n\r\n",
	"GET / HTTP/1.1\r\nhOST:   a  \r\nx-a: 1\r\nX-A: 2\r\nx-a:\t3\t\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: [::1]:80\r\nConnection: keep-alive, Close\r\n\r\n",
	"DELETE //x/../y HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: b\r\n\r\n",
}

func TestParseHeadAgainstNetHTTP(t *testing.T) {
	o := newOracle(t)
	for _, raw := range smuggling {
		end, bad := headEnd([]byte(raw))
		if bad || end == 0 {
			continue
		}
		if _, ok := parseHead([]byte(raw[:end])); ok {
			t.Errorf("%q: the fast path takes it; net/http's server must decide", raw)
		}
	}
	for _, raw := range taken {
		if !checkAgainstNetHTTP(t, o, []byte(raw)) {
			t.Errorf("%q: the fast path leaves it to net/http", raw)
		}
	}
}

// FuzzParseHead checks that every head the fast path takes is taken by net/http's
// server with the same method, target, URL, Host, header, Content-Length,
// connection close and body.
func FuzzParseHead(f *testing.F) {
	for _, raw := range append(append([]string{}, taken...), smuggling...) {
		f.Add([]byte(raw))
	}
	o := newOracle(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkAgainstNetHTTP(t, o, raw)
	})
}

func TestHeadEnd(t *testing.T) {
	for _, tc := range []struct {
		in  string
		end int
		bad bool
	}{
		{"GET / HTTP/1.1\r\n", 0, false},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r\nrest", 27, false},
		{"GET / HTTP/1.1\r\n\r\n", 18, false},
		{"GET / HTTP/1.1\nHost: a\r\n\r\n", 0, true},
		{"\n", 0, true},
		{"GET / HTTP/1.1\r\nHost: a\r\n\n", 0, true},
		{"GET / HTTP/1.1\r\nHost: a\r\n\r", 0, false},
	} {
		end, bad := headEnd([]byte(tc.in))
		if end != tc.end || bad != tc.bad {
			t.Errorf("headEnd(%q) = %d, %v; want %d, %v", tc.in, end, bad, tc.end, tc.bad)
		}
	}
}

type connKey struct{}

// FuzzSetPlainTarget: a target that setPlainTarget takes is the URL that
// url.ParseRequestURI makes of it.
func FuzzSetPlainTarget(f *testing.F) {
	for _, seed := range []string{"/", "/a/b?x=1", "/a?", "/?", "/a?b?", "/a??", "/a%2Fb", "/a b", "//x", "/a;b=c@d:e,f$g&h+i~j",
		"/a!b", "/a'b", "/a*b", "/a(b)", "/x?#y"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, target string) {
		var h head
		if !parseRequestLine("GET "+target+" HTTP/1.1", &h) || h.target != target {
			return // not a target the fast path takes
		}
		var got url.URL
		if !setPlainTarget(&got, target) {
			return
		}
		want, err := url.ParseRequestURI(target)
		if err != nil {
			t.Fatalf("%q: taken as plain, url.ParseRequestURI fails: %v", target, err)
		}
		if got != *want {
			t.Errorf("%q: %#v, url.ParseRequestURI %#v", target, got, *want)
		}
	})
}
