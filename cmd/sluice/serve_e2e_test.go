package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/childproc"
	"github.com/sluicehq/sluice/limiter/redistest"
)

// End-to-end tests of `sluice serve`: the real binary, a real upstream server and a
// real Redis, over real connections.

// sluiceBinary is built once per test binary (see TestMain).
var sluiceBinary string

// raceEnabled is set by race_test.go in a -race build; the binary is then built with -race too.
var raceEnabled bool

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "sluice-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if sluiceBinary, err = buildSluice(dir); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func buildSluice(dir string) (string, error) { return buildSluiceRace(dir, raceEnabled) }

func buildSluiceRace(dir string, race bool) (string, error) {
	bin := filepath.Join(dir, "sluice")
	// -buildvcs=auto over a GOFLAGS=-buildvcs=false: sluice version reads what the
	// toolchain records of the checkout (TestVersion), where there is one.
	args := []string{"build", "-buildvcs=auto", "-o", bin}
	if race {
		// `go test -race` checks the binary's goroutines (serve, dispatch, dlq) too.
		args = append(args, "-race")
	}
	out, err := exec.Command("go", append(args, ".")...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return bin, nil
}

// sluiceProcess is one running `sluice serve`, `ingress` or `dispatch`.
type sluiceProcess struct {
	cmd    *exec.Cmd
	url    string // front door ("" for dispatch)
	admin  string
	output *syncBuffer
	done   chan struct{}
}

// kill ends the process with SIGKILL, as a crash would, and waits until it is gone.
func (p *sluiceProcess) kill(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// stop sends SIGTERM and returns the exit status.
func (p *sluiceProcess) stop(t *testing.T) int {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("sluice did not exit after SIGTERM:\n%s", p.output)
	}
	return p.cmd.ProcessState.ExitCode()
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startSluice runs `sluice serve` with args plus free listen addresses and waits until
// it answers /healthz. It is killed at the end of the test.
func startSluice(t *testing.T, args ...string) *sluiceProcess {
	t.Helper()
	return startCommand(t, "serve", args...)
}

// startCommand runs `sluice COMMAND` (serve, ingress or dispatch) with free listen
// addresses, a data directory of its own (args may name another: the last --data-dir
// wins) and args, and waits until it answers /healthz. It is killed at the end of the
// test.
func startCommand(t *testing.T, command string, args ...string) *sluiceProcess {
	t.Helper()
	return startBinary(t, sluiceBinary, command, args...)
}

// startBinary is startCommand with another build of sluice.
func startBinary(t *testing.T, sluiceBinary, command string, args ...string) *sluiceProcess {
	t.Helper()
	return startBinaryEnv(t, sluiceBinary, nil, command, args...)
}

// startBinaryEnv is startBinary with env ("NAME=value") added to the test's
// environment, for the process alone. An address freeAddr picked is free when picked,
// not always when sluice binds it: another process on the machine (a NATS node of a
// test running beside it, a connection's local port) may take it in between (a
// clean-clone run failed so). A start refused for that is made again, up to three
// times, on other addresses.
func startBinaryEnv(t *testing.T, sluiceBinary string, env []string, command string, args ...string) *sluiceProcess {
	t.Helper()
	if sluiceBinary == "" {
		t.Fatal("the sluice binary was not built")
	}
	for attempt := 1; ; attempt++ {
		p, err := launch(t, sluiceBinary, env, command, args...)
		if err == nil {
			return p
		}
		if !errors.Is(err, errAddressTaken) || attempt == 3 {
			t.Fatal(err)
		}
		t.Logf("%v; starting it again on other addresses", err)
	}
}

// errAddressTaken: sluice refused an address that another process took.
var errAddressTaken = errors.New("an address was taken by another process")

// launch is one start of startBinaryEnv: the process once it answers /healthz, or why
// it did not.
func launch(t *testing.T, sluiceBinary string, env []string, command string, args ...string) (*sluiceProcess, error) {
	t.Helper()
	admin := freeAddr(t)
	p := &sluiceProcess{admin: "http://" + admin, output: &syncBuffer{}, done: make(chan struct{})}
	base := []string{command, "--admin-listen", admin, "--log-level", "debug"}
	if command != "rls" { // rls has no queues
		base = append(base, "--data-dir", t.TempDir())
	}
	if command != "dispatch" && command != "rls" {
		listen := freeAddr(t)
		p.url = "http://" + listen
		base = append(base, "--listen", listen)
	}
	p.cmd = exec.Command(sluiceBinary, append(base, args...)...)
	p.cmd.Stdout, p.cmd.Stderr = p.output, p.output
	if env != nil {
		p.cmd.Env = append(os.Environ(), env...)
	}
	p.cmd.SysProcAttr = childproc.Attr()
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if strings.Contains(p.output.String(), "WARNING: DATA RACE") {
			t.Errorf("sluice %s: the race detector reported a race", command)
		}
		if t.Failed() {
			t.Logf("sluice %s output:\n%s", command, p.output)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(p.admin + "/healthz")
		if err == nil {
			resp.Body.Close()
			return p, nil
		}
		select {
		case <-p.done:
			if strings.Contains(p.output.String(), "the address is in use by another process") {
				return nil, fmt.Errorf("sluice %s: %w:\n%s", command, errAddressTaken, p.output)
			}
			return nil, fmt.Errorf("sluice %s exited: %v\n%s", command, p.cmd.ProcessState, p.output)
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("sluice %s did not come up:\n%s", command, p.output)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// upstream is a real HTTP server that counts what reaches it.
type upstream struct {
	*httptest.Server
	hits  atomic.Int64
	delay time.Duration
}

func newUpstream(t *testing.T, delay time.Duration) *upstream {
	u := &upstream{delay: delay}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		time.Sleep(u.delay)
		u.hits.Add(1)
		w.Header().Set("X-Upstream", "yes")
		fmt.Fprintf(w, "hello %s %s xff=%s", r.Method, r.URL.Path, r.Header.Get("X-Forwarded-For"))
	}))
	t.Cleanup(u.Close)
	return u
}

func writeRules(t *testing.T, dir, content string) string {
	t.Helper()
	path := filepath.Join(dir, "rules.yaml")
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil { // as editors do: replace, not rewrite
		t.Fatal(err)
	}
	return path
}

func e2eRules(perMinute int) string {
	return fmt.Sprintf(`
domain: e2e
descriptors:
  - key: route
    value: orders
    descriptors:
      - key: user
        rate_limit: {unit: hour, requests_per_unit: %d, name: orders_per_user}
  - key: client_ip
    rate_limit: {unit: hour, requests_per_unit: 3, name: per_ip}
  - key: route
    value: shared
    rate_limit: {unit: hour, requests_per_unit: 20, name: shared}
    algorithm: token_bucket
routes:
  - name: orders
    match: {path_prefix: /v1/orders}
    descriptors:
      - [{key: route, value: orders}, {key: user, from: "header:X-User-ID"}]
  - name: by-ip
    match: {path: /v1/ip}
    descriptors:
      - [{key: client_ip, from: client_ip}]
  - name: shared
    match: {path: /v1/shared}
    descriptors:
      - [{key: route, value: shared}]
`, perMinute)
}

type result struct {
	status int
	header http.Header
	body   string
}

func send(t *testing.T, method, url string, body io.Reader, headers ...string) result {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{resp.StatusCode, resp.Header, string(b)}
}

func TestServeEndToEnd(t *testing.T) {
	up := newUpstream(t, 0)
	redisServer := redistest.Start(t)
	dir := t.TempDir()
	rulesPath := writeRules(t, dir, e2eRules(2))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", "redis://"+redisServer.Addr()+"/0", "--max-body", "1024")

	t.Run("allowed requests are proxied with headers", func(t *testing.T) {
		r := send(t, "POST", p.url+"/v1/orders", strings.NewReader("{}"), "X-User-ID", "alice")
		if r.status != 200 || r.header.Get("X-Upstream") != "yes" || !strings.HasPrefix(r.body, "hello POST /v1/orders") {
			t.Fatalf("%d %v %q", r.status, r.header, r.body)
		}
		if r.header.Get("X-Ratelimit-Limit") != "2" || r.header.Get("X-Ratelimit-Remaining") != "1" ||
			r.header.Get("Ratelimit-Policy") != `"orders_per_user";q=2;w=3600` ||
			!strings.HasPrefix(r.header.Get("Ratelimit"), `"orders_per_user";r=1;t=`) {
			t.Fatalf("headers %v", r.header)
		}
	})
	t.Run("over the limit: 429 with headers and a problem body", func(t *testing.T) {
		send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", "alice")
		hitsBefore := up.hits.Load()
		r := send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", "alice")
		if r.status != 429 || up.hits.Load() != hitsBefore {
			t.Fatalf("status %d, upstream hits %d→%d", r.status, hitsBefore, up.hits.Load())
		}
		for _, h := range []string{"Retry-After", "X-Ratelimit-Retry-After"} {
			if v := r.header.Get(h); v == "" || v == "0" {
				t.Errorf("%s = %q", h, v)
			}
		}
		if r.header.Get("Cache-Control") != "no-store" || r.header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("headers %v", r.header)
		}
		var prob map[string]any
		if err := json.Unmarshal([]byte(r.body), &prob); err != nil || prob["status"] != float64(429) ||
			!strings.Contains(r.body, `"violated-policies":["orders_per_user"]`) {
			t.Errorf("problem body %q (%v)", r.body, err)
		}
	})
	t.Run("forged forwarding headers change nothing", func(t *testing.T) {
		for i := range 3 {
			if r := send(t, "GET", p.url+"/v1/ip", nil, "X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i)); r.status != 200 {
				t.Fatalf("request %d: %d", i, r.status)
			}
		}
		r := send(t, "GET", p.url+"/v1/ip", nil, "X-Forwarded-For", "198.51.100.99", "Forwarded", "for=198.51.100.98")
		if r.status != 429 {
			t.Fatalf("4th request from 127.0.0.1 with forged headers: %d, want 429", r.status)
		}
	})
	t.Run("body over --max-body: 413", func(t *testing.T) {
		r := send(t, "POST", p.url+"/v1/orders", strings.NewReader(strings.Repeat("x", 2000)), "X-User-ID", "bob")
		if r.status != 413 || !strings.Contains(r.body, "larger than 1024 bytes") {
			t.Fatalf("%d %q", r.status, r.body)
		}
		// Chunked, no declared length: cut off while proxied.
		pr, pw := io.Pipe()
		go func() { pw.Write([]byte(strings.Repeat("y", 3000))); pw.Close() }()
		if r := send(t, "POST", p.url+"/v1/orders", pr, "X-User-ID", "bob"); r.status != 413 {
			t.Fatalf("chunked: %d %q", r.status, r.body)
		}
	})
	t.Run("rules reload while serving", func(t *testing.T) {
		writeRules(t, dir, e2eRules(50))
		deadline := time.Now().Add(20 * time.Second)
		// A user of its own per probe: under the old limit (2 per hour) a third probe
		// by one user would be refused when the reload takes a while (a loaded machine).
		for i := 0; ; i++ {
			r := send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", fmt.Sprint("carol-", i))
			if r.status != 200 {
				t.Fatalf("status %d during reload", r.status)
			}
			if r.header.Get("X-Ratelimit-Limit") == "50" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the new rules were never served")
			}
			time.Sleep(50 * time.Millisecond)
		}
		// An invalid file is refused and the last good set keeps serving.
		writeRules(t, dir, "domain: e2e\ndescriptors:\n  - key: x\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n")
		deadline = time.Now().Add(20 * time.Second)
		for !strings.Contains(p.output.String(), "fortnight") {
			if time.Now().After(deadline) {
				t.Fatal("the invalid rules were not reported")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if r := send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", "carol"); r.status != 200 || r.header.Get("X-Ratelimit-Limit") != "50" {
			t.Fatalf("after an invalid reload: %d, limit %q", r.status, r.header.Get("X-Ratelimit-Limit"))
		}
		m := send(t, "GET", p.admin+"/metrics", nil)
		if !strings.Contains(m.body, `sluice_rules_reload_total{result="failure"} 1`) {
			t.Errorf("reload failure not counted:\n%s", grepLines(m.body, "reload"))
		}
	})
	t.Run("metrics and readiness", func(t *testing.T) {
		m := send(t, "GET", p.admin+"/metrics", nil)
		for _, want := range []string{`sluice_decisions_total{outcome="rejected",rule="orders_per_user"}`, `sluice_upstream_requests_total{class="2xx"}`, "sluice_decision_duration_seconds_count"} {
			if !strings.Contains(m.body, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
		if strings.Contains(m.body, "alice") || strings.Contains(m.body, "127.0.0.1") {
			t.Error("metrics contain a client identifier")
		}
		if r := send(t, "GET", p.admin+"/readyz", nil); r.status != 200 {
			t.Errorf("readyz %d %s", r.status, r.body)
		}
	})
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestServeTwoReplicasShareOneLimit(t *testing.T) {
	up := newUpstream(t, 0)
	redisServer := redistest.Start(t)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	redisURL := "redis://" + redisServer.Addr() + "/0"
	// A loaded machine may keep Redis past the default 50 ms: then each replica would
	// decide alone (failure_mode local), which is not what this test is about.
	a := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s")
	b := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s")
	// "shared" is a token bucket of 20 refilling at 20 per hour: over this test it
	// refills far less than one token, so together the replicas allow exactly 20.
	var allowed, rejected atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		target := a.url
		if i%2 == 1 {
			target = b.url
		}
		wg.Go(func() {
			for range 10 {
				resp, err := http.Get(target + "/v1/shared")
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case 200:
					allowed.Add(1)
				case 429:
					rejected.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 20 || rejected.Load() != 60 {
		t.Fatalf("two replicas allowed %d and rejected %d of 80, want 20 and 60", allowed.Load(), rejected.Load())
	}
	if up.hits.Load() != 20 {
		t.Fatalf("upstream saw %d requests, want 20", up.hits.Load())
	}
}

// SIGTERM: /readyz answers 503 at once, so load balancers stop sending, while the
// requests under way finish; then the process exits 0.
func TestServeShutdownFinishesRequestsUnderWay(t *testing.T) {
	// The upstream holds every request until the test has seen /readyz turn 503.
	gate := make(chan struct{})
	var release sync.Once
	open := func() { release.Do(func() { close(gate) }) }
	up := &upstream{}
	up.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		<-gate
		up.hits.Add(1)
	}))
	t.Cleanup(up.Close)
	t.Cleanup(open) // runs first: up.Close waits for the handlers
	rulesPath := writeRules(t, t.TempDir(), e2eRules(100))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL)
	const inFlight = 10
	statuses := make(chan int, inFlight)
	var started sync.WaitGroup
	for i := range inFlight {
		started.Add(1)
		go func() {
			req, _ := http.NewRequest("POST", p.url+"/v1/orders", nil)
			req.Header.Set("X-User-ID", fmt.Sprint("u", i))
			started.Done()
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				statuses <- -1
				return
			}
			resp.Body.Close()
			statuses <- resp.StatusCode
		}()
	}
	started.Wait()
	// Wait until every request has reached the (slow) upstream handler's sleep: the
	// decision counter tells us sluice has seen them all.
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(send(t, "GET", p.admin+"/metrics", nil).body, `sluice_decisions_total{outcome="allowed",rule="orders_per_user"} 10`) {
		if time.Now().After(deadline) {
			t.Fatal("requests never arrived")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := send(t, "GET", p.admin+"/readyz", nil); r.status != 200 {
		t.Fatalf("/readyz before SIGTERM: %d %s", r.status, r.body)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(30 * time.Second)
	for {
		r := send(t, "GET", p.admin+"/readyz", nil)
		if r.status == http.StatusServiceUnavailable && strings.Contains(r.body, "shutting down") {
			break
		}
		if r.status != 200 || time.Now().After(deadline) {
			t.Fatalf("/readyz after SIGTERM with requests under way: %d %s, want 503 shutting down", r.status, r.body)
		}
		time.Sleep(10 * time.Millisecond)
	}
	open()
	for range inFlight {
		if s := <-statuses; s != 200 {
			t.Fatalf("a request under way at shutdown got %d", s)
		}
	}
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		t.Fatal("sluice did not exit after SIGTERM")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Fatalf("exit status %d", code)
	}
	if up.hits.Load() != inFlight {
		t.Fatalf("upstream finished %d requests, want %d", up.hits.Load(), inFlight)
	}
}

// TestAddressInUse: an address in use fails the start at once with exit status 1,
// naming its flag, before the embedded NATS or the rules are opened.
func TestAddressInUse(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	serve := []string{"--rules", rulesPath, "--upstream", "http://127.0.0.1:1", "--data-dir", t.TempDir()}
	for _, tc := range []struct {
		flag string
		args []string
	}{
		{"listen", append([]string{"serve", "--listen", addr, "--admin-listen", freeAddr(t)}, serve...)},
		{"admin-listen", append([]string{"serve", "--listen", freeAddr(t), "--admin-listen", addr}, serve...)},
		{"admin-listen", []string{"dispatch", "--admin-listen", addr, "--rules", rulesPath, "--data-dir", t.TempDir()}},
		{"check-listen", []string{"rls", "--check-listen", addr, "--admin-listen", "", "--rules", rulesPath}},
		{"grpc-listen", []string{"rls", "--grpc-listen", addr, "--admin-listen", "", "--rules", rulesPath}},
	} {
		cmd := exec.Command(sluiceBinary, tc.args...)
		out, err := cmd.CombinedOutput()
		want := fmt.Sprintf("sluice %s: --%s %s: the address is in use by another process: stop it, or give --%s another address\n", tc.args[0], tc.flag, addr, tc.flag)
		if cmd.ProcessState.ExitCode() != exitFailure || !strings.HasSuffix(string(out), want) || strings.Contains(string(out), "NATS connected") {
			t.Errorf("%q: exit %v, output\n%s\nwant it to end\n%s", tc.args, err, out, want)
		}
	}
}
