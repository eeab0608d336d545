package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter/childproc"
)

// testPKI is a CA and a server and a client certificate it signed, as PEM files.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	newKey := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}
	now := time.Now()
	caKey := newKey()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (cert, key string) {
		k := newKey()
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		return write(name+".pem", "CERTIFICATE", der), write(name+".key", "PRIVATE KEY", keyDER(k))
	}
	p := testPKI{ca: write("ca.pem", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = issue(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = issue(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

// TestCredentialFlagErrors: credentials and TLS files are checked before anything
// starts, and a missing or malformed one is a usage error that names its flag.
func TestCredentialFlagErrors(t *testing.T) {
	pki := newTestPKI(t)
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing.pem")
	notPEM := writeFile(t, "not.pem", "hello\n")
	serve := []string{"serve", "--rules", "x.yaml", "--upstream", "http://127.0.0.1:1"}
	dispatch := []string{"dispatch", "--rules", "x.yaml", "--nats", "nats://127.0.0.1:1"}
	dlq := []string{"dlq", "list", "orders", "--nats", "nats://127.0.0.1:1"}
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"redis CA missing", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-ca", missing), nil,
			"--redis-ca: open " + missing + ": no such file or directory"},
		{"redis CA not PEM", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-ca", notPEM), nil,
			"--redis-ca: no PEM certificate in " + notPEM},
		{"redis cert without key", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-cert", pki.clientCert), nil,
			"--redis-cert needs --redis-key"},
		{"redis key without cert", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-key", pki.clientKey), nil,
			"--redis-key needs --redis-cert"},
		{"redis cert missing", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-cert", missing, "--redis-key", pki.clientKey), nil,
			"--redis-cert / --redis-key: open " + missing},
		{"redis key does not match", with(serve, "--redis", "rediss://127.0.0.1:1", "--redis-cert", pki.clientCert, "--redis-key", pki.serverKey), nil,
			"--redis-cert / --redis-key: tls: private key does not match public key"},
		{"redis TLS files without rediss", with(serve, "--redis", "redis://127.0.0.1:1", "--redis-ca", pki.ca), nil,
			"need a rediss:// URL; --redis is redis://"},
		{"redis cluster CA missing", with(serve, "--redis", "rediss://127.0.0.1:1?addr=127.0.0.1:2", "--redis-ca", missing), nil,
			"--redis-ca: open " + missing},
		{"redis cluster TLS files without rediss", with(serve, "--redis", "redis://127.0.0.1:1?addr=127.0.0.1:2", "--redis-ca", pki.ca), nil,
			"need a rediss:// URL"},
		{"redis password twice", with(serve, "--redis", "redis://:a@127.0.0.1:1"), map[string]string{"SLUICE_REDIS_PASSWORD": "b"},
			"--redis-password: the --redis URL has a password too"},
		{"redis bad URL", with(serve, "--redis", "http://127.0.0.1:1"), nil, "--redis: redis: invalid URL scheme: http"},
		{"redis CA missing, from the file", with(serve, "--config", writeFile(t, "c.yaml", "redis: rediss://127.0.0.1:1\nredis-ca: "+missing+"\n")), nil,
			"--redis-ca: open " + missing},
		{"ingress redis CA missing", []string{"ingress", "--rules", "x.yaml", "--upstream", "http://127.0.0.1:1", "--redis", "rediss://127.0.0.1:1", "--redis-ca", missing}, nil,
			"sluice ingress: --redis-ca: open " + missing},
		{"nats CA missing", with(dispatch, "--nats-ca", missing), nil, "sluice dispatch: --nats-ca: open " + missing},
		{"nats CA not PEM", with(dispatch, "--nats-ca", notPEM), nil, "--nats-ca: no PEM certificate in"},
		{"nats cert without key", with(dispatch, "--nats-cert", pki.clientCert), nil, "--nats-cert needs --nats-key"},
		{"nats key missing", with(dispatch, "--nats-cert", pki.clientCert, "--nats-key", missing), nil, "--nats-cert / --nats-key: open " + missing},
		{"nats creds missing", with(serve, "--nats", "nats://127.0.0.1:1", "--nats-creds", missing), nil, "sluice serve: --nats-creds: open " + missing},
		{"nats creds missing, from the environment", dispatch, map[string]string{"SLUICE_NATS_CREDS": missing}, "--nats-creds: open " + missing},
		{"dlq nats CA missing", with(dlq, "--nats-ca", missing), nil, "sluice dlq: --nats-ca: open " + missing},
		{"dlq nats creds missing", with(dlq, "--nats-creds", missing), nil, "sluice dlq: --nats-creds: open " + missing},
		{"queue key missing with --nats", dispatch, nil, "sluice dispatch: --queue-key (or SLUICE_QUEUE_KEY) is required with --nats"},
		{"ingress queue key missing with --nats", []string{"ingress", "--rules", "x.yaml", "--upstream", "http://127.0.0.1:1", "--nats", "nats://127.0.0.1:1"}, nil,
			"sluice ingress: --queue-key (or SLUICE_QUEUE_KEY) is required"},
		{"queue key too short", with(serve, "--queue-key", "c2hvcnQga2V5"), nil, "sluice serve: --queue-key: 9 bytes, want at least 32"},
		{"queue key not base64", with(dispatch, "--queue-key", "not base64!"), nil, "sluice dispatch: --queue-key: not base64"},
		{"queue key too short, from the environment", dlq, map[string]string{"SLUICE_QUEUE_KEY": "c2hvcnQga2V5"}, "sluice dlq: --queue-key: 9 bytes"},
		// Enumerated flags list their values.
		{"log level", with(serve, "--log-level", "loud"), nil, `sluice serve: invalid value "loud" for --log-level: want debug, info, warn or error`},
		{"log format", with(dispatch, "--log-format", "yaml"), nil, `sluice dispatch: invalid value "yaml" for --log-format: want text or json`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			code, _, errOut := runIn(t, tc.args...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errOut, tc.want)
			}
		})
	}

	// Without --nats the NATS credentials have no use; a warning says so, and the
	// command goes on (here to fail on a data directory without sluice data).
	code, _, errOut := runIn(t, "dlq", "list", "orders", "--data-dir", filepath.Join(dir, "none"), "--nats-ca", missing)
	if code != exitFailure || !strings.Contains(errOut, "--nats-ca has no effect without --nats") || !strings.Contains(errOut, "no sluice data") {
		t.Errorf("dlq --nats-ca without --nats: exit %d\n%s", code, errOut)
	}
}

// TestOpenRedisOptions checks what the flags put into go-redis's options, for a
// single server and for a Cluster.
func TestOpenRedisOptions(t *testing.T) {
	pki := newTestPKI(t)
	log := slog.New(slog.DiscardHandler)
	clientCert, err := tls.LoadX509KeyPair(pki.clientCert, pki.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	checkTLS := func(t *testing.T, c *tls.Config, serverName string) {
		t.Helper()
		if c == nil {
			t.Fatal("no TLS")
		}
		if c.ServerName != serverName {
			t.Errorf("ServerName %q, want %q", c.ServerName, serverName)
		}
		if c.RootCAs == nil {
			t.Error("RootCAs: the system's, not --redis-ca")
		}
		got, err := c.GetClientCertificate(&tls.CertificateRequestInfo{})
		if err != nil || !bytes.Equal(got.Certificate[0], clientCert.Certificate[0]) {
			t.Errorf("client certificate: %v", err)
		}
	}
	t.Run("single", func(t *testing.T) {
		c, err := openRedis(redisConfig{url: "rediss://app@redis.internal:6380/2", password: "pw", ca: pki.ca, cert: pki.clientCert, key: pki.clientKey}, log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		opts := c.(*redis.Client).Options()
		if opts.Username != "app" || opts.Password != "pw" || opts.DB != 2 || opts.Addr != "redis.internal:6380" {
			t.Errorf("username %q password %q db %d addr %q", opts.Username, opts.Password, opts.DB, opts.Addr)
		}
		checkTLS(t, opts.TLSConfig, "redis.internal")
		if !opts.ContextTimeoutEnabled {
			t.Error("ContextTimeoutEnabled off: a hung Redis holds calls past their deadline")
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c, err := openRedis(redisConfig{url: "rediss://r1:6380?addr=r2:6380&addr=r3:6380", password: "pw", ca: pki.ca, cert: pki.clientCert, key: pki.clientKey}, log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		opts := c.(*redis.ClusterClient).Options()
		if opts.Password != "pw" || len(opts.Addrs) != 3 {
			t.Errorf("password %q addrs %v", opts.Password, opts.Addrs)
		}
		checkTLS(t, opts.TLSConfig, "r1")
		if !opts.ContextTimeoutEnabled {
			t.Error("ContextTimeoutEnabled off: a hung Redis holds calls past their deadline")
		}
	})
	t.Run("system roots", func(t *testing.T) {
		c, err := openRedis(redisConfig{url: "rediss://:pw@redis.internal:6380"}, log)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		opts := c.(*redis.Client).Options()
		if opts.TLSConfig == nil || opts.TLSConfig.RootCAs != nil || opts.Password != "pw" {
			t.Errorf("TLS %+v, password %q", opts.TLSConfig, opts.Password)
		}
	})
	t.Run("none", func(t *testing.T) {
		var buf bytes.Buffer
		c, err := openRedis(redisConfig{password: "pw"}, slog.New(slog.NewTextHandler(&buf, nil)))
		if c != nil || err != nil {
			t.Errorf("client %v, err %v", c, err)
		}
		if !strings.Contains(buf.String(), "--redis-password has no effect without --redis") {
			t.Errorf("no warning: %q", buf.String())
		}
	})
}

// TestRedisTLSAndPassword runs a real redis-server that takes TLS only, requires a
// client certificate and a password: the flags get a client through, and each of
// them is needed.
func TestRedisTLSAndPassword(t *testing.T) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-server is not installed; CI must run the Redis tests")
		}
		t.Skip("redis-server is not installed")
	}
	pki := newTestPKI(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	var out bytes.Buffer
	cmd := exec.Command(bin, "--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--tls-cert-file", pki.serverCert, "--tls-key-file", pki.serverKey, "--tls-ca-cert-file", pki.ca,
		"--tls-auth-clients", "yes", "--requirepass", "s3cret", "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = childproc.Attr()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})

	log := slog.New(slog.DiscardHandler)
	good := redisConfig{url: fmt.Sprintf("rediss://127.0.0.1:%d/0", port), password: "s3cret", ca: pki.ca, cert: pki.clientCert, key: pki.clientKey}
	ping := func(c redisConfig) error {
		client, err := openRedis(c, log)
		if err != nil {
			return err
		}
		defer client.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		return client.Ping(ctx).Err()
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := ping(good)
		if err == nil {
			break
		}
		select {
		case <-exited:
			if strings.Contains(out.String(), "TLS") && os.Getenv("CI") == "" {
				// Some builds leave TLS out; the Debian package CI installs has it.
				t.Skipf("this redis-server does not take TLS:\n%s", out.String())
			}
			t.Fatalf("redis-server exited:\n%s", out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no PING through TLS: %v\n%s", err, out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}

	noCert := good
	noCert.cert, noCert.key = "", ""
	noCA := good
	noCA.ca = ""
	noPassword := good
	noPassword.password = ""
	inURL := good
	inURL.password, inURL.url = "", fmt.Sprintf("rediss://:s3cret@127.0.0.1:%d/0", port)
	for _, tc := range []struct {
		name string
		cfg  redisConfig
		ok   bool
	}{
		{"all of them", good, true},
		{"password in the URL", inURL, true},
		{"no client certificate", noCert, false},
		{"system roots", noCA, false},
		{"no password", noPassword, false},
	} {
		err := ping(tc.cfg)
		t.Logf("%s: %v", tc.name, err)
		if (err == nil) != tc.ok {
			t.Errorf("%s: PING error %v, want success %v", tc.name, err, tc.ok)
		}
	}
}
