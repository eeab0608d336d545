package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// Dependencies never touch readiness; /sluice/v1/status shows them, token-gated,
// without secrets, and a check that ignores its context is cut off at the timeout.
func TestAdminStatusAndDrain(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	var redisErr atomic.Pointer[error]
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	deps, err := NewDependencies(WithCheckTimeout(200*time.Millisecond), WithSecrets("hunter2", ""))
	if err != nil {
		t.Fatal(err)
	}
	deps.Add("redis", func(ctx context.Context) DependencyReport {
		if e := redisErr.Load(); e != nil {
			return DependencyReport{State: DependencyDown, Err: *e, Detail: map[string]any{"limiter_fallback": true}}
		}
		return DependencyReport{State: DependencyUp}
	})
	var hang atomic.Bool
	deps.Add("nats", func(ctx context.Context) DependencyReport {
		if hang.Load() {
			<-release // ignores ctx, as a broken client would
		}
		return DependencyReport{State: DependencyUp}
	})
	reg := prometheus.NewRegistry()
	reg.MustRegister(deps)
	a := &Admin{Gatherer: reg, Rules: StaticRules{set}, Token: "tok", Dependencies: deps}
	h := a.Handler()
	get := func(path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	status := func() statusView {
		t.Helper()
		w := get("/sluice/v1/status", "tok")
		if w.Code != 200 {
			t.Fatalf("status: %d %s", w.Code, w.Body)
		}
		if strings.Contains(w.Body.String(), "hunter2") {
			t.Fatalf("status shows a secret: %s", w.Body)
		}
		var v statusView
		if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	fresh := func() { deps.mu.Lock(); deps.lastAt = time.Time{}; deps.mu.Unlock() } // skip the 1s reuse

	if w := get("/sluice/v1/status", ""); w.Code != 401 {
		t.Errorf("status without the token: %d", w.Code)
	}
	v := status()
	if !v.Ready || v.Dependencies["redis"].State != DependencyUp || v.Dependencies["nats"].State != DependencyUp {
		t.Fatalf("all up: %+v", v)
	}
	upSince := v.Dependencies["redis"].Since

	e := errors.New("dial redis://:hunter2@10.0.0.1:6379: connection refused")
	redisErr.Store(&e)
	hang.Store(true)
	fresh()
	v = status()
	r, n := v.Dependencies["redis"], v.Dependencies["nats"]
	if r.State != DependencyDown || !strings.Contains(r.LastError, "REDACTED@10.0.0.1") || r.LastErrorAt == nil || !r.Since.After(upSince) {
		t.Errorf("redis down: %+v", r)
	}
	if d, ok := r.Detail.(map[string]any); !ok || d["limiter_fallback"] != true {
		t.Errorf("redis detail %#v", r.Detail)
	}
	if n.State != DependencyDown || !strings.Contains(n.LastError, "no answer within 200ms") {
		t.Errorf("hung nats check: %+v", n)
	}
	if !v.Ready {
		t.Errorf("dependencies down made status say not ready")
	}
	if w := get("/readyz", "tok"); w.Code != 200 {
		t.Errorf("/readyz with the dependencies down: %d %s, want 200", w.Code, w.Body)
	}
	fresh()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	ups := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_dependency_up" {
			for _, m := range mf.GetMetric() {
				ups[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
			}
		}
	}
	if len(ups) != 2 || ups["redis"] != 0 || ups["nats"] != 0 {
		t.Errorf("sluice_dependency_up %v, want redis and nats at 0", ups)
	}

	redisErr.Store(nil)
	fresh()
	if r := status().Dependencies["redis"]; r.State != DependencyUp || r.LastError == "" {
		t.Errorf("redis back: %+v (the last error stays for the operator)", r)
	}

	a.Drain()
	if w := get("/readyz", "tok"); w.Code != 503 || !strings.Contains(w.Body.String(), "shutting down") {
		t.Errorf("/readyz while draining: %d %s", w.Code, w.Body)
	}
	if v := status(); v.Ready || !v.ShuttingDown {
		t.Errorf("status while draining: %+v", v)
	}
}
