package ingress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

const benchRules = `
domain: bench
descriptors:
  - key: route
    value: orders
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1000000000, name: orders_per_user}
routes:
  - name: orders
    match: {method: [POST], path_prefix: /v1/orders}
    descriptors:
      - [{key: route, value: orders}, {key: user, from: "header:X-User-ID"}]
`

// discardWriter is a ResponseWriter that keeps nothing but a header map it reuses.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}

// benchMiddleware measures one allowed request through the middleware on the memory
// store (one rule, one limit), with opts.
func benchMiddleware(b *testing.B, opts ...Option) {
	set, err := rules.Parse(rules.File{Name: "bench.yaml", Data: []byte(benchRules)})
	if err != nil {
		b.Fatal(err)
	}
	m := mustNew(b, StaticRules{set}, limiter.NewMemory(), opts...)
	h := m.Wrap(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := httptest.NewRequest("POST", "/v1/orders", http.NoBody)
	r.Header.Set("X-User-ID", "alice")
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		h.ServeHTTP(w, r)
		clear(w.h)
	}
}

// BenchmarkMiddleware: the default tracer provider (the global one, none set).
func BenchmarkMiddleware(b *testing.B) { benchMiddleware(b) }

// BenchmarkMiddlewareNoopTracer: tracing turned off with a noop.TracerProvider.
func BenchmarkMiddlewareNoopTracer(b *testing.B) {
	benchMiddleware(b, WithTracerProvider(noop.NewTracerProvider()))
}

// BenchmarkMiddlewareSampled: every decision recorded by the SDK (spans dropped by a
// processor that keeps nothing), for the cost of tracing on.
func BenchmarkMiddlewareSampled(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchMiddleware(b, WithTracerProvider(tp))
}
