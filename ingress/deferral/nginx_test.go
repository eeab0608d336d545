package deferral

import (
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

// startNginx runs nginx (bin) with the example in front of the check server and the API
// and returns its address once it accepts connections. It stops when the test ends.
func startNginx(t *testing.T, bin, check, api string) string {
	t.Helper()
	example, err := os.ReadFile(nginxExample)
	if err != nil {
		t.Fatal(err)
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

// TestCheckBehindNginx runs Debian's nginx with deploy/nginx/auth_request.conf in
// front of the check endpoint and an API, and checks what a client gets.
func TestCheckBehindNginx(t *testing.T) {
	bin := nginxPath(t)
	check, store := checkServer(t, true)
	api := &upstreamLog{}
	upstream := httptest.NewServer(api)
	t.Cleanup(upstream.Close)
	front := "http://" + startNginx(t, bin, check.Listener.Addr().String(), upstream.Listener.Addr().String())

	client := &http.Client{Timeout: 30 * time.Second}
	t.Cleanup(client.CloseIdleConnections)
	do := func(method, path string, body io.Reader, headers ...string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(method, front+path, body)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i+1 < len(headers); i += 2 {
			req.Header.Set(headers[i], headers[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp, string(b)
	}
	problem := func(what string, resp *http.Response, body string, status int) map[string]any {
		t.Helper()
		var p map[string]any
		if resp.StatusCode != status || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Fatalf("%s: %d %v %q, want a %d problem", what, resp.StatusCode, resp.Header, body, status)
		}
		if err := json.Unmarshal([]byte(body), &p); err != nil || p["status"] != float64(status) {
			t.Fatalf("%s: body %q: %v", what, body, err)
		}
		return p
	}
	notForwarded := func(what string) {
		t.Helper()
		if seen := api.take(); len(seen) != 0 {
			t.Fatalf("%s reached the API: %q", what, seen)
		}
	}

	// Within the limit: the API answers, with sluice's rate-limit headers.
	resp, body := do("GET", "/v1/pay?x=1", nil)
	if resp.StatusCode != 200 || body != "upstream" {
		t.Fatalf("allowed: %d %q", resp.StatusCode, body)
	}
	if got := resp.Header.Get("RateLimit-Policy"); got != `"pay";q=1;w=3600` {
		t.Errorf("allowed: RateLimit-Policy %q", got)
	}
	if resp.Header.Get("RateLimit") == "" || resp.Header.Get("X-Ratelimit-Limit") != "1" || resp.Header.Get("X-Ratelimit-Remaining") != "0" {
		t.Errorf("allowed: rate-limit headers %v", resp.Header)
	}
	if seen := api.take(); len(seen) != 1 || seen[0] != "GET /v1/pay?x=1 " {
		t.Fatalf("the API saw %q", seen)
	}

	// Over a reject rule: 429, Retry-After and the headers; the API sees nothing.
	resp, body = do("GET", "/v1/pay", nil)
	p := problem("over the limit", resp, body, 429)
	if p["type"] != "https://iana.org/assignments/http-problem-types#quota-exceeded" || resp.Header.Get("Retry-After") == "" ||
		resp.Header.Get("RateLimit-Policy") != `"pay";q=1;w=3600` {
		t.Errorf("over the limit: %v %v", resp.Header, p)
	}
	notForwarded("a refused request")

	// A defer rule: the first order passes with its body; over the limit nginx has no
	// body to give sluice, so the order is refused like over a reject rule, however
	// the client sends its body, and nothing is parked.
	resp, body = do("POST", "/v1/orders", strings.NewReader(`{"n":1}`))
	if resp.StatusCode != 200 || body != "upstream" {
		t.Fatalf("first order: %d %q", resp.StatusCode, body)
	}
	if seen := api.take(); len(seen) != 1 || seen[0] != `POST /v1/orders {"n":1}` {
		t.Fatalf("the API saw %q", seen)
	}
	for _, c := range []struct {
		what string
		body io.Reader
	}{
		{"an order over a defer rule", strings.NewReader(`{"n":2}`)},
		{"an empty order (Content-Length: 0)", http.NoBody},
		{"a chunked order", io.MultiReader(strings.NewReader(`{"n":3}`))},
	} {
		resp, body = do("POST", "/v1/orders", c.body)
		problem(c.what, resp, body, 429)
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("%s: no Retry-After: %v", c.what, resp.Header)
		}
		notForwarded(c.what)
	}
	q, err := store.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	if depth, err := q.Depth(context.Background()); err != nil || depth != 0 {
		t.Fatalf("queue depth %d, %v: a check without a body parked an order", depth, err)
	}

	// Scheduled delivery needs the body too: 400.
	resp, body = do("POST", "/v1/later", strings.NewReader(`{"n":4}`), "Sluice-Not-Before", "60")
	problem("a scheduled order", resp, body, 400)
	notForwarded("a scheduled order")

	// nginx is the edge: the client is its peer, whatever X-Forwarded-For it sends.
	if resp, _ := do("GET", "/v1/ip", nil, "X-Forwarded-For", "203.0.113.1"); resp.StatusCode != 200 {
		t.Fatalf("first client request: %d", resp.StatusCode)
	}
	if resp, _ := do("GET", "/v1/ip", nil, "X-Forwarded-For", "203.0.113.2"); resp.StatusCode != 429 {
		t.Fatalf("a client's own X-Forwarded-For changed the client: %d", resp.StatusCode)
	}
	api.take()

	// No sluice: nginx fails closed.
	check.Close()
	resp, body = do("GET", "/v1/pay", nil)
	problem("sluice down", resp, body, 503)
	notForwarded("a request while sluice is down")
}
