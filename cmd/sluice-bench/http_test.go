package main

import (
	"context"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
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
	targets := []string{targetUpstream, targetReverseProxy, "sluice serve (memory)"}
	if _, err := exec.LookPath("nginx"); err == nil {
		targets = append(targets, targetNginx)
	} else if !strings.Contains(errOut, "nginx is not on PATH") {
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
