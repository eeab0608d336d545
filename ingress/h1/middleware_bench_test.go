package h1

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkServeDecided is one request through the fast path and the rules
// middleware, as sluice serve runs them on sluice-bench's rules (memory store, no
// tracing), to a handler answering 204: what deciding adds to a request on the fast
// path, its rate-limit fields written included, without the proxy and its system
// calls. Compare with BenchmarkServeUndecided, the same without the middleware.
func BenchmarkServeDecided(b *testing.B) {
	mw, err := ingress.New(ingress.StaticRules{S: decisiontest.ServeBenchSet(b)}, limiter.NewMemory(),
		ingress.WithRegisterer(prometheus.NewRegistry()), ingress.WithTracerProvider(noop.NewTracerProvider()))
	if err != nil {
		b.Fatal(err)
	}
	benchServe(b, mw.Wrap(noContent()))
}

// BenchmarkServeUndecided is BenchmarkServeDecided's request without the middleware.
func BenchmarkServeUndecided(b *testing.B) { benchServe(b, noContent()) }

func noContent() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
}
