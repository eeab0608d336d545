package telemetry

import (
	"context"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

const parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

func TestTracerOffForNoop(t *testing.T) {
	if Tracer(noop.NewTracerProvider()) != nil {
		t.Error("a noop provider gave a tracer; tracing should be skipped")
	}
	if Tracer(nil) == nil {
		t.Error("the default (global) provider gave no tracer")
	}
}

func TestFormatExtractRoundTrip(t *testing.T) {
	sc := Extract(parent, "vendor=x")
	if !sc.IsValid() || !sc.IsSampled() || sc.TraceState().Get("vendor") != "x" {
		t.Fatalf("Extract = %+v", sc)
	}
	tp, ts := Format(sc)
	if tp != parent || ts != "vendor=x" {
		t.Errorf("Format = %q %q", tp, ts)
	}
	for _, bad := range []string{"", "garbage", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if Extract(bad, "").IsValid() {
			t.Errorf("Extract(%q) is valid", bad)
		}
	}
	if tp, ts := Format(trace.SpanContext{}); tp != "" || ts != "" {
		t.Errorf("Format(invalid) = %q %q", tp, ts)
	}
}

func TestInject(t *testing.T) {
	h := http.Header{"Traceparent": {"client's"}}
	Inject(context.Background(), h)
	if h.Get("Traceparent") != "client's" {
		t.Errorf("no span: header changed to %q", h.Get("Traceparent"))
	}
	ctx := trace.ContextWithSpanContext(context.Background(), Extract(parent, ""))
	Inject(ctx, h)
	if got := h.Values("Traceparent"); len(got) != 1 || got[0] != parent {
		t.Errorf("Traceparent %q, want only %q", got, parent)
	}
}

func TestObserveExemplar(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h", Buckets: []float64{1}})
	Observe(context.Background(), h, 0.5)
	sampled := trace.ContextWithSpanContext(context.Background(), Extract(parent, ""))
	Observe(sampled, h, 0.5)
	unsampled := trace.ContextWithSpanContext(context.Background(),
		Extract("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", ""))
	Observe(unsampled, h, 2)
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	hist := mfs[0].GetMetric()[0].GetHistogram()
	if hist.GetSampleCount() != 3 {
		t.Fatalf("%d observations, want 3", hist.GetSampleCount())
	}
	var ids []string
	for _, b := range hist.GetBucket() {
		for _, l := range b.GetExemplar().GetLabel() {
			ids = append(ids, l.GetName()+"="+l.GetValue())
		}
	}
	if len(ids) != 1 || ids[0] != "trace_id=4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Errorf("exemplars %v, want the sampled span's trace only", ids)
	}
}

// FuzzExtract: any traceparent and tracestate extract without panicking, and what
// extracts as valid formats back to an equal span context.
func FuzzExtract(f *testing.F) {
	f.Add(parent, "vendor=x")
	f.Add("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "")
	f.Add("ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "a=1,b=2")
	f.Add("", "")
	f.Fuzz(func(t *testing.T, tp, ts string) {
		sc := Extract(tp, ts)
		if !sc.IsValid() {
			return
		}
		tp2, ts2 := Format(sc)
		if again := Extract(tp2, ts2); !again.Equal(sc) {
			t.Errorf("%q %q: round trip %v != %v", tp, ts, again, sc)
		}
	})
}
