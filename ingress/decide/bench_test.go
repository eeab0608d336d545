package decide

import (
	"context"
	"net/http"
	"net/netip"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkDecideFields is what the front door asks of an engine for one request
// within its limits on sluice-bench's rules (a token bucket per client address that
// never runs out, the memory store): Decide, then the fields of its verdict.
func BenchmarkDecideFields(b *testing.B) {
	set := decisiontest.ServeBenchSet(b)
	r, _ := http.NewRequest("GET", "/", nil)
	_, checks := set.Match(r, netip.MustParseAddr("192.0.2.1"), nil)
	e, err := New(limiter.NewMemory(), WithRegisterer(prometheus.NewRegistry()))
	if err != nil {
		b.Fatal(err)
	}
	e.Use(set)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		v := e.Decide(ctx, &Request{Checks: checks, Hold: true, RejectOnly: true})
		if f := v.Fields(); f.Remaining == "" {
			b.Fatal("no fields")
		}
	}
}
