// Package decisiontest reads, for the tests of ingress's packages, the decisions that
// the decision engine (ingress/decide) counted in sluice_decisions_total{rule,outcome},
// and gives their benchmarks the rules sluice serve is measured on.
package decisiontest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/rules"
)

// ServeBenchRules are the rules sluice-bench's http mode runs sluice serve on (its
// benchRules, in a module of its own): a token bucket per client address that never
// runs out, so that every request pays for a real decision and passes.
const ServeBenchRules = `domain: bench
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000000, name: per_ip}
    algorithm: token_bucket
routes:
  - name: everything
    descriptors:
      - [{key: client_ip, from: client_ip}]
`

// ServeBenchSet returns ServeBenchRules compiled; t fails at once if they do not.
func ServeBenchSet(t testing.TB) *rules.Set {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "bench.yaml", Data: []byte(ServeBenchRules)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// Counted returns the series of sluice_decisions_total that g gathers, by rule and
// outcome, those at 0 left out. t fails at once when g cannot gather.
func Counted(t testing.TB, g prometheus.Gatherer) map[string]map[string]float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			var rule, outcome string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					rule = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if v := m.GetCounter().GetValue(); v != 0 {
				if got[rule] == nil {
					got[rule] = map[string]float64{}
				}
				got[rule][outcome] = v
			}
		}
	}
	return got
}

// Count returns sluice_decisions_total{rule,outcome} on g: 0 when g has no such
// series, as nothing was counted in it.
func Count(t testing.TB, g prometheus.Gatherer, rule, outcome string) float64 {
	t.Helper()
	return Counted(t, g)[rule][outcome]
}
