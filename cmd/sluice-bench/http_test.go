package main

import (
	"context"
	"os"
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
	out, errOut, code := benchRun(t, "http", "--duration", "150ms", "--rate", "200", "--workers", "4", "--redis=false")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, target := range []string{"upstream alone", "httputil.ReverseProxy", "sluice serve (memory)"} {
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
	if !strings.Contains(errOut, "[3/3]") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}
