// Package telemetrytest helps tests look at what sluice's telemetry recorded.
package telemetrytest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// ExemplarTraceIDs returns the trace_id labels of the exemplars of the histogram
// family name in reg, bucket by bucket.
func ExemplarTraceIDs(t testing.TB, reg prometheus.Gatherer, name string) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, b := range m.GetHistogram().GetBucket() {
				for _, l := range b.GetExemplar().GetLabel() {
					if l.GetName() == "trace_id" {
						ids = append(ids, l.GetValue())
					}
				}
			}
		}
	}
	return ids
}
