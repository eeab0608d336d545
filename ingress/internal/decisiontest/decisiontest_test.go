package decisiontest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_decisions_total"}, []string{"rule", "outcome"})
	other := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "other_total"}, []string{"rule", "outcome"})
	reg.MustRegister(decisions, other)
	decisions.WithLabelValues("a", "allowed").Add(3)
	decisions.WithLabelValues("a", "rejected").Add(1)
	decisions.WithLabelValues("b", "allowed") // a series at 0
	other.WithLabelValues("a", "allowed").Add(7)

	got := Counted(t, reg)
	if len(got) != 1 || len(got["a"]) != 2 || got["a"]["allowed"] != 3 || got["a"]["rejected"] != 1 {
		t.Fatalf("Counted = %v, want map[a:map[allowed:3 rejected:1]]", got)
	}
	for _, c := range []struct {
		rule, outcome string
		want          float64
	}{{"a", "allowed", 3}, {"a", "rejected", 1}, {"b", "allowed", 0}, {"c", "allowed", 0}} {
		if n := Count(t, reg, c.rule, c.outcome); n != c.want {
			t.Errorf("Count(%s, %s) = %v, want %v", c.rule, c.outcome, n, c.want)
		}
	}
}
