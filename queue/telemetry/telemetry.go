// Package telemetry holds what sluice's libraries share for OpenTelemetry tracing on
// the otel API alone (no SDK): resolving the tracer of a TracerProvider option, the W3C
// trace-context format, and Prometheus exemplars that name the trace of a sampled span.
// The front door starts a request's trace; queue and dispatcher use the same helpers to
// carry its context across the wait, which is why there is one package and not a copy
// in each.
//
// It lives under queue because the trace crosses the wait inside a parked order: queue
// carries the context, and its folder is the lowest of the three users' (ingress and
// dispatcher sit above queue, queue imports neither), so each imports it downwards, as
// TestImportDirection in ingress pins. It links the otel API and client_golang alone,
// none of queue's NATS code: ingress, which must not link NATS, may import it.
package telemetry

import (
	"context"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of sluice's tracers.
const Scope = "github.com/sluicehq/sluice"

// Tracer returns the tracer of tp (nil: otel.GetTracerProvider(), the global provider,
// which does nothing until a program sets one), or nil when tp is a noop.TracerProvider:
// callers then skip tracing altogether, so that a program that turned tracing off pays
// nothing, not even the context a no-op span is carried in.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	switch tp.(type) {
	case noop.TracerProvider, *noop.TracerProvider:
		return nil
	}
	return tp.Tracer(Scope)
}

// TraceContext is the W3C trace-context format (traceparent and tracestate) in which
// sluice reads incoming requests' context, keeps it with parked orders and passes it
// to downstreams. It is fixed rather than the global propagator: it is part of what
// sluice stores, not a matter of the program's choice.
var TraceContext propagation.TextMapPropagator = propagation.TraceContext{}

// Inject writes the span context of ctx into h as traceparent (and tracestate); it
// leaves h alone when ctx holds no valid span context.
func Inject(ctx context.Context, h http.Header) {
	if !trace.SpanContextFromContext(ctx).IsValid() {
		return
	}
	h.Del("Traceparent")
	h.Del("Tracestate")
	TraceContext.Inject(ctx, propagation.HeaderCarrier(h))
}

// Extract returns the span context that traceparent and tracestate describe (invalid
// when traceparent is empty or malformed).
func Extract(traceparent, tracestate string) trace.SpanContext {
	if traceparent == "" {
		return trace.SpanContext{}
	}
	c := propagation.MapCarrier{"traceparent": traceparent}
	if tracestate != "" {
		c["tracestate"] = tracestate
	}
	return trace.SpanContextFromContext(TraceContext.Extract(context.Background(), c))
}

// Format returns sc as a traceparent and a tracestate value ("" when sc is invalid).
func Format(sc trace.SpanContext) (traceparent, tracestate string) {
	if !sc.IsValid() {
		return "", ""
	}
	c := propagation.MapCarrier{}
	TraceContext.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
	return c["traceparent"], c["tracestate"]
}

// Observe records v on o, with an exemplar naming the trace (trace_id) when ctx holds a
// sampled span and o keeps exemplars; otherwise as a plain observation, allocating
// nothing more.
func Observe(ctx context.Context, o prometheus.Observer, v float64) {
	sc := trace.SpanContextFromContext(ctx)
	if sc.IsSampled() {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String()})
			return
		}
	}
	o.Observe(v)
}
