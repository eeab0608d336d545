package main

import (
	"encoding/json"
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

// TestClusterJSON: the report as one JSON document, with the parameters of the run.
func TestClusterJSON(t *testing.T) {
	if testing.Short() {
		t.Skip("builds sluice and nats-server and runs 3 NATS nodes, Redis and 1 sluice replica as processes")
	}
	redistest.Require(t)
	out, errOut, code := benchRun(t, "cluster", "--duration", "1s", "--rate", "40", "--users", "2", "--replicas", "1",
		"--drain-timeout", "60s", "--json")
	if code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	var doc struct {
		Mode     string  `json:"mode"`
		Duration string  `json:"duration"`
		Rate     int     `json:"rate"`
		Replicas int     `json:"replicas"`
		Outflow  string  `json:"outflow"`
		Drain    float64 `json:"drain_seconds"`
		Report   *struct {
			Sent      int64    `json:"sent"`
			Deferred  int64    `json:"deferred"`
			Delivered int      `json:"delivered"`
			Lost      *int     `json:"lost"`
			Drained   bool     `json:"drained"`
			Bound     int      `json:"bound_in_1s"`
			Events    []string `json:"events"`
		} `json:"report"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "cluster" || doc.Duration != "1s" || doc.Rate != 40 || doc.Replicas != 1 || doc.Outflow == "" || doc.Drain < 0 {
		t.Errorf("parameters: %s", out)
	}
	r := doc.Report
	if r == nil || r.Sent < 1 || r.Lost == nil || *r.Lost != 0 || !r.Drained || int64(r.Delivered) != r.Deferred || r.Bound < 2 || r.Events == nil {
		t.Errorf("report: %s", out)
	}
}
