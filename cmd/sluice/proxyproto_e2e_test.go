package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/childproc"
)

// haproxyPath finds HAProxy, also in /usr/sbin (off a Debian user's PATH). On Linux
// under CI a missing HAProxy fails the test (.ci/test installs it); elsewhere it skips.
func haproxyPath(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"haproxy", "/usr/sbin/haproxy"} {
		if p, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	if runtime.GOOS == "linux" && os.Getenv("CI") != "" {
		t.Fatal("haproxy is not installed (apt-get install haproxy; .ci/test installs it)")
	}
	t.Skip("haproxy is not installed: --proxy-protocol is not tested behind it")
	return ""
}

// haproxyConf: two TCP frontends in front of sluice, one sending PROXY v2, one v1.
const haproxyConf = `global
    maxconn 64
defaults
    mode tcp
    timeout connect 5s
    timeout client 30s
    timeout server 30s
frontend v2
    bind %[1]s
    default_backend sluice_v2
frontend v1
    bind %[2]s
    default_backend sluice_v1
backend sluice_v2
    server s %[3]s send-proxy-v2
backend sluice_v1
    server s %[3]s send-proxy
`

// startHAProxy runs HAProxy in the foreground in front of sluice at backend and
// returns its v2 and v1 frontends once both accept connections.
func startHAProxy(t *testing.T, backend string) (v2, v1 string) {
	t.Helper()
	bin := haproxyPath(t)
	v2, v1 = freeAddr(t), freeAddr(t)
	conf := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(conf, []byte(fmt.Sprintf(haproxyConf, v2, v1, backend)), 0o644); err != nil {
		t.Fatal(err)
	}
	logPath := filepath.Join(filepath.Dir(conf), "haproxy.log")
	proc, err := childproc.Start(exec.Command(bin, "-db", "-f", conf), logPath)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = proc.Cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-proc.Exited():
		case <-time.After(20 * time.Second):
			proc.Kill()
		}
		if t.Failed() {
			t.Logf("haproxy's output:\n%s", childproc.Tail(logPath, 8<<10))
		}
	})
	listening := func() bool {
		for _, addr := range []string{v2, v1} {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				return false
			}
			c.Close()
		}
		return true
	}
	if err := proc.WaitReady(context.Background(), 30*time.Second, 20*time.Millisecond, listening); err != nil {
		t.Fatalf("haproxy: %v\n%s", err, childproc.Tail(logPath, 8<<10))
	}
	return v2, v1
}

// getFrom sends GET path to addr from the local address from (a loopback address of
// its own: the client HAProxy sees) and returns the status and body.
func getFrom(t *testing.T, from, addr, path string) (int, string) {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	resp, err := client.Get("http://" + addr + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// Behind Debian's HAProxy sending PROXY v2 (send-proxy-v2) and v1 (send-proxy), with
// --proxy-protocol naming HAProxy's address, each client is the address HAProxy saw: a
// per-client limit of 3 an hour allows each client its own 3 and refuses its 4th, and
// the upstream is told the client in X-Forwarded-For. A client straight from the
// trusted address without a header is served as itself.
func TestProxyProtocolBehindHAProxy(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(5))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--proxy-protocol", "127.0.0.1/32")
	v2, v1 := startHAProxy(t, strings.TrimPrefix(p.url, "http://"))
	for _, c := range []struct{ front, client string }{{v2, "127.0.0.2"}, {v2, "127.0.0.3"}, {v1, "127.0.0.4"}} {
		for i := range 4 {
			status, body := getFrom(t, c.client, c.front, "/v1/ip")
			if i < 3 && (status != 200 || !strings.HasSuffix(body, "xff="+c.client)) {
				t.Fatalf("client %s, request %d: %d %q; want the upstream's answer naming the client", c.client, i+1, status, body)
			}
			if i == 3 && status != http.StatusTooManyRequests {
				t.Fatalf("client %s, request 4 over its 3 an hour: %d %q", c.client, status, body)
			}
		}
	}
	// No header from the trusted address: the peer itself is the client.
	if status, body := getFrom(t, "127.0.0.1", strings.TrimPrefix(p.url, "http://"), "/v1/ip"); status != 200 || !strings.HasSuffix(body, "xff=127.0.0.1") {
		t.Errorf("a direct request from the trusted address: %d %q", status, body)
	}
}

// --proxy-protocol takes CIDRs or addresses only; anything else stops the start with
// the flag's name.
func TestProxyProtocolFlagRefusesNonsense(t *testing.T) {
	dir := t.TempDir()
	rulesPath := writeRules(t, dir, e2eRules(5))
	code, _, errOut := runIn(t, "serve", "--rules", rulesPath, "--upstream", "http://127.0.0.1:1", "--data-dir", dir,
		"--listen", "127.0.0.1:0", "--proxy-protocol", "127.0.0.1/32,haproxy.internal")
	if code == 0 || !strings.Contains(errOut, `--proxy-protocol: "haproxy.internal": not a CIDR or an address`) {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}
