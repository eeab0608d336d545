package ingress

import (
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Two middlewares (and two proxies) on one registry share its series: no panic, and
// every decision is counted once in the one series.
func TestTwoInstancesOneRegistry(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	a := mustNew(t, StaticRules{set}, limiter.NewMemory(), WithRegisterer(reg))
	b := mustNew(t, StaticRules{set}, limiter.NewMemory(), WithRegisterer(reg))
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, m := range []*Middleware{a, b, b} {
		r := httptest.NewRequest("GET", "/v1/search", nil)
		m.Wrap(ok).ServeHTTP(httptest.NewRecorder(), r)
	}
	if got := decisiontest.Count(t, reg, "search", decide.OutcomeAllowed); got != 2 {
		// a allows once, b allows once and then shadow-rejects (search is shadow, 1/min)
		t.Errorf("allowed = %v, want 2 (both middlewares count into one series)", got)
	}
	if got := decisiontest.Count(t, reg, "search", decide.OutcomeShadowDenied); got != 1 {
		t.Errorf("shadow_rejected = %v, want 1", got)
	}
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	for i := range 2 {
		if _, err := NewProxy(up, WithProxyRegisterer(reg)); err != nil {
			t.Fatalf("proxy %d on a shared registry: %v", i+1, err)
		}
	}
	if _, err := decide.NewMetrics(reg); err != nil {
		t.Errorf("decide.NewMetrics on a registry the middlewares use: %v", err)
	}
}

// A registry that holds other series under sluice's names is an error, never a panic.
func TestRegistryClash(t *testing.T) {
	clash := func(name string, labels ...string) *prometheus.Registry {
		reg := prometheus.NewRegistry()
		reg.MustRegister(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: "not sluice's"}, labels))
		return reg
	}
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(StaticRules{set}, limiter.NewMemory(), WithRegisterer(clash("sluice_decisions_total", "rule", "outcome"))); err == nil {
		t.Error("New on a registry with a clashing sluice_decisions_total succeeded")
	}
	if _, err := decide.NewMetrics(clash("sluice_decision_duration_seconds")); err == nil {
		t.Error("decide.NewMetrics on a clashing registry succeeded")
	}
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	if _, err := NewProxy(up, WithProxyRegisterer(clash("sluice_upstream_requests_total", "class"))); err == nil {
		t.Error("NewProxy on a clashing registry succeeded")
	}
}

// Bad option values are errors from the constructor: never a panic later, never a
// silent default.
func TestBadOptions(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	src, lim := StaticRules{set}, limiter.NewMemory()
	up := &url.URL{Scheme: "http", Host: "127.0.0.1:1"}
	tests := []struct {
		name string
		make func() error
		want string
	}{
		{"no rules", func() error { _, err := New(nil, lim); return err }, "rules source"},
		{"no limiter", func() error { _, err := New(src, nil); return err }, "limiter"},
		{"nil logger", func() error { _, err := New(src, lim, WithLogger(nil)); return err }, "WithLogger(nil)"},
		{"nil identity", func() error { _, err := New(src, lim, WithClientIdentity(nil)); return err }, "WithClientIdentity(nil)"},
		{"proxy nil upstream", func() error { _, err := NewProxy(nil); return err }, "absolute URL"},
		{"proxy relative upstream", func() error { _, err := NewProxy(&url.URL{Path: "/x"}); return err }, "absolute URL"},
		{"proxy nil logger", func() error { _, err := NewProxy(up, WithProxyLogger(nil)); return err }, "WithProxyLogger(nil)"},
		{"proxy zero head limit", func() error { _, err := NewProxy(up, WithProxyMaxHeaderBytes(0)); return err }, "WithProxyMaxHeaderBytes(0)"},
		{"proxy negative reuse delay", func() error { _, err := NewProxy(up, WithProxyReuseAfter(-time.Second)); return err }, "WithReuseAfter(-1s)"},
		{"zero check timeout", func() error { _, err := NewDependencies(WithCheckTimeout(0)); return err }, "must be positive"},
		{"negative check timeout", func() error { _, err := NewDependencies(WithCheckTimeout(-time.Second)); return err }, "must be positive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.make()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one that says %q", err, tt.want)
			}
		})
	}
}
