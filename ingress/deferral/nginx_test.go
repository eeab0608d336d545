package deferral

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// nginxExample is the shipped auth_request configuration the test runs.
const nginxExample = "../../deploy/nginx/auth_request.conf"

// nginxPath finds nginx, also in /usr/sbin, which is not on a Debian user's PATH. On
// Linux under CI a missing nginx fails the test (.ci/test installs Debian's nginx);
// elsewhere it skips.
func nginxPath(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("nginx"); err == nil {
		return p
	}
	if p, err := exec.LookPath("/usr/sbin/nginx"); err == nil {
		return p
	}
	if runtime.GOOS == "linux" && os.Getenv("CI") != "" {
		t.Fatal("nginx is not installed (apt-get install nginx; .ci/test installs it)")
	}
	t.Skip("nginx is not installed: deploy/nginx/auth_request.conf is not tested")
	return ""
}

// freeAddr returns a loopback address nothing listens on at the moment.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// templated returns the example with sluice's, the API's and nginx's own addresses
// replaced; each must be written once in it.
func templated(t *testing.T, conf []byte, check, api, listen string) string {
	t.Helper()
	s := string(conf)
	for _, r := range [][2]string{
		{"server 127.0.0.1:8081;", "server " + check + ";"},
		{"server 127.0.0.1:9000;", "server " + api + ";"},
		{"listen 8080;", "listen " + listen + ";"},
	} {
		if n := strings.Count(s, r[0]); n != 1 {
			t.Fatalf("%s: %q written %d times, want once", nginxExample, r[0], n)
		}
		s = strings.Replace(s, r[0], r[1], 1)
	}
	return s
}

// nginxMain wraps the example in a main configuration that keeps nginx in the
// foreground and every file it writes under the prefix %[1]s, so that it runs
// without root.
const nginxMain = `daemon off;
worker_processes 1;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log info;
events { worker_connections 64; }
http {
    access_log off;
    client_body_temp_path %[1]s/tmp/body;
    proxy_temp_path %[1]s/tmp/proxy;
    fastcgi_temp_path %[1]s/tmp/fastcgi;
    uwsgi_temp_path %[1]s/tmp/uwsgi;
    scgi_temp_path %[1]s/tmp/scgi;
    include %[1]s/auth_request.conf;
}
`

// startNginx runs nginx (bin) with the example, changed by edit unless nil, in front
// of the check server and the API and returns its address once it accepts
// connections. It stops when the test ends.
func startNginx(t *testing.T, bin, check, api string, edit func(t *testing.T, conf []byte) []byte) string {
	t.Helper()
	example, err := os.ReadFile(nginxExample)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		example = edit(t, example)
	}
	prefix := t.TempDir()
	listen := freeAddr(t)
	if err := os.Mkdir(filepath.Join(prefix, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(prefix, "auth_request.conf"), []byte(templated(t, example, check, api, listen)), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(conf, []byte(strings.ReplaceAll(nginxMain, "%[1]s", prefix)), 0o644); err != nil {
		t.Fatal(err)
	}
	errLog := filepath.Join(prefix, "error.log")
	cmd := exec.Command(bin, "-p", prefix, "-c", conf, "-e", errLog)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// SIGTERM: the master ends its workers before it exits.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			b, _ := os.ReadFile(errLog)
			t.Logf("nginx's error log:\n%s", b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.Dial("tcp", listen)
		if err == nil {
			c.Close()
			return listen
		}
		select {
		case err := <-exited:
			b, _ := os.ReadFile(errLog)
			t.Fatalf("nginx exited: %v\n%s\n%s", err, out.String(), b)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx never listened on %s: %v", listen, err)
		}
	}
}

// upstreamLog is the API behind nginx: it answers 200 and writes down what reached it.
type upstreamLog struct {
	mu   sync.Mutex
	seen []string // method, request URI and body of each request
}

func (u *upstreamLog) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	u.mu.Lock()
	u.seen = append(u.seen, r.Method+" "+r.RequestURI+" "+string(b))
	u.mu.Unlock()
	io.WriteString(w, "upstream")
}

func (u *upstreamLog) take() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	s := u.seen
	u.seen = nil
	return s
}

// nginxFront is nginx with (a variant of) the example in front of the check server
// (its store parks) and an API that writes down what reaches it.
type nginxFront struct {
	t      *testing.T
	url    string
	client *http.Client
	check  *httptest.Server
	store  *queue.Store
	api    *upstreamLog
}

func newNginxFront(t *testing.T, edit func(t *testing.T, conf []byte) []byte) *nginxFront {
	bin := nginxPath(t)
	check, store := checkServer(t, true)
	api := &upstreamLog{}
	upstream := httptest.NewServer(api)
	t.Cleanup(upstream.Close)
	f := &nginxFront{t: t, check: check, store: store, api: api, client: &http.Client{Timeout: 30 * time.Second}}
	f.url = "http://" + startNginx(t, bin, check.Listener.Addr().String(), upstream.Listener.Addr().String(), edit)
	t.Cleanup(f.client.CloseIdleConnections)
	return f
}

// do sends a request to nginx and returns the response and its body.
func (f *nginxFront) do(method, path string, body io.Reader, headers ...string) (*http.Response, string) {
	f.t.Helper()
	req, err := http.NewRequest(method, f.url+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	return resp, string(b)
}

// problem checks that resp is a problem of status and returns it.
func (f *nginxFront) problem(what string, resp *http.Response, body string, status int) map[string]any {
	f.t.Helper()
	var p map[string]any
	if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" {
		f.t.Fatalf("%s: %d %v %q, want a %d problem", what, resp.StatusCode, resp.Header, body, status)
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || p["status"] != float64(status) {
		f.t.Fatalf("%s: body %q: %v", what, body, err)
	}
	return p
}

// sluiceRefusal checks that a refusal is sluice's own, as its check wrote it: the
// problem's detail (or, for a 429, its quota members), Retry-After and
// X-Ratelimit-Retry-After for a 429, Cache-Control: no-store, and a connection nginx
// keeps open.
func (f *nginxFront) sluiceRefusal(what string, resp *http.Response, p map[string]any) {
	f.t.Helper()
	if resp.Close || resp.Header.Get("Cache-Control") != "no-store" {
		f.t.Errorf("%s: nginx closes the connection (%v) or drops sluice's Cache-Control: %v", what, resp.Close, resp.Header)
	}
	if resp.StatusCode == http.StatusTooManyRequests {
		if p["violated-policies"] == nil || p["retry-after"] == nil || resp.Header.Get("X-Ratelimit-Retry-After") == "" {
			f.t.Errorf("%s: not sluice's own 429: %v %v", what, resp.Header, p)
		}
		return
	}
	if d, _ := p["detail"].(string); d == "" || strings.Contains(d, "sluice cannot decide this request here") {
		f.t.Errorf("%s: not sluice's own problem: %v", what, p)
	}
}

// notForwarded checks that nothing reached the API since the last look.
func (f *nginxFront) notForwarded(what string) {
	f.t.Helper()
	if seen := f.api.take(); len(seen) != 0 {
		f.t.Fatalf("%s reached the API: %q", what, seen)
	}
}

// notParked checks that the queue of the defer rules holds nothing.
func (f *nginxFront) notParked(what string) {
	f.t.Helper()
	q, err := f.store.Queue("orders")
	if err != nil {
		f.t.Fatal(err)
	}
	if depth, err := q.Depth(context.Background()); err != nil || depth != 0 {
		f.t.Fatalf("queue depth %d, %v: %s parked an order", depth, err, what)
	}
}

// ordersRefused sends orders to the route of a defer rule (limit 1 an hour): the first
// reaches the API with its body; the next ones, however the client sends the body, are
// refused with 429 and Retry-After as over a reject rule, since nginx would take a 202
// for "allowed". None reaches the API or the queue.
func (f *nginxFront) ordersRefused() {
	f.t.Helper()
	resp, body := f.do("POST", "/v1/orders", strings.NewReader(`{"n":1}`))
	if resp.StatusCode != 200 || body != "upstream" {
		f.t.Fatalf("first order: %d %q", resp.StatusCode, body)
	}
	if seen := f.api.take(); len(seen) != 1 || seen[0] != `POST /v1/orders {"n":1}` {
		f.t.Fatalf("the API saw %q", seen)
	}
	for _, c := range []struct {
		what string
		body io.Reader
	}{
		{"an order over a defer rule", strings.NewReader(`{"n":2}`)},
		{"an empty order (Content-Length: 0)", http.NoBody},
		{"a chunked order", io.MultiReader(strings.NewReader(`{"n":3}`))},
	} {
		resp, body = f.do("POST", "/v1/orders", c.body)
		f.sluiceRefusal(c.what, resp, f.problem(c.what, resp, body, 429))
		if resp.Header.Get("Retry-After") == "" {
			f.t.Errorf("%s: no Retry-After: %v", c.what, resp.Header)
		}
		f.notForwarded(c.what)
		f.notParked(c.what)
	}
}

// TestCheckBehindNginx runs Debian's nginx with deploy/nginx/auth_request.conf in
// front of the check endpoint and an API, and checks what a client gets.
func TestCheckBehindNginx(t *testing.T) {
	f := newNginxFront(t, nil)

	// Within the limit: the API answers, with sluice's rate-limit headers.
	resp, body := f.do("GET", "/v1/pay?x=1", nil)
	if resp.StatusCode != 200 || body != "upstream" {
		t.Fatalf("allowed: %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"pay";q=1;w=3600` {
		t.Errorf("allowed: RateLimit-Policy %q", got)
	}
	if resp.Header.Get("RateLimit") == "" || resp.Header.Get("X-Ratelimit-Limit") != "1" || resp.Header.Get("X-Ratelimit-Remaining") != "0" {
		t.Errorf("allowed: rate-limit headers %v", resp.Header)
	}
	if seen := f.api.take(); len(seen) != 1 || seen[0] != "GET /v1/pay?x=1 " {
		t.Fatalf("the API saw %q", seen)
	}

	// Over a reject rule: 429, Retry-After and the headers; the API sees nothing.
	resp, body = f.do("GET", "/v1/pay", nil)
	p := f.problem("over the limit", resp, body, 429)
	if p["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" || resp.Header.Get("Retry-After") == "" ||
		resp.Header.Get("RateLimit-Policy") != `"pay";q=1;w=3600` {
		t.Errorf("over the limit: %v %v", resp.Header, p)
	}
	f.sluiceRefusal("over the limit", resp, p)
	f.notForwarded("a refused request")

	f.ordersRefused()

	// Scheduled delivery would park: 400.
	resp, body = f.do("POST", "/v1/later", strings.NewReader(`{"n":4}`), "Sluice-Not-Before", "60")
	f.sluiceRefusal("a scheduled order", resp, f.problem("a scheduled order", resp, body, 400))
	f.notForwarded("a scheduled order")

	// nginx is the edge: the client is its peer, whatever X-Forwarded-For it sends.
	if resp, _ := f.do("GET", "/v1/ip", nil, "X-Forwarded-For", "203.0.113.1"); resp.StatusCode != 200 {
		t.Fatalf("first client request: %d", resp.StatusCode)
	}
	if resp, _ := f.do("GET", "/v1/ip", nil, "X-Forwarded-For", "203.0.113.2"); resp.StatusCode != 429 {
		t.Fatalf("a client's own X-Forwarded-For changed the client: %d", resp.StatusCode)
	}
	f.api.take()

	// No sluice: nginx fails closed.
	f.check.Close()
	resp, body = f.do("GET", "/v1/pay", nil)
	f.problem("sluice down", resp, body, 503)
	f.notForwarded("a request while sluice is down")
}

// TestCheckBehindNginxForwardingBody runs the example without the lines that keep the
// body and its Content-Length off the check: the dangerous configuration. There the
// check declares the client's body (which nginx never sends) or Content-Length: 0, and
// sluice once waited for the body until the client gave up, or parked the empty order
// and answered 202, which nginx let through to the API as well. The client gets 429,
// the API nothing, the queue nothing.
func TestCheckBehindNginxForwardingBody(t *testing.T) {
	f := newNginxFront(t, func(t *testing.T, conf []byte) []byte {
		for _, line := range []string{"proxy_pass_request_body off;", `proxy_set_header Content-Length "";`} {
			if bytes.Count(conf, []byte(line)) != 1 {
				t.Fatalf("%s: %q not written once", nginxExample, line)
			}
			conf = bytes.Replace(conf, []byte(line), nil, 1)
		}
		return conf
	})
	f.ordersRefused()
}
