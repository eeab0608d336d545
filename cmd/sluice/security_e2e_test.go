package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/limiter/childproc"
)

// runSluiceEnv is runSluice with extra environment variables (KEY=VALUE), for
// commands that must end by themselves: one still running after a minute (a server
// that started when it should have refused to) is killed and fails the test.
func runSluiceEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, sluiceBinary, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = childproc.Attr()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		if ee := (*exec.ExitError)(nil); !errors.As(err, &ee) {
			t.Fatal(err)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("sluice %s: still running after a minute, killed\n%s", strings.Join(args, " "), errb.String())
	}
	return cmd.ProcessState.ExitCode(), out.String(), errb.String()
}

// TestNATSListenNeedsCredentials: the embedded server's listener never runs open; a
// missing or weak credential is a usage error naming the flag, before anything starts.
func TestNATSListenNeedsCredentials(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	rulesPath := writeRules(t, t.TempDir(), deferRules("http://127.0.0.1:1", "outflow: {rate: 1/s}"))
	base := func(cmd string) []string {
		args := []string{cmd, "--rules", rulesPath, "--data-dir", t.TempDir(), "--admin-listen", "", "--nats-listen", freeAddr(t)}
		if cmd != "dispatch" {
			args = append(args, "--upstream", "http://127.0.0.1:1", "--listen", freeAddr(t))
		}
		return args
	}
	for _, tc := range []struct {
		name string
		cmd  string
		args []string
		env  []string
		want string
	}{
		{"serve, no token", "serve", nil, nil, "--nats-listen needs --nats-listen-token (or SLUICE_NATS_LISTEN_TOKEN), or TLS client certificates"},
		{"ingress, no token", "ingress", nil, nil, "sluice ingress: --nats-listen needs --nats-listen-token"},
		{"dispatch, no token", "dispatch", nil, nil, "sluice dispatch: --nats-listen needs --nats-listen-token"},
		{"short token", "serve", []string{"--nats-listen-token", "0123456789"}, nil, "--nats-listen-token: at least 32 characters, not 10"},
		{"short token from the environment", "serve", nil, []string{"SLUICE_NATS_LISTEN_TOKEN=short"}, "--nats-listen-token: at least 32 characters"},
		{"token with a space", "serve", []string{"--nats-listen-token", "0123456789abcdef 0123456789abcdef"}, nil, "--nats-listen-token: spaces and control characters"},
		{"TLS without client certificates", "serve", []string{"--nats-listen-cert", pki.serverCert, "--nats-listen-key", pki.serverKey}, nil,
			"--nats-listen needs --nats-listen-token"},
		{"client CA without a certificate", "serve", []string{"--nats-listen-ca", pki.ca}, nil, "--nats-listen-ca needs --nats-listen-cert"},
		{"certificate without key", "serve", []string{"--nats-listen-cert", pki.serverCert, "--nats-listen-ca", pki.ca}, nil, "--nats-listen-cert needs --nats-listen-key"},
		{"key does not match", "serve", []string{"--nats-listen-cert", pki.serverCert, "--nats-listen-key", pki.clientKey, "--nats-listen-ca", pki.ca}, nil,
			"--nats-listen-cert / --nats-listen-key / --nats-listen-ca:"},
		{"short encryption key", "serve", []string{"--nats-listen-token", testNATSToken, "--encryption-key", "abc"}, nil, "--encryption-key: at least 32 characters"},
		{"two encryption keys", "serve", []string{"--nats-listen-token", testNATSToken, "--encryption-key", testNATSToken, "--encryption-key-file", pki.ca}, nil,
			"--encryption-key and --encryption-key-file: give one of them"},
	} {
		code, _, stderr := runSluiceEnv(t, tc.env, append(base(tc.cmd), tc.args...)...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) {
			t.Errorf("%s: exit %d, stderr:\n%s\nwant exit 2 and %q", tc.name, code, stderr, tc.want)
		}
	}
	// A client of another NATS gives its token with --nats-token or in the URL, not both
	// ways at once with a credentials file.
	code, _, stderr := runSluice(t, "dlq", "list", "orders", "--nats", "nats://127.0.0.1:1", "--nats-token", testNATSToken, "--nats-creds", pki.ca)
	if code != exitUsage || !strings.Contains(stderr, "--nats-token and --nats-creds: give one of them") {
		t.Errorf("dlq --nats-token --nats-creds: exit %d\n%s", code, stderr)
	}
}

// natsListenRE finds the embedded server's listener in the start-up log line.
var natsListenRE = regexp.MustCompile(`listening on (?:nats|tls)://(127\.0\.0\.1:[0-9]+)`)

// natsListenAddr is the address of p's --nats-listen 127.0.0.1:0, from its log: a
// port the server chose itself cannot be taken by another test meanwhile.
func natsListenAddr(t *testing.T, p *sluiceProcess) string {
	t.Helper()
	var addr string
	waitFor(t, "the NATS listener in the log", 30*time.Second, func() bool {
		if m := natsListenRE.FindStringSubmatch(p.output.String()); m != nil {
			addr = m[1]
		}
		return addr != ""
	})
	return addr
}

// rawNATS speaks the NATS protocol by hand, as an attacker without a client library
// would: CONNECT without credentials, then subscribe to every parked order, publish a
// forged one and ask JetStream to purge the queue. It returns what the server said.
func rawNATS(t *testing.T, addr string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(conn)
	info, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(info, "INFO ") {
		t.Fatalf("no INFO: %q %v", info, err)
	}
	if !strings.Contains(info, `"auth_required":true`) {
		t.Errorf("the server does not announce auth_required: %s", info)
	}
	fmt.Fprint(conn, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\n"+
		"SUB sluice.q.> 1\r\nSUB $JS.API.> 2\r\n"+
		"PUB sluice.q.orders.aaaaaaaaaaaaaaaaaaaaaaaaaa 6\r\nforged\r\n"+
		"PUB $JS.API.STREAM.PURGE.SLUICE_orders _INBOX.x 0\r\n\r\n"+
		"PUB $JS.API.STREAM.MSG.GET.SLUICE_orders _INBOX.x 9\r\n{\"seq\":1}\r\nPING\r\n")
	var got strings.Builder
	for {
		line, err := r.ReadString('\n')
		got.WriteString(line)
		if err != nil {
			break // the server closed the connection
		}
	}
	return got.String()
}

// TestNATSListenRefusesUnauthenticatedClients runs `sluice ingress` with
// --nats-listen and a token, parks an order, and attacks the listener: a client
// without the token, or with another, reads nothing, publishes nothing and purges
// nothing; `sluice dlq` and `sluice dispatch` with the token (flag, URL or
// SLUICE_NATS_TOKEN) work, and the dispatcher delivers the order intact.
func TestNATSListenRefusesUnauthenticatedClients(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 20/s}"))
	front := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL, "--nats-listen", "127.0.0.1:0", "--nats-listen-token", testNATSToken, "--queue-key", testQueueKey)
	natsAddr := natsListenAddr(t, front)
	warmUp(t, front.url, "/v1/orders")
	a := mustDefer(t, front.url, "/v1/orders", "parked-1", "Authorization", "Bearer victim-secret")

	for _, tc := range []struct {
		name string
		opts []nats.Option
	}{
		{"no token", nil},
		{"wrong token", []nats.Option{nats.Token(strings.Replace(testNATSToken, "0", "1", 1))}},
		{"user and password", []nats.Option{nats.UserInfo("sluice", testNATSToken)}},
	} {
		nc, err := nats.Connect("nats://"+natsAddr, nats.Timeout(10*time.Second))
		if len(tc.opts) > 0 {
			nc, err = nats.Connect("nats://"+natsAddr, append(tc.opts, nats.Timeout(10*time.Second))...)
		}
		if err == nil {
			nc.Close()
			t.Errorf("%s: connected", tc.name)
		} else if !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
			t.Errorf("%s: %v, want an authorization violation", tc.name, err)
		}
	}
	said := rawNATS(t, natsAddr)
	if !strings.Contains(said, "-ERR 'Authorization Violation'") || strings.Contains(said, "MSG ") || strings.Contains(said, "PONG") {
		t.Errorf("raw client without credentials got:\n%s", said)
	}
	if strings.Contains(said, "victim-secret") {
		t.Errorf("the raw client read the parked order:\n%s", said)
	}

	// sluice's own tools, with the token: given three ways.
	code, stdout, stderr := runSluice(t, "dlq", "list", "orders", "--nats", "nats://"+natsAddr, "--queue-key", testQueueKey)
	if code != exitFailure || !strings.Contains(strings.ToLower(stderr), "authorization violation") {
		t.Errorf("dlq without the token: exit %d\n%s%s", code, stdout, stderr)
	}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"--nats-token", nil, []string{"--nats", "nats://" + natsAddr, "--nats-token", testNATSToken}},
		{"SLUICE_NATS_TOKEN", []string{"SLUICE_NATS_TOKEN=" + testNATSToken}, []string{"--nats", "nats://" + natsAddr}},
		{"token in the URL", nil, []string{"--nats", "nats://" + testNATSToken + "@" + natsAddr}},
	} {
		code, stdout, stderr := runSluiceEnv(t, tc.env, append([]string{"dlq", "list", "orders", "--queue-key", testQueueKey}, tc.args...)...)
		if code != exitOK || !strings.Contains(stderr, "no dead letters in queue orders") {
			t.Errorf("dlq list with %s: exit %d\n%s%s", tc.name, code, stdout, stderr)
		}
	}

	// The order the attacks aimed at is still there, and delivered once, as parked.
	if st, _ := getStatus(t, front.url, a.Ticket); st.Status != "queued" {
		t.Fatalf("ticket %s after the attacks: %+v", a.Ticket, st)
	}
	startCommand(t, "dispatch", "--rules", rulesPath, "--nats", "nats://"+natsAddr, "--nats-token", testNATSToken, "--queue-key", testQueueKey)
	down.waitArrived(t, []string{a.Ticket}, 60*time.Second)
	if _, count, _ := down.snapshot(); count[a.Ticket] != 1 {
		t.Errorf("the parked order was delivered %d times", count[a.Ticket])
	}
	waitStatus(t, front.url, a.Ticket, "done", 30*time.Second)
}

// TestNATSListenClientCertificates: with TLS client certificates instead of a token,
// a client needs a certificate the --nats-listen-ca signed.
func TestNATSListenClientCertificates(t *testing.T) {
	t.Parallel()
	pki := newTestPKI(t)
	other := newTestPKI(t) // another CA: its certificates are no credential here
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 20/s}"))
	front := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL, "--nats-listen", "127.0.0.1:0",
		"--nats-listen-cert", pki.serverCert, "--nats-listen-key", pki.serverKey, "--nats-listen-ca", pki.ca)
	natsAddr := natsListenAddr(t, front)
	url := "tls://" + natsAddr
	for _, tc := range []struct {
		name string
		args []string
		ok   bool
	}{
		{"no TLS", []string{"--nats", "nats://" + natsAddr}, false},
		{"no client certificate", []string{"--nats", url, "--nats-ca", pki.ca}, false},
		{"a certificate of another CA", []string{"--nats", url, "--nats-ca", pki.ca, "--nats-cert", other.clientCert, "--nats-key", other.clientKey}, false},
		{"a certificate of the CA", []string{"--nats", url, "--nats-ca", pki.ca, "--nats-cert", pki.clientCert, "--nats-key", pki.clientKey}, true},
	} {
		code, stdout, stderr := runSluice(t, append([]string{"dlq", "list", "orders", "--queue-key", testQueueKey}, tc.args...)...)
		if (code == exitOK) != tc.ok || (!tc.ok && code != exitFailure) {
			t.Errorf("dlq list, %s: exit %d, want success %v\n%s%s", tc.name, code, tc.ok, stdout, stderr)
		}
	}
}

// TestEncryptionAtRest parks an order with an encryption key, and checks that its
// body and its Authorization header are in no file of the data directory, that the
// directory does not open without the key or with another (exit 1, a clear message),
// and that it opens with the key, the order still there. Without a key, a warning at
// start says that parked headers are stored in clear.
func TestEncryptionAtRest(t *testing.T) {
	t.Parallel()
	const (
		bodyMark = "ORDER-BODY-MARK-c0ffee"
		hdrMark  = "Bearer HEADER-MARK-5ec12e7"
		key      = "at-rest-0123456789abcdef0123456789abcdef"
	)
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 20/s}"))
	keyFile := filepath.Join(t.TempDir(), "at-rest.key")
	if err := os.WriteFile(keyFile, []byte(key+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	p := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir, "--encryption-key-file", keyFile)
	warmUp(t, p.url, "/v1/orders")
	r, err := postOrder(p.url, "/v1/orders", "secret-order", `{"note":"`+bodyMark+`"}`, "Authorization", hdrMark)
	if err != nil {
		t.Fatal(err)
	}
	a := checkAccepted(t, r)
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.output)
	}
	if strings.Contains(p.output.String(), "stored in clear") {
		t.Errorf("warned about clear storage with a key:\n%s", p.output)
	}
	grep := func(marker string) []string {
		var found []string
		_ = filepath.WalkDir(dataDir, func(path string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				if b, err := os.ReadFile(path); err == nil && bytes.Contains(b, []byte(marker)) {
					found = append(found, path)
				}
			}
			return nil
		})
		return found
	}
	for _, m := range []string{bodyMark, hdrMark} {
		if files := grep(m); len(files) > 0 {
			t.Errorf("%q in clear in %v", m, files)
		}
	}

	ingress := []string{"ingress", "--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir, "--admin-listen", "", "--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		name string
		env  []string
		args []string
	}{
		{"no key", nil, nil},
		{"another key", []string{"SLUICE_ENCRYPTION_KEY=another-0123456789abcdef0123456789abcdef"}, nil},
	} {
		code, _, stderr := runSluiceEnv(t, tc.env, append(ingress, tc.args...)...)
		if code != exitFailure || !strings.Contains(stderr, "the encryption key of the data directory is missing or wrong") ||
			!strings.Contains(stderr, "--encryption-key") {
			t.Errorf("%s: exit %d, want 1 and a message naming the key:\n%s", tc.name, code, stderr)
		}
	}
	// dlq opens the embedded server on the directory too: it needs the key as well.
	code, _, stderr := runSluice(t, "dlq", "list", "orders", "--data-dir", dataDir)
	if code != exitFailure || !strings.Contains(stderr, "missing or wrong") {
		t.Errorf("dlq without the key: exit %d\n%s", code, stderr)
	}
	code, stdout, stderr := runSluiceEnv(t, []string{"SLUICE_ENCRYPTION_KEY=" + key}, "dlq", "list", "orders", "--data-dir", dataDir)
	if code != exitOK {
		t.Errorf("dlq with the key: exit %d\n%s%s", code, stdout, stderr)
	}

	// With the key the order is there, and a dispatcher delivers it as it was sent.
	p = startCommand(t, "serve", "--rules", rulesPath, "--upstream", up.URL, "--data-dir", dataDir, "--encryption-key", key)
	waitStatus(t, p.url, a.Ticket, "done", 60*time.Second)
	down.waitArrived(t, []string{a.Ticket}, 30*time.Second)
	down.mu.Lock()
	got := down.requests[a.Ticket]
	down.mu.Unlock()
	if !strings.Contains(got.body, bodyMark) {
		t.Errorf("delivered body %q, want the parked one", got.body)
	}

	// Without a key, a warning says what is stored in clear.
	plain := startCommand(t, "ingress", "--rules", rulesPath, "--upstream", up.URL)
	if out := plain.output.String(); !strings.Contains(out, "parked requests, their headers (Authorization, Cookie…) and bodies are stored in clear") {
		t.Errorf("no warning without a key:\n%s", out)
	}
}
