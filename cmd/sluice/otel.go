package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// tracingShutdownTimeout bounds the flush of the spans still buffered at exit.
const tracingShutdownTimeout = 5 * time.Second

// tracing is the tracer provider of a sluice process and how to flush it at exit.
type tracing struct {
	provider trace.TracerProvider
	// shutdown flushes and stops the exporter (nothing to do when tracing is off).
	shutdown func(context.Context) error
}

// newTracing builds the tracer provider that the standard OpenTelemetry environment
// variables describe (getenv reads them; the exporter reads its own, the endpoint,
// headers, timeout and TLS settings, from the process environment):
//
//   - OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER=none: tracing off.
//   - OTEL_TRACES_EXPORTER=otlp, or unset while OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set: spans are exported by OTLP, over
//     HTTP/protobuf unless OTEL_EXPORTER_OTLP_TRACES_PROTOCOL (or
//     OTEL_EXPORTER_OTLP_PROTOCOL) says grpc.
//   - neither: tracing off.
//
// Tracing off is noop.TracerProvider, which the libraries recognise and skip: no span,
// no allocation per request. The SDK itself reads OTEL_TRACES_SAMPLER(_ARG) and
// OTEL_BSP_*; OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override the resource
// (service.name "sluice", service.version). Other exporters and protocols (console,
// zipkin, http/json) are refused with an error.
func newTracing(ctx context.Context, getenv func(string) string, log *slog.Logger) (*tracing, error) {
	off := &tracing{provider: noop.NewTracerProvider(), shutdown: func(context.Context) error { return nil }}
	if disabled, _ := strconv.ParseBool(strings.TrimSpace(getenv("OTEL_SDK_DISABLED"))); disabled {
		return off, nil
	}
	switch exp := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return off, nil
	case "":
		if getenv("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
			return off, nil
		}
	case "otlp":
	default:
		return nil, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: sluice exports traces by otlp only (or none)", exp)
	}
	protocol := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"))
	if protocol == "" {
		protocol = strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_PROTOCOL"))
	}
	var client otlptrace.Client
	switch protocol {
	case "", "http/protobuf":
		client = otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: sluice speaks http/protobuf or grpc", protocol)
	}
	// New only builds the exporter: it connects lazily, so an unreachable collector
	// costs dropped spans (reported through otel's error handler), never the start.
	exporter, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, fmt.Errorf("OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "sluice"), attribute.String("service.version", buildVersion())),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(), // last: OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES win
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exporter), sdktrace.WithResource(res))
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
	if protocol == "" {
		protocol = "http/protobuf"
	}
	log.Info("tracing: exporting spans by OTLP", "protocol", protocol)
	return &tracing{provider: tp, shutdown: tp.Shutdown}, nil
}

// close flushes the spans still buffered, within tracingShutdownTimeout.
func (t *tracing) close(log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownTimeout)
	defer cancel()
	if err := t.shutdown(ctx); err != nil {
		log.Warn("tracing: flushing spans at exit", "err", err)
	}
}
