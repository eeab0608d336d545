package ingress

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice/ingress/internal/warn"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// proxyFixture is an upstream and a proxy in front of it, each a server of its own.
type proxyFixture struct {
	up     *httptest.Server
	front  *httptest.Server
	proxy  *Proxy
	client *http.Client
	reg    *prometheus.Registry
}

// newProxyFixture starts upstream and a proxy to it (wrapped by wrap when not nil).
func newProxyFixture(t *testing.T, upstream http.Handler, wrap func(http.Handler) http.Handler, opts ...ProxyOption) *proxyFixture {
	t.Helper()
	f := &proxyFixture{up: httptest.NewServer(upstream), reg: prometheus.NewRegistry()}
	u, err := url.Parse(f.up.URL)
	if err != nil {
		t.Fatal(err)
	}
	f.proxy, err = NewProxy(u, append([]ProxyOption{WithProxyRegisterer(f.reg)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	var h http.Handler = f.proxy
	if wrap != nil {
		h = wrap(h)
	}
	f.front = httptest.NewServer(h)
	f.client = &http.Client{Transport: &http.Transport{ExpectContinueTimeout: time.Minute}}
	t.Cleanup(func() {
		f.client.CloseIdleConnections()
		f.front.Close()
		f.proxy.CloseIdleConnections()
		f.up.Close()
	})
	return f
}

// wantProblem checks that resp is a problem of status.
func wantProblem(t *testing.T, resp *http.Response, status int) {
	t.Helper()
	defer resp.Body.Close()
	if resp.StatusCode != status {
		t.Fatalf("status = %d, want %d", resp.StatusCode, status)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type = %q, want application/problem+json", ct)
	}
	var p problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil || p.Status != status || p.Detail == "" {
		t.Errorf("problem body = %+v (%v), want status %d with a detail", p, err, status)
	}
}

// The upstream sees the client's method, path, query, Host and body, the forwarding
// headers from the real connection and no hop-by-hop header; the client sees the
// upstream's status, headers and body, without the upstream's hop-by-hop headers.
func TestProxyForwardsAndStripsHopByHop(t *testing.T) {
	var seen *http.Request
	var seenBody []byte
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, seenBody = r.Clone(context.Background()), must(io.ReadAll(r.Body))
		w.Header().Set("Connection", "X-Resp-Hop")
		w.Header().Set("X-Resp-Hop", "1")
		w.Header().Set("Keep-Alive", "timeout=5")
		w.Header().Set("X-Kept", "yes")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, "made")
	}), nil)
	req, _ := http.NewRequest("POST", f.front.URL+"/v1/orders?id=7&x=%2F", strings.NewReader("order"))
	req.Host = "shop.example"
	for k, v := range map[string]string{
		"Connection": "X-Hop", "X-Hop": "1", "Keep-Alive": "timeout=5", "Proxy-Authorization": "Basic eDp5",
		"Proxy-Connection": "keep-alive", "Te": "trailers, deflate", "Upgrade": "h2c", "X-End": "kept",
		"X-Forwarded-For": "6.6.6.6", "X-Forwarded-Host": "evil.example", "Forwarded": "for=6.6.6.6",
	} {
		req.Header.Set(k, v)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated || string(body) != "made" || resp.Header.Get("X-Kept") != "yes" {
		t.Errorf("response = %d %q X-Kept=%q, want 201 made yes", resp.StatusCode, body, resp.Header.Get("X-Kept"))
	}
	for _, h := range []string{"X-Resp-Hop", "Keep-Alive"} {
		if v := resp.Header.Get(h); v != "" {
			t.Errorf("the client got the upstream's hop-by-hop %s: %q", h, v)
		}
	}
	if seen == nil {
		t.Fatal("the upstream saw no request")
	}
	if seen.Method != "POST" || seen.URL.RequestURI() != "/v1/orders?id=7&x=%2F" || seen.Host != "shop.example" || string(seenBody) != "order" {
		t.Errorf("upstream saw %s %s Host %s body %q", seen.Method, seen.URL.RequestURI(), seen.Host, seenBody)
	}
	for _, h := range []string{"X-Hop", "Keep-Alive", "Proxy-Authorization", "Proxy-Connection", "Upgrade", "Forwarded"} {
		if v := seen.Header.Get(h); v != "" {
			t.Errorf("the upstream got hop-by-hop or forged %s: %q", h, v)
		}
	}
	if got := seen.Header.Get("Te"); got != "trailers" {
		t.Errorf("Te = %q, want trailers (the only TE a proxy passes)", got)
	}
	if got := seen.Header.Get("X-End"); got != "kept" {
		t.Errorf("end-to-end header X-End = %q, want kept", got)
	}
	if got := seen.Header.Values("X-Forwarded-For"); len(got) != 1 || got[0] != "127.0.0.1" {
		t.Errorf("X-Forwarded-For = %q, want the peer's address alone", got)
	}
	if got := seen.Header.Get("X-Forwarded-Host"); got != "shop.example" {
		t.Errorf("X-Forwarded-Host = %q, want shop.example", got)
	}
	if got := seen.Header.Get("X-Forwarded-Proto"); got != "http" {
		t.Errorf("X-Forwarded-Proto = %q, want http", got)
	}
	if got := counterOf(t, f.proxy.byClass[classIndex(201)].requests); got != 1 {
		t.Errorf("sluice_upstream_requests_total{class=2xx} = %v, want 1", got)
	}
}

func counterOf(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// An upstream URL with a path and a query prefixes the request's, as
// httputil.ProxyRequest.SetURL joins them.
func TestProxyJoinsUpstreamPath(t *testing.T) {
	got := make(chan string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got <- r.URL.RequestURI() }))
	defer up.Close()
	u, _ := url.Parse(up.URL + "/base/?k=1")
	p, err := NewProxy(u)
	if err != nil {
		t.Fatal(err)
	}
	defer p.CloseIdleConnections()
	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("GET", "/a%2Fb/c?q=2", nil))
	if w.Code != http.StatusOK {
		t.Fatalf("status %d", w.Code)
	}
	if uri := <-got; uri != "/base/a%2Fb/c?k=1&q=2" {
		t.Errorf("upstream saw %q, want /base/a%%2Fb/c?k=1&q=2", uri)
	}
}

// FuzzWriteRequestURI: the target the proxy writes for a request is requestURI's,
// which is the request's own RequestURI when the upstream URL has neither path nor
// query, and the upstream's path and query joined with it otherwise.
func FuzzWriteRequestURI(f *testing.F) {
	for _, seed := range []string{"/", "/a/b?x=1", "/a?", "/a%2Fb/c?q=2", "/%7e?%zz", "/a b", "//x", "/?", "/a;b=c@d:e"} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, target string, joined bool) {
		in, err := url.ParseRequestURI(target)
		if err != nil {
			return
		}
		upstream := "http://up.example"
		if joined {
			upstream += "/base/?k=1"
		}
		p := &Proxy{upstream: must(url.Parse(upstream)), plainPath: !joined}
		var b bytes.Buffer
		bw := bufio.NewWriter(&b)
		p.writeRequestURI(bw, in)
		if err := bw.Flush(); err != nil {
			t.Fatal(err)
		}
		want := p.requestURI(in)
		if !joined && want != in.RequestURI() {
			t.Fatalf("%q: requestURI %q, RequestURI %q", target, want, in.RequestURI())
		}
		if b.String() != want {
			t.Errorf("%q: wrote %q, want %q", target, b.String(), want)
		}
	})
}

// A large response reaches the client while the upstream is still writing it: the
// upstream writes its second half only once the client has read the first bytes.
func TestProxyStreamsLargeResponse(t *testing.T) {
	const size = 64 << 20
	firstRead := make(chan struct{})
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "67108864")
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		_, _ = w.Write(chunk)
		http.NewResponseController(w).Flush()
		select {
		case <-firstRead:
		case <-r.Context().Done():
			return
		}
		for range size/len(chunk) - 1 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}), nil)
	resp, err := f.client.Get(f.front.URL + "/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadFull(resp.Body, make([]byte, 1)); err != nil {
		t.Fatal(err)
	}
	close(firstRead)
	n, err := io.Copy(io.Discard, resp.Body)
	if err != nil || n+1 != size {
		t.Errorf("read %d bytes (%v), want %d", n+1, err, size)
	}
}

// A response without a length streams too: each piece is flushed as it arrives.
func TestProxyFlushesChunkedResponse(t *testing.T) {
	next := make(chan struct{})
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		for i := range 3 {
			_, _ = io.WriteString(w, "event "+string(rune('0'+i))+"\n")
			_ = rc.Flush()
			select {
			case <-next:
			case <-r.Context().Done():
				return
			}
		}
	}), nil)
	resp, err := f.client.Get(f.front.URL + "/events")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		if err != nil || line != "event "+string(rune('0'+i))+"\n" {
			t.Fatalf("line %d = %q (%v)", i, line, err)
		}
		next <- struct{}{}
	}
}

// Trailers pass both ways: the client's after a chunked request body, the
// upstream's after a chunked response body.
func TestProxyTrailers(t *testing.T) {
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		w.Header().Set("Trailer", "X-Checksum")
		_, _ = w.Write(body)
		w.Header().Set("X-Checksum", "up:"+r.Trailer.Get("X-Client-Sum"))
	}), nil)
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("PUT", f.front.URL+"/blob", pr)
	req.Trailer = http.Header{"X-Client-Sum": nil}
	go func() {
		_, _ = io.WriteString(pw, "payload")
		req.Trailer.Set("X-Client-Sum", "c42")
		pw.Close()
	}()
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "payload" {
		t.Errorf("body = %q, want payload", body)
	}
	if got := resp.Trailer.Get("X-Checksum"); got != "up:c42" {
		t.Errorf("trailer X-Checksum = %q, want up:c42 (the client's trailer reached the upstream, the upstream's the client)", got)
	}
}

// Expect: 100-continue goes to the upstream, which decides: when it refuses, the
// client never sends the body; when it accepts, the body goes through. Also behind the
// middleware, which caps the body: net/http reads an unread body before it answers
// when the request's Body is not its own (a handler that swapped it in place), and
// since the 100 Continue is no longer sent once the answer is written, the answer
// waited for a body the client never sent.
func TestProxyExpectContinue(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	for _, wrap := range []struct {
		name string
		wrap func(http.Handler) http.Handler
	}{{"proxy", nil}, {"middleware", mustNew(t, StaticRules{set}, limiter.NewMemory(), WithMaxBody(1000)).Wrap}} {
		f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Expect") != "100-continue" {
				http.Error(w, "no expectation", http.StatusBadRequest)
				return
			}
			if r.URL.Path == "/refuse" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			_, _ = io.Copy(w, r.Body)
		}), wrap.wrap)
		for _, tt := range []struct {
			path     string
			status   int
			bodySent bool
		}{{"/refuse", http.StatusUnauthorized, false}, {"/accept", http.StatusOK, true}} {
			var read atomic.Bool
			data := strings.NewReader("data")
			body := readFunc(func(p []byte) (int, error) {
				read.Store(true)
				return data.Read(p)
			})
			req, _ := http.NewRequest("POST", f.front.URL+tt.path, io.NopCloser(body))
			req.ContentLength = 4
			req.Header.Set("Expect", "100-continue")
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatalf("%s %s: %v", wrap.name, tt.path, err)
			}
			got, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tt.status || read.Load() != tt.bodySent {
				t.Errorf("%s %s: status %d, body sent %v; want %d, %v", wrap.name, tt.path, resp.StatusCode, read.Load(), tt.status, tt.bodySent)
			}
			if tt.bodySent && string(got) != "data" {
				t.Errorf("%s %s: echoed %q, want data", wrap.name, tt.path, got)
			}
		}
	}
}

type readFunc func([]byte) (int, error)

func (f readFunc) Read(p []byte) (int, error) { return f(p) }

// A request to switch protocols (WebSocket) is proxied: the client and the upstream
// then talk over the connection both ways.
func TestProxyUpgrade(t *testing.T) {
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "not an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString("echo: " + line)
		_ = brw.Flush()
	}), nil)
	conn, err := net.Dial("tcp", f.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Minute))
	if _, err := io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: shop.example\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status = %d, want 101", resp.StatusCode)
	}
	if _, err := io.WriteString(conn, "hello\n"); err != nil {
		t.Fatal(err)
	}
	if line, err := br.ReadString('\n'); err != nil || line != "echo: hello\n" {
		t.Errorf("after the upgrade got %q (%v), want echo: hello", line, err)
	}
}

// An upstream that does not listen is 502 with a problem body, counted as an error,
// and logged once, not once a request.
func TestProxyUpstreamDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	reg := prometheus.NewRegistry()
	var logs bytes.Buffer
	p, err := NewProxy(&url.URL{Scheme: "http", Host: addr}, WithProxyRegisterer(reg),
		WithProxyLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	if err != nil {
		t.Fatal(err)
	}
	p.failures = warn.Every(time.Hour)
	front := httptest.NewServer(p)
	defer front.Close()
	for range 5 {
		resp, err := front.Client().Get(front.URL + "/x")
		if err != nil {
			t.Fatal(err)
		}
		wantProblem(t, resp, http.StatusBadGateway)
	}
	if got := counterOf(t, p.byClass[errorClass].requests); got != 5 {
		t.Errorf("sluice_upstream_requests_total{class=error} = %v, want 5", got)
	}
	if n := strings.Count(logs.String(), `msg="upstream request failed"`); n != 1 {
		t.Errorf("5 failed requests logged %d warnings, want 1:\n%s", n, logs.String())
	}
}

// An upstream that does not begin its response within the timeout is 504.
func TestProxyUpstreamSlow(t *testing.T) {
	release := make(chan struct{})
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}), nil, WithProxyTimeout(50*time.Millisecond))
	defer close(release)
	resp, err := f.client.Get(f.front.URL + "/slow")
	if err != nil {
		t.Fatal(err)
	}
	wantProblem(t, resp, http.StatusGatewayTimeout)
}

// A body over the middleware's limit is 413, whether its length is announced or
// found out while it streams to the upstream.
func TestProxyMaxBody(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	mw := mustNew(t, StaticRules{set}, limiter.NewMemory(), WithMaxBody(1000))
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	}), mw.Wrap)
	big := strings.Repeat("x", 5000)
	for _, chunked := range []bool{false, true} {
		var body io.Reader = strings.NewReader(big)
		if chunked {
			body = io.MultiReader(body) // hides the length: sent chunked
		}
		resp, err := f.client.Post(f.front.URL+"/upload", "text/plain", body)
		if err != nil {
			t.Fatalf("chunked=%v: %v", chunked, err)
		}
		wantProblem(t, resp, http.StatusRequestEntityTooLarge)
	}
	resp, err := f.client.Post(f.front.URL+"/upload", "text/plain", io.MultiReader(strings.NewReader("small")))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Errorf("a body under the limit: status %d, want 200", resp.StatusCode)
	}
}

// A client that goes away cancels the request to the upstream.
func TestProxyClientCancelPropagates(t *testing.T) {
	arrived, cancelled := make(chan struct{}), make(chan struct{})
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		<-r.Context().Done()
		close(cancelled)
	}), nil)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "GET", f.front.URL+"/long", nil)
		resp, err := f.client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-arrived
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("client error = %v, want context.Canceled", err)
	}
	select {
	case <-cancelled:
	case <-time.After(time.Minute):
		t.Fatal("the upstream's request was not cancelled")
	}
}

// An upstream that closes kept-alive connections between requests costs nothing:
// the proxy finds the closed connection before using it (or retries a request that
// may be repeated), for GET and POST alike.
func TestProxyUpstreamClosesIdleConnections(t *testing.T) {
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(w, r.Body)
	}), nil)
	for i, method := range []string{"GET", "POST", "GET", "POST"} {
		req, _ := http.NewRequest(method, f.front.URL+"/", strings.NewReader("b"))
		if method == "GET" {
			req.Body, req.ContentLength = http.NoBody, 0
		}
		resp, err := f.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("request %d (%s) after the upstream closed its idle connections: status %d", i, method, resp.StatusCode)
		}
		f.up.CloseClientConnections()
		// The close reaches the proxy's side of the connection asynchronously; the
		// idle watch closes the connection once it does (a POST cannot be retried).
		for deadline := time.Now().Add(time.Minute); f.proxy.pool.Idle() > 0; time.Sleep(time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatal("the idle connection the upstream closed is still in the pool")
			}
		}
	}
}

// A response that breaks off part-way aborts the client's connection: the client
// never takes the truncated body for the whole.
func TestProxyTruncatedResponseAborts(t *testing.T) {
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		_, _ = io.WriteString(w, "only part")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	}), nil)
	resp, err := f.client.Get(f.front.URL + "/")
	if err != nil {
		return // the abort came before the headers: also not a complete response
	}
	defer resp.Body.Close()
	if _, err := io.ReadAll(resp.Body); err == nil {
		t.Error("the client read a truncated body without an error")
	}
}

func TestNewProxyRejectsBadUpstreamAndTimeout(t *testing.T) {
	for _, tt := range []struct {
		up   string
		opts []ProxyOption
	}{
		{"ftp://example.com", nil},
		{"http://example.com", []ProxyOption{WithProxyTimeout(0)}},
	} {
		u, _ := url.Parse(tt.up)
		if _, err := NewProxy(u, tt.opts...); err == nil {
			t.Errorf("NewProxy(%s) succeeded", tt.up)
		}
	}
}

// A request built in code (not read by an http.Server) with a header that cannot go
// on the wire is 502, never a request smuggled into the connection; an empty POST
// carries Content-Length: 0.
func TestProxyHeaderChecksAndEmptyPost(t *testing.T) {
	lengths := make(chan []string, 1)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lengths <- r.Header.Values("Content-Length")
	}))
	defer up.Close()
	p, err := NewProxy(must(url.Parse(up.URL)))
	if err != nil {
		t.Fatal(err)
	}
	defer p.CloseIdleConnections()
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Evil", "a\r\nGET /smuggled HTTP/1.1")
	w := httptest.NewRecorder()
	p.ServeHTTP(w, r)
	if w.Code != http.StatusBadGateway {
		t.Errorf("a header with a line break: status %d, want 502", w.Code)
	}
	w = httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("POST", "/", nil))
	if got := <-lengths; w.Code != http.StatusOK || len(got) != 1 || got[0] != "0" {
		t.Errorf("empty POST: status %d, upstream saw Content-Length %q, want 200 and 0", w.Code, got)
	}
}

// TestProxyForwardedChain: the chain a trusted proxy sent is kept in the header the
// client identity reads, and only that one, on proxied requests and parked ones
// alike: the upstream gets as X-Forwarded-For the chain sluice believed, never a
// client's own copy of the other header.
func TestProxyForwardedChain(t *testing.T) {
	sent := map[string]string{"X-Forwarded-For": "1.2.3.4",
		"Forwarded": `for=5.6.7.8;proto=https, for="[2001:db8::1]:4711", for=_hidden`}
	for _, tc := range []struct {
		header  ForwardedHeader
		trusted []string
		want    string
	}{
		{XForwardedFor, []string{"127.0.0.1"}, "1.2.3.4, 127.0.0.1"},
		{Forwarded, []string{"127.0.0.1"}, "5.6.7.8, 2001:db8::1, unknown, 127.0.0.1"},
		{XForwardedFor, nil, "127.0.0.1"},
		{Forwarded, nil, "127.0.0.1"},
	} {
		t.Run(tc.header.String()+" trusted "+strings.Join(tc.trusted, ","), func(t *testing.T) {
			ids, err := NewClientIdentity(tc.trusted, 0, WithForwardedHeader(tc.header))
			if err != nil {
				t.Fatal(err)
			}
			got := make(chan http.Header, 1)
			f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				got <- r.Header.Clone()
			}), nil, WithProxyClientIdentity(ids))
			req, _ := http.NewRequest("GET", f.front.URL+"/v1/x", nil)
			for k, v := range sent {
				req.Header.Set(k, v)
			}
			resp, err := f.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			h := <-got
			if xff := h.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != tc.want {
				t.Errorf("proxied: X-Forwarded-For = %q, want %q", xff, tc.want)
			}
			if v := h.Get("Forwarded"); v != "" {
				t.Errorf("proxied: the upstream got Forwarded %q", v)
			}

			r := httptest.NewRequest("POST", "http://shop.example/v1/orders", nil)
			r.RemoteAddr = "127.0.0.1:4000"
			for k, v := range sent {
				r.Header.Set(k, v)
			}
			parked := parkHeader(ids, r)
			if xff := parked.Values("X-Forwarded-For"); len(xff) != 1 || xff[0] != tc.want {
				t.Errorf("parked: X-Forwarded-For = %q, want %q", xff, tc.want)
			}
			if v := parked.Get("Forwarded"); v != "" {
				t.Errorf("parked: Forwarded %q kept", v)
			}
		})
	}
}

// TestProxyDropsH2CUpgrade: an upgrade to h2c is never offered to the upstream. A lax
// upstream that took it would carry HTTP/2 streams on that connection, requests no
// rule ever decided. The request is proxied as an ordinary one (as a server that does
// not speak h2c answers it, RFC 9113 section 3.1 having deprecated the upgrade): no
// Upgrade, no HTTP2-Settings, no Connection tokens for them. Other protocols a
// request offers along with h2c stay offered.
func TestProxyDropsH2CUpgrade(t *testing.T) {
	type seen struct{ upgrade, connection, settings string }
	got := make(chan seen, 1)
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- seen{strings.Join(r.Header.Values("Upgrade"), ","), strings.Join(r.Header.Values("Connection"), ","),
			strings.Join(r.Header.Values("Http2-Settings"), ",")}
		_, _ = io.WriteString(w, "plain")
	}), nil)
	for _, tc := range []struct {
		name, head string
		want       seen
	}{
		{"h2c as curl --http2 sends it", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n", seen{}},
		{"h2c in capitals, settings not named in Connection", "Connection: upgrade\r\nUpgrade: H2C\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n", seen{}},
		{"h2c with a POST body", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\nContent-Length: 5\r\n", seen{}},
		{"h2c among other protocols", "Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c, echo\r\nHTTP2-Settings: AAMAAABkAAQAAP__\r\n",
			seen{upgrade: "echo", connection: "Upgrade"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", f.front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(time.Minute))
			method, body := "GET", ""
			if strings.Contains(tc.head, "Content-Length") {
				method, body = "POST", "hello"
			}
			if _, err := io.WriteString(conn, method+" /v1/x HTTP/1.1\r\nHost: shop.example\r\n"+tc.head+"\r\n"+body); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || string(b) != "plain" {
				t.Fatalf("response %d %q, want the upstream's 200 plain", resp.StatusCode, b)
			}
			if s := <-got; s != tc.want {
				t.Errorf("the upstream saw Upgrade %q, Connection %q, HTTP2-Settings %q; want %+v", s.upgrade, s.connection, s.settings, tc.want)
			}
		})
	}
}

// TestProxyDropsClientTicket: Sluice-Ticket is what the dispatcher sets on deliveries
// of parked orders, so that an upstream may recognise one; a client's own never
// reaches the upstream, neither on an ordinary request nor on an upgrade, as forged
// X-Forwarded-* do not.
func TestProxyDropsClientTicket(t *testing.T) {
	got := make(chan []string, 1)
	f := newProxyFixture(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Values("Sluice-Ticket")
	}), nil)
	for _, tc := range []struct{ name, head string }{
		{"ordinary", ""},
		{"upgrade", "Connection: Upgrade\r\nUpgrade: echo\r\n"},
		{"keep-alive", "Connection: keep-alive\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", f.front.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(time.Minute))
			if _, err := io.WriteString(conn, "GET /v1/x HTTP/1.1\r\nHost: shop.example\r\n"+tc.head+
				"Sluice-Ticket: forged\r\nsluice-ticket: again\r\n\r\n"); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if v := <-got; len(v) != 0 {
				t.Errorf("the upstream got Sluice-Ticket %q", v)
			}
		})
	}
}
