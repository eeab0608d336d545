package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// serve with a NATS that never answers keeps retrying the declaration in the
// background, logs the wait once, and on shutdown stops the retrying and the
// connection attempts: no goroutine outlives it.
func TestServeRetriesNATSAndStopsCleanly(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	rulesPath := writeRules(t, t.TempDir(), clusterRules("http://127.0.0.1:1"))
	out := &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	code := make(chan int, 1)
	go func() {
		code <- run(ctx, []string{"serve", "--rules", rulesPath, "--upstream", "http://127.0.0.1:1",
			"--listen", "127.0.0.1:0", "--admin-listen", "", "--log-level", "debug",
			"--nats", "nats://" + freeAddr(t), "--data-dir", t.TempDir()}, out, out)
	}()
	deadline := time.Now().Add(60 * time.Second)
	for strings.Count(out.String(), "queues still not declared") < 2 {
		select {
		case c := <-code:
			t.Fatalf("serve exited (%d) with NATS unreachable:\n%s", c, out)
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
	cancel()
	select {
	case c := <-code:
		if c != exitOK {
			t.Errorf("exit %d after shutdown, want 0:\n%s", c, out)
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("serve did not stop:\n%s", out)
	}
}
