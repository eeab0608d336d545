package queue_test

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestParkKeepsTraceContext: without a tracer provider of its own (the global one, none
// set) Park keeps the trace context of the span it was given, signed: a changed trace
// context is forged like any other header.
func TestParkKeepsTraceContext(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=x")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	rc, err := s.Park(trace.ContextWithSpanContext(ctx, sc), order("orders", `{"sku":1}`))
	if err != nil {
		t.Fatal(err)
	}
	// Read before the consumer acknowledges it: the work-queue stream then removes it.
	raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.orders."+rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	m := next(t, cons)
	if m.TraceParent != "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || m.TraceState != "vendor=x" {
		t.Errorf("parked trace context %q %q", m.TraceParent, m.TraceState)
	}
	if err := s.Verify(m); err != nil {
		t.Fatalf("genuine traced message: %v", err)
	}
	forged := copyMsg(raw)
	forged.Header.Set(queue.HeaderTraceParent, "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01")
	if _, err := s.JetStream().PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(next(t, cons)); !errors.Is(err, queue.ErrForged) {
		t.Errorf("changed trace context: Verify = %v, want ErrForged", err)
	}
	// Untraced: nothing kept.
	if _, err := s.Park(ctx, order("orders", `{"sku":2}`)); err != nil {
		t.Fatal(err)
	}
	if m := next(t, cons); m.TraceParent != "" || m.TraceState != "" {
		t.Errorf("untraced park kept %q %q", m.TraceParent, m.TraceState)
	}
}
