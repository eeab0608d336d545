package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// serve, ingress and dispatch with a NATS that never answers keep retrying the
// declaration in the background, log the wait once, and on shutdown stop the retrying
// and the connection attempts: no goroutine outlives them.
func TestGatewayRetriesNATSAndStopsCleanly(t *testing.T) {
	rulesPath := writeRules(t, t.TempDir(), clusterRules("http://127.0.0.1:1"))
	front := []string{"--upstream", "http://127.0.0.1:1", "--listen", "127.0.0.1:0"}
	for _, tc := range []struct {
		command string
		args    []string
	}{
		{"serve", front},
		{"ingress", front},
		{"dispatch", nil},
	} {
		t.Run(tc.command, func(t *testing.T) {
			defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
			out := &syncBuffer{}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			args := append(slices.Clone(tc.args), tc.command, "--rules", rulesPath, "--admin-listen", "", "--log-level", "debug",
				"--nats", "nats://"+freeAddr(t), "--queue-key", testQueueKey, "--data-dir", t.TempDir())
			args = append(args[len(tc.args):], tc.args...) // the command first
			code := make(chan int, 1)
			go func() { code <- run(ctx, args, out, out) }()
			deadline := time.Now().Add(60 * time.Second)
			for strings.Count(out.String(), "queues still not declared") < 2 {
				select {
				case c := <-code:
					t.Fatalf("%s exited (%d) with NATS unreachable:\n%s", tc.command, c, out)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no retries after 60s:\n%s", out)
				}
				time.Sleep(20 * time.Millisecond)
			}
			if n := strings.Count(out.String(), "queues not declared yet"); n != 1 {
				t.Errorf("the wait logged %d times at warn level, want once:\n%s", n, out)
			}
			if !strings.Contains(out.String(), "connection refused") {
				t.Errorf("the log does not say why NATS is not connected:\n%s", out)
			}
			cancel()
			select {
			case c := <-code:
				if c != exitOK {
					t.Errorf("exit %d after shutdown, want 0:\n%s", c, out)
				}
			case <-time.After(60 * time.Second):
				t.Fatalf("%s did not stop:\n%s", tc.command, out)
			}
		})
	}
}

// Passwords in --nats and --redis URLs and --redis-password never reach a status or
// the queues' description in the logs.
func TestSecretsOfTheFlags(t *testing.T) {
	var cfg gatewayConfig
	cfg.nats.url = "nats://app:n4ts-pw@10.0.0.1:4222, nats://10.0.0.2:4222"
	cfg.front.redis.url = "redis://:r3dis-pw@10.0.0.3:6379/0"
	cfg.front.redis.password = "flag-pw"
	got := cfg.secrets()
	for _, want := range []string{"n4ts-pw", "r3dis-pw", "flag-pw"} {
		if !slices.Contains(got, want) {
			t.Errorf("secrets %q lack %q", got, want)
		}
	}
	if where := redactURLs(cfg.nats.url); strings.Contains(where, "n4ts-pw") || !strings.Contains(where, "10.0.0.2:4222") {
		t.Errorf("redactURLs: %q", where)
	}
}
