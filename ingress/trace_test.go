package ingress

import (
	"context"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/queue/telemetry/telemetrytest"
)

// newTracing returns a provider that records every span into the returned exporter.
func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func attrs(s tracetest.SpanStub) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value.String()
	}
	return out
}

// TestDecisionSpan: a decided request gets a span that continues the client's
// traceparent, names the rule and outcome and nothing of the client; the decision
// histogram carries the trace as an exemplar.
func TestDecisionSpan(t *testing.T) {
	tp, exp := newTracing(t)
	f := newFixture(t, WithTracerProvider(tp))
	const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	for range 4 {
		f.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "alice", "Traceparent", parent)
	}
	f.do("GET", "/v1/unmatched", "198.51.100.1:1000") // no rule applies: no span
	spans := exp.GetSpans()
	if len(spans) != 4 {
		t.Fatalf("%d spans, want 4 (one per decided request)", len(spans))
	}
	for i, s := range spans {
		if s.Name != "sluice.decide" {
			t.Errorf("span %d named %q", i, s.Name)
		}
		if got := s.SpanContext.TraceID().String(); got != "4bf92f3577b34da6a3ce929d0e0e4736" {
			t.Errorf("span %d in trace %s, want the client's", i, got)
		}
		if got := s.Parent.SpanID().String(); got != "00f067aa0ba902b7" {
			t.Errorf("span %d has parent %s, want the client's span", i, got)
		}
		a := attrs(s)
		wantOutcome := decide.OutcomeAllowed
		if i == 3 {
			wantOutcome = decide.OutcomeRejected
		}
		if a["sluice.outcome"] != wantOutcome || a["sluice.rule"] != "orders_per_user" || a["sluice.route"] != "orders" {
			t.Errorf("span %d attributes %v, want outcome %s of rule orders_per_user on route orders", i, a, wantOutcome)
		}
		for k, v := range a {
			if v == "alice" || v == "198.51.100.1" {
				t.Errorf("span %d attribute %s holds the client's %q", i, k, v)
			}
		}
	}
	ids := telemetrytest.ExemplarTraceIDs(t, f.reg, "sluice_decision_duration_seconds")
	if len(ids) == 0 || ids[0] != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("decision histogram exemplars %v, want the request's trace", ids)
	}
}

// TestDecisionSpanRoot: without a traceparent the decision span starts a trace; an
// unsampled traceparent is respected (nothing recorded, no exemplar).
func TestDecisionSpanRoot(t *testing.T) {
	tp, exp := newTracing(t)
	f := newFixture(t, WithTracerProvider(tp))
	f.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "bob")
	spans := exp.GetSpans()
	if len(spans) != 1 || spans[0].Parent.IsValid() || !spans[0].SpanContext.IsValid() {
		t.Fatalf("spans %+v, want one root span", spans)
	}

	tp2 := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	t.Cleanup(func() { _ = tp2.Shutdown(context.Background()) })
	exp.Reset()
	g := newFixture(t, WithTracerProvider(tp2))
	g.do("POST", "/v1/orders", "198.51.100.1:1000", "X-User-ID", "bob",
		"Traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")
	if n := len(exp.GetSpans()); n != 0 {
		t.Errorf("%d spans recorded under an unsampled parent", n)
	}
	if ids := telemetrytest.ExemplarTraceIDs(t, g.reg, "sluice_decision_duration_seconds"); len(ids) != 0 {
		t.Errorf("exemplars %v without a sampled span", ids)
	}
}
