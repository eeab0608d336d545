package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" { // started by the http or rls mode as one of its servers
		// As main: SIGTERM ends the mode (an rls-server then writes its CPU profile).
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func TestHTTPTable(t *testing.T) {
	out, errOut, code := benchRun(t, "http", "--duration", "150ms", "--rate", "200", "--workers", "4", "--redis=false", "--rounds", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	targets := []string{targetUpstream, targetGo204, targetReverseProxy, targetPool, "sluice serve (memory)"}
	switch _, err := nginxPath(); {
	case err == nil:
		targets = append(targets, targetNginx, targetNginx204)
	case runtime.GOOS == "linux" && os.Getenv("CI") != "":
		// .ci/test installs nginx: under CI its row must be there.
		t.Fatalf("nginx is not installed (apt-get install nginx; .ci/test installs it): %v", err)
	case !strings.Contains(errOut, "nginx is not on PATH nor in /usr/sbin"):
		t.Errorf("no note on stderr that nginx was skipped: %q", errOut)
	}
	for _, target := range targets {
		var row string
		for _, l := range strings.Split(out, "\n") {
			if strings.Contains(l, target) {
				row = l
			}
		}
		if row == "" {
			t.Fatalf("no row for %s in\n%s", target, out)
		}
		if !strings.HasSuffix(strings.TrimSpace(row), " 0.00%") {
			t.Errorf("%s: requests failed: %q", target, row)
		}
	}
	if !strings.Contains(errOut, "[round 1/1] [3/") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}

func TestHTTPJSON(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "http.svg")
	out, errOut, code := benchRun(t, "http", "--duration", "100ms", "--rate", "100", "--workers", "2", "--redis=false", "--rounds", "1",
		"--json", "--svg", svg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Mode     string       `json:"mode"`
		Duration string       `json:"duration"`
		Workers  int          `json:"workers"`
		Rate     int          `json:"rate"`
		Rounds   int          `json:"rounds"`
		Redis    *bool        `json:"redis"`
		Results  []httpResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "http" || doc.Duration != "100ms" || doc.Workers != 2 || doc.Rate != 100 || doc.Rounds != 1 || doc.Redis == nil || *doc.Redis {
		t.Errorf("parameters: %s", out)
	}
	byTarget := map[string]httpResult{}
	for _, r := range doc.Results {
		byTarget[r.Target] = r
		if r.RequestsPerSec <= 0 || r.P50Ns <= 0 || r.P99Ns < r.P50Ns || r.ErrorRatio != 0 {
			t.Errorf("result %+v", r)
		}
	}
	for _, target := range []string{targetUpstream, targetGo204, targetReverseProxy, targetPool, "sluice serve (memory)"} {
		if _, ok := byTarget[target]; !ok {
			t.Errorf("no result for %s: %s", target, out)
		}
	}
	if r := byTarget[targetReverseProxy]; r.VsReverseProxy != 1 {
		t.Errorf("the reference's own ratio: %v", r.VsReverseProxy)
	}
	if r := byTarget[targetPool]; r.VsPool != 1 {
		t.Errorf("sluice's proxy's own ratio: %v", r.VsPool)
	}
	if byTarget[targetUpstream].P50AddedNs != 0 {
		t.Errorf("upstream: p50 added %d", byTarget[targetUpstream].P50AddedNs)
	}
	readSVG(t, svg, len(doc.Results))
}

// TestServersStopOnSignal: the servers that run as processes of their own (upstream
// is also the demo API of deploy/) stop with status 0 on SIGTERM and on SIGINT
// (Ctrl-C), rather than running until killed.
func TestServersStopOnSignal(t *testing.T) {
	up := freeAddr()
	for _, tc := range []struct {
		args []string
		sig  os.Signal
	}{
		{[]string{"upstream", up}, syscall.SIGTERM},
		{[]string{"plain-proxy", freeAddr(), "http://" + up}, os.Interrupt},
		{[]string{"pool-proxy", freeAddr(), "http://" + up}, syscall.SIGTERM},
		{[]string{"no-content", freeAddr()}, syscall.SIGTERM},
	} {
		cmd := exec.Command(os.Args[0], tc.args...)
		cmd.Env = append(os.Environ(), childEnv+"=1")
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		if err := waitHealthy(context.Background(), "http://"+tc.args[1]+"/"); err != nil {
			cmd.Process.Kill()
			<-done
			t.Fatalf("%s did not come up: %v\n%s", tc.args[0], err, &out)
		}
		if err := cmd.Process.Signal(tc.sig); err != nil {
			t.Fatal(err)
		}
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s after %v: %v\n%s", tc.args[0], tc.sig, err, &out)
			}
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Errorf("%s still running 30s after %v\n%s", tc.args[0], tc.sig, &out)
		}
	}
}

func TestVariantFlag(t *testing.T) {
	var f variantFlag
	for _, s := range []string{"a=/bin/one", "b=/x=y"} {
		if err := f.Set(s); err != nil {
			t.Fatalf("Set(%q): %v", s, err)
		}
	}
	if len(f) != 2 || f[0].name != "a" || f[0].path != "/bin/one" || f[1].name != "b" || f[1].path != "/x=y" {
		t.Errorf("parsed %+v", f)
	}
	for _, bad := range []string{"", "noequals", "=path", "name="} {
		if err := f.Set(bad); err == nil {
			t.Errorf("Set(%q) took it", bad)
		}
	}
}

// TestWaitHealthyGivesUpOnASilentServer: a process that accepts connections but never
// answers (stopped, or held by a wrapper) does not hold the run once it is cancelled.
func TestWaitHealthyGivesUpOnASilentServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel) // as SIGTERM would
	if err := waitHealthy(ctx, "http://"+ln.Addr().String()+"/healthz"); err == nil {
		t.Fatal("a server that never answers was taken for healthy")
	}
}

// TestHTTPWithoutOpenLoop: --rate 0 measures the closed loop alone, and the table
// says so rather than printing zero latencies.
func TestHTTPWithoutOpenLoop(t *testing.T) {
	out, errOut, code := benchRun(t, "http", "--duration", "100ms", "--rate", "0", "--workers", "2", "--redis=false", "--rounds", "1")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "no latencies (--rate 0)") || strings.Contains(errOut, "open loop") {
		t.Errorf("an open loop ran, or the table does not say it did not:\n%s\n%s", out, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, targetPool) && !strings.Contains(l, " -  ") {
			t.Errorf("latencies printed without an open loop: %q", l)
		}
	}
	if _, errOut, code := benchRun(t, "http", "--rate", "-1"); code != exitUsage {
		t.Errorf("--rate -1: exit %d, %s", code, errOut)
	}
}
