package queue_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// An order of a queue with flow_by keeps only a keyed hash of its flow value, signed:
// the stream holds no merchant's name, and an order cannot be moved to another key.
func TestFlowKeyStoredHashedAndSigned(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("flows")
	cfg.FlowBy = queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)}
	s := openStore(t, srv, cfg)
	ctx := ctxT(t)
	q, _ := s.Queue("flows")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	req := order("flows", `{"sku":1}`)
	req.Flow = "merchant-secret-name"
	rc, err := s.Park(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := q.Stream().GetLastMsgForSubject(ctx, "sluice.q.flows."+rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	want := s.FlowKeyFor(q.Config(), req.Flow)
	if got := raw.Header.Get(queue.HeaderFlowKey); got != want || len(got) != 32 {
		t.Fatalf("%s = %q, want %q", queue.HeaderFlowKey, got, want)
	}
	if other := s.FlowKeyFor(q.Config(), "merchant-b"); other == want {
		t.Fatal("two values share a flow key")
	}
	for k, vs := range raw.Header {
		for _, v := range vs {
			if strings.Contains(v, req.Flow) {
				t.Errorf("the stored order holds the flow value in %s: %q", k, v)
			}
		}
	}
	m := next(t, cons)
	if m.FlowKey != want || s.Verify(m) != nil {
		t.Fatalf("read back: flow key %q (want %q), verify %v", m.FlowKey, want, s.Verify(m))
	}
	// Moved to another key: forged.
	msg := copyMsg(raw)
	msg.Header.Set(queue.HeaderFlowKey, s.FlowKeyFor(q.Config(), "merchant-b"))
	if _, err := s.JetStream().PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	if err := s.Verify(next(t, cons)); !errors.Is(err, queue.ErrForged) {
		t.Errorf("moved to another flow key: Verify = %v, want ErrForged", err)
	}
	// A queue without flow_by stores none.
	if k := s.FlowKeyFor(testConfig("plain"), "x"); k != "" {
		t.Errorf("flow key in a queue without flow_by: %q", k)
	}
}
