package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/redistest"
)

// statusJSON is the JSON of GET /sluice/v1/status.
type statusJSON struct {
	Ready        bool `json:"ready"`
	Dependencies map[string]struct {
		State     string         `json:"state"`
		Since     time.Time      `json:"since"`
		LastError string         `json:"last_error"`
		Detail    map[string]any `json:"detail"`
	} `json:"dependencies"`
}

func getStatusJSON(t *testing.T, p *sluiceProcess, token string) (statusJSON, time.Duration) {
	t.Helper()
	started := time.Now()
	r := send(t, "GET", p.admin+"/sluice/v1/status", nil, "Authorization", "Bearer "+token)
	took := time.Since(started)
	if r.status != 200 {
		t.Fatalf("status: %d %s", r.status, r.body)
	}
	var s statusJSON
	if err := json.Unmarshal([]byte(r.body), &s); err != nil {
		t.Fatalf("status body %q: %v", r.body, err)
	}
	return s, took
}

// A hung Redis (SIGSTOP: connections accepted, nothing answered) is a dependency
// down, not a replica unready: /readyz stays 200, /sluice/v1/status says redis down
// (each check bounded by its timeout), the metrics say so, and the front door keeps
// answering under failure_mode local.
func TestStatusWithRedisHung(t *testing.T) {
	if testing.Short() {
		t.Skip("runs redis-server and sluice as processes")
	}
	const token = "admin-secret-token"
	rs := redistest.Start(t)
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(1000))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", "redis://:redis-pass-xyz@"+rs.Addr()+"/0",
		"--admin-token", token)
	if err := rs.Client().ConfigSet(t.Context(), "requirepass", "redis-pass-xyz").Err(); err != nil {
		t.Fatal(err)
	}
	if r := send(t, "GET", p.admin+"/sluice/v1/status", nil); r.status != http.StatusUnauthorized {
		t.Fatalf("status without the admin token: %d", r.status)
	}
	if r := send(t, "GET", p.admin+"/sluice/v1/status", nil, "Authorization", "Bearer wrong"); r.status != http.StatusUnauthorized {
		t.Fatalf("status with a wrong token: %d", r.status)
	}
	waitFor(t, "redis and nats up", 30*time.Second, func() bool {
		s, _ := getStatusJSON(t, p, token)
		return s.Ready && s.Dependencies["redis"].State == "up" && s.Dependencies["nats"].State == "up"
	})
	if r := send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", "alice"); r.status != 200 {
		t.Fatalf("order with Redis up: %d %s", r.status, r.body)
	}

	if err := rs.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rs.Resume() }) // so that it can be killed
	paused := time.Now()
	var slowest time.Duration
	var down statusJSON
	waitFor(t, "status to say redis down", 60*time.Second, func() bool {
		s, took := getStatusJSON(t, p, token)
		slowest = max(slowest, took)
		down = s
		return s.Dependencies["redis"].State == "down"
	})
	t.Logf("redis down in the status %s after SIGSTOP; slowest status call %s (check timeout %s)",
		time.Since(paused).Round(time.Millisecond), slowest.Round(time.Millisecond), dependencyTimeout)
	red := down.Dependencies["redis"]
	if red.LastError == "" || strings.Contains(red.LastError, "redis-pass-xyz") {
		t.Errorf("redis last_error %q: want the cause, never the password", red.LastError)
	}
	if modes, _ := red.Detail["failure_modes"].(map[string]any); modes["local"] == nil || red.Detail["limiter_fallback"] == nil {
		t.Errorf("redis detail %v: want the failure modes in force", red.Detail)
	}
	if !down.Ready || down.Dependencies["nats"].State != "up" {
		t.Errorf("status with Redis hung: %+v", down)
	}
	for i := range 3 {
		r := send(t, "GET", p.admin+"/readyz", nil, "Authorization", "Bearer "+token)
		if r.status != 200 {
			t.Fatalf("/readyz %d with Redis hung: %d %s, want 200", i, r.status, r.body)
		}
		// failure_mode local: decided in memory, proxied.
		if r := send(t, "POST", p.url+"/v1/orders", nil, "X-User-ID", "bob"); r.status != 200 || r.header.Get("X-Upstream") != "yes" {
			t.Fatalf("order with Redis hung: %d %s", r.status, r.body)
		}
	}
	m := send(t, "GET", p.admin+"/metrics", nil, "Authorization", "Bearer "+token).body
	if !strings.Contains(m, `sluice_dependency_up{dependency="redis"} 0`) || !strings.Contains(m, `sluice_dependency_up{dependency="nats"} 1`) {
		t.Errorf("metrics with Redis hung lack sluice_dependency_up redis 0 / nats 1")
	}

	if err := rs.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "redis up again", 60*time.Second, func() bool {
		s, _ := getStatusJSON(t, p, token)
		return s.Dependencies["redis"].State == "up"
	})
	if strings.Contains(p.output.String(), "redis-pass-xyz") {
		t.Errorf("the log shows the Redis password")
	}
}
