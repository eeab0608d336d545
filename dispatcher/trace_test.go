package dispatcher_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/telemetry/telemetrytest"
)

func newTracing(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func spanNamed(exp *tracetest.InMemoryExporter, name string) (tracetest.SpanStub, bool) {
	for _, s := range exp.GetSpans() {
		if s.Name == name {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

func spanAttrs(s tracetest.SpanStub) map[attribute.Key]string {
	out := map[attribute.Key]string{}
	for _, kv := range s.Attributes {
		out[kv.Key] = kv.Value.String()
	}
	return out
}

// parkTraced parks one order under a request span of tp (what the front door's
// decision span is) and returns the ticket and the request span's context.
func parkTraced(t *testing.T, tp trace.TracerProvider, store *queue.Store, queueName string) (string, trace.SpanContext) {
	t.Helper()
	ctx, span := tp.Tracer("test").Start(ctxT(t), "request")
	req := orderReq(queueName, 1)
	// The client's own traceparent, kept with the order, gives way to the delivery's.
	req.Header.Set("Traceparent", "00-11111111111111111111111111111111-2222222222222222-01")
	rc, err := store.Park(ctx, req)
	span.End()
	if err != nil {
		t.Fatal(err)
	}
	return rc.Ticket, span.SpanContext()
}

// TestDeliverySpanLinksToThePark: park and delivery through real NATS: the delivery
// span starts a trace of its own linked to the park's span (in the request's trace),
// the downstream receives the delivery's traceparent, and the delivery histogram
// carries the delivery's trace as an exemplar.
func TestDeliverySpanLinksToThePark(t *testing.T) {
	srv := natstest.Start(t)
	tp, exp := newTracing(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("traced", ds.URL)
	store, err := queue.Open(ctxT(t), srv.Connect(t), queue.WithSigningKey(natstest.SigningKey()), queue.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	ticket, reqSC := parkTraced(t, tp, store, "traced")

	reg := prometheus.NewRegistry()
	startReplica(t, srv, cfg, "a", dispatcher.WithTracerProvider(tp), dispatcher.WithRegisterer(reg))
	waitFor(t, "the delivery span", 20*time.Second, func() bool { _, ok := spanNamed(exp, "sluice.deliver"); return ok })

	parkSpan, ok := spanNamed(exp, "sluice.park")
	if !ok {
		t.Fatal("no park span")
	}
	if parkSpan.Parent.SpanID() != reqSC.SpanID() || parkSpan.SpanContext.TraceID() != reqSC.TraceID() {
		t.Errorf("park span's parent %v, want the request span %v", parkSpan.Parent, reqSC)
	}
	if a := spanAttrs(parkSpan); a["sluice.queue"] != "traced" || a["sluice.ticket"] != ticket {
		t.Errorf("park span attributes %v", a)
	}

	del, _ := spanNamed(exp, "sluice.deliver")
	if del.Parent.IsValid() {
		t.Errorf("delivery span has parent %v; want a root linked to the park", del.Parent)
	}
	if del.SpanContext.TraceID() == reqSC.TraceID() {
		t.Error("the delivery span is in the request's trace; want a trace of its own")
	}
	if len(del.Links) != 1 || del.Links[0].SpanContext.SpanID() != parkSpan.SpanContext.SpanID() {
		t.Fatalf("delivery span links %+v, want one to the park span %v", del.Links, parkSpan.SpanContext)
	}
	if del.Links[0].SpanContext.TraceID() != reqSC.TraceID() {
		t.Errorf("link to trace %s, want the request's %s", del.Links[0].SpanContext.TraceID(), reqSC.TraceID())
	}
	a := spanAttrs(del)
	if a["sluice.queue"] != "traced" || a["sluice.ticket"] != ticket || a["sluice.attempt"] != "1" || a["http.response.status_code"] != "201" {
		t.Errorf("delivery span attributes %v", a)
	}

	hits := ds.all()
	if len(hits) != 1 {
		t.Fatalf("%d hits", len(hits))
	}
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(hits[0].header)))
	if got.TraceID() != del.SpanContext.TraceID() || got.SpanID() != del.SpanContext.SpanID() {
		t.Errorf("downstream got traceparent %q, want the delivery span %v", hits[0].header.Get("Traceparent"), del.SpanContext)
	}
	if n := len(hits[0].header.Values("Traceparent")); n != 1 {
		t.Errorf("downstream got %d traceparent headers", n)
	}

	ids := telemetrytest.ExemplarTraceIDs(t, reg, "sluice_delivery_duration_seconds")
	if len(ids) != 1 || ids[0] != del.SpanContext.TraceID().String() {
		t.Errorf("delivery histogram exemplars %v, want the delivery's trace %s", ids, del.SpanContext.TraceID())
	}
	if ids := telemetrytest.ExemplarTraceIDs(t, reg, "sluice_queue_wait_seconds"); len(ids) != 1 {
		t.Errorf("wait histogram exemplars %v, want one", ids)
	}
}

// TestNATSDownstreamGetsTraceparent: a nats: downstream receives the delivery's trace
// context as a traceparent header, and no copy of the park's.
func TestNATSDownstreamGetsTraceparent(t *testing.T) {
	srv := natstest.Start(t)
	tp, exp := newTracing(t)
	cfg := baseConfig("tocore", "nats:orders.traced")
	cfg.Delivery = queueconfig.AtMostOnce
	store, err := queue.Open(ctxT(t), srv.Connect(t), queue.WithSigningKey(natstest.SigningKey()), queue.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	sub, err := srv.Conn.SubscribeSync("orders.traced")
	if err != nil {
		t.Fatal(err)
	}
	_, reqSC := parkTraced(t, tp, store, "tocore")
	startReplica(t, srv, cfg, "a", dispatcher.WithTracerProvider(tp))
	msg, err := sub.NextMsg(20 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the delivery span", 20*time.Second, func() bool { _, ok := spanNamed(exp, "sluice.deliver"); return ok })
	del, _ := spanNamed(exp, "sluice.deliver")
	got := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier(http.Header(msg.Header))))
	if got.SpanID() != del.SpanContext.SpanID() || got.TraceID() == reqSC.TraceID() {
		t.Errorf("published traceparent %q, want the delivery span %v", msg.Header.Get("Traceparent"), del.SpanContext)
	}
	if v := msg.Header.Get(queue.HeaderTraceParent); v != "" {
		t.Errorf("published the park's trace context too: %q", v)
	}
}
