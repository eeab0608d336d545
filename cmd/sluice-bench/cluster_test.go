package main

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/redistest"
)

// A tiny run of the clustered shape with a Redis outage: the report has every row,
// nothing is lost, and progress goes to stderr. No figure is asserted.
func TestClusterReport(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice and nats-server and runs 3 NATS nodes, Redis and 2 sluice replicas as processes")
	}
	redistest.Require(t)
	out, errOut, code := benchRun(t, "cluster", "--duration", "1500ms", "--rate", "60", "--users", "2",
		"--stop-redis-at", "500ms", "--redis-down-for", "500ms", "--drain-timeout", "60s")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	t.Logf("\n%s", out)
	rows := map[string]string{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) >= 2 {
			rows[f[0]] = f[1]
		}
	}
	for _, name := range []string{"sent", "accepted", "rejected", "deferred", "delivered", "lost", "duplicates", "outflow", "max/1s", "drain"} {
		if _, ok := rows[name]; !ok {
			t.Errorf("no %s row in\n%s", name, out)
		}
	}
	if rows["lost"] != "0" || rows["errors"] != "0" || rows["deferred"] == "0" || rows["delivered"] != rows["deferred"] {
		t.Errorf("deferred %s, delivered %s, lost %s, errors %s", rows["deferred"], rows["delivered"], rows["lost"], rows["errors"])
	}
	if !strings.Contains(out, "Redis stopped") || !strings.Contains(out, "Redis restarted") {
		t.Errorf("the fault is not reported:\n%s", out)
	}
	if !strings.Contains(errOut, "elapsed") || !strings.Contains(errOut, "delivered") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}
