package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

func TestGatewayAndDLQUsage(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nothing-here")
	ticket := strings.Repeat("a", 26)
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"ingress help", []string{"ingress", "-h"}, exitOK, "serve --dispatch=false", ""},
		{"dispatch help", []string{"dispatch", "-h"}, exitOK, "-failover-after", ""},
		{"ingress has no --dispatch", []string{"ingress", "--dispatch=true"}, exitUsage, "", "unknown flag --dispatch"},
		{"dispatch has no --upstream", []string{"dispatch", "--upstream", "http://x"}, exitUsage, "", "-upstream"},
		{"dispatch needs rules", []string{"dispatch"}, exitUsage, "", "--rules is required"},
		{"ingress needs an upstream", []string{"ingress", "--rules", "x.yaml"}, exitUsage, "", "--upstream is required"},
		{"dlq help", []string{"help", "dlq"}, exitOK, "requeue", ""},
		{"dlq without arguments", []string{"dlq"}, exitUsage, "", "want an action"},
		{"dlq without a queue", []string{"dlq", "list"}, exitUsage, "", "want an action"},
		{"dlq unknown action", []string{"dlq", "drop", "orders"}, exitUsage, "", `unknown action "drop": want list, requeue or purge`},
		{"dlq mistyped action", []string{"dlq", "reqeue", "orders"}, exitUsage, "", `unknown action "reqeue" (did you mean "requeue"?)`},
		{"queue mistyped action", []string{"queue", "lsit"}, exitUsage, "", `unknown action "lsit" (did you mean "list"?)`},
		{"dlq bad queue name", []string{"dlq", "list", "or.ders"}, exitUsage, "", "not a queue name"},
		{"dlq bad ticket", []string{"dlq", "requeue", "orders", "nope"}, exitUsage, "", `"nope" is not a ticket`},
		{"purge needs --yes", []string{"dlq", "purge", "orders", ticket}, exitUsage, "", "add --yes"},
		{"dlq bad flag after the queue", []string{"dlq", "list", "orders", "--jsn"}, exitUsage, "", "-jsn"},
		{"dlq on a directory without data", []string{"dlq", "list", "orders", "--data-dir", missing}, exitFailure, "", "no sluice data in --data-dir"},
		{"dlq NATS unreachable", []string{"dlq", "list", "orders", "--nats", "nats://127.0.0.1:1", "--queue-key", testQueueKey}, exitFailure, "", "--nats:"},
		{"dlq --nats needs a queue key", []string{"dlq", "list", "orders", "--nats", "nats://127.0.0.1:1"}, exitUsage, "", "--queue-key (or SLUICE_QUEUE_KEY) is required with --nats"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errb bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errb)
			if code != tc.code {
				t.Errorf("exit %d, want %d\n%s%s", code, tc.code, out.String(), errb.String())
			}
			if !strings.Contains(out.String(), tc.stdout) || (tc.stdout == "" && out.Len() > 0) {
				t.Errorf("stdout %q, want %q", out.String(), tc.stdout)
			}
			if !strings.Contains(errb.String(), tc.stderr) {
				t.Errorf("stderr %q, want %q", errb.String(), tc.stderr)
			}
		})
	}
}
