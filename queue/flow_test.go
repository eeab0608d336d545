package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// flowStore opens a store on a NATS server of its own with the queue "flows", which
// has flow_by.
func flowStore(t testing.TB) (*queue.Store, queueconfig.Config, *queue.Queue) {
	t.Helper()
	cfg := testConfig("flows")
	cfg.FlowBy = queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)}
	s := openStore(t, natstest.Start(t), cfg)
	q, _ := s.Queue("flows")
	return s, cfg, q
}

// An order of a queue with flow_by keeps only a keyed hash of its flow value, signed:
// the stream holds no merchant's name, and an order cannot be moved to another key.
func TestFlowKeyStoredHashedAndSigned(t *testing.T) {
	s, _, q := flowStore(t)
	ctx := ctxT(t)
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

// Two replicas change one flow key at once, a pause from one and a pinned rate from
// the other, each having read the settings before either writes: the write that comes
// second meets a changed revision, reads again and applies its change on top, so both
// changes hold. Then, free-running races of the same two changes keep both too.
func TestChangeFlowConcurrentWritersKeepBothChanges(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("flows")
	cfg.FlowBy = queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)}
	ctx := ctxT(t)
	var qs [2]*queue.Queue
	for i := range qs {
		s, err := queue.Open(ctx, srv.Connect(t), queue.WithSigningKey(natstest.SigningKey()))
		if err != nil {
			t.Fatal(err)
		}
		if qs[i], err = s.Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
	}
	until := time.Now().Add(time.Hour).Truncate(time.Second)
	pin := limiter.PerSecond(2)
	changes := [2]func(*queue.FlowControl){
		func(fc *queue.FlowControl) { fc.PausedUntil = until },
		func(fc *queue.FlowControl) { fc.Rate = pin },
	}
	race := func(value string, lockstep bool) (calls [2]int) {
		var read sync.WaitGroup
		read.Add(2)
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				_, err := qs[i].ChangeFlow(ctx, value, func(fc *queue.FlowControl) {
					calls[i]++
					if lockstep && calls[i] == 1 {
						read.Done()
						read.Wait() // both have read before either writes
					}
					changes[i](fc)
				})
				if err != nil {
					t.Errorf("writer %d: %v", i, err)
				}
			})
		}
		wg.Wait()
		return calls
	}
	check := func(value string) {
		t.Helper()
		fc, err := qs[0].Flow(ctx, value)
		if err != nil {
			t.Fatal(err)
		}
		if !fc.PausedUntil.Equal(until) || fc.Rate != pin {
			t.Fatalf("%s after the race: paused until %v, rate %v; want %v and %v", value, fc.PausedUntil, fc.Rate, until, pin)
		}
	}
	calls := race("merchant-lockstep", true)
	check("merchant-lockstep")
	if calls[0]+calls[1] != 3 {
		t.Errorf("change called %v times: want one writer to read again after the other's write (3 calls in all)", calls)
	}
	retried := 0
	for i := range 20 {
		value := fmt.Sprintf("merchant-%d", i)
		calls := race(value, false)
		check(value)
		retried += calls[0] + calls[1] - 2
	}
	t.Logf("lockstep: change called %v times; 20 free races: %d reads again", calls, retried)
}

// A dispatcher's report of 10,000 flow keys goes through the bucket and reads back
// summed with a second dispatcher's, a key held by both counted in both; a report
// removed (its dispatcher holds nothing) leaves the sum.
func TestFlowStatsThroughTheBucket(t *testing.T) {
	s, cfg, q := flowStore(t)
	ctx := ctxT(t)
	if r, err := q.FlowStats(ctx); err != nil || len(r.Keys) != 0 || r.Reports != 0 {
		t.Fatalf("before any report: %+v, %v", r, err)
	}
	const keys = 10_000
	stats := make([]queue.FlowStat, keys)
	for i := range stats {
		stats[i] = queue.FlowStat{Key: s.FlowKeyFor(cfg, fmt.Sprint("merchant-", i)), Depth: 1, PerSecond: 0.5}
	}
	if err := q.PublishFlowStats(ctx, "dispatcher-1", stats); err != nil {
		t.Fatal(err)
	}
	shared := stats[0].Key
	if err := q.PublishFlowStats(ctx, "dispatcher-2", []queue.FlowStat{{Key: shared, Depth: 2, PerSecond: 1}}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r, err := q.FlowStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("read %d keys from %d reports in %s", len(r.Keys), r.Reports, time.Since(start).Round(time.Microsecond))
	if len(r.Keys) != keys || r.Reports != 2 || r.Truncated != 0 {
		t.Fatalf("%d keys from %d reports (%d truncated), want %d from 2", len(r.Keys), r.Reports, r.Truncated, keys)
	}
	if st := r.Keys[shared]; st.Depth != 3 || st.PerSecond != 1.5 {
		t.Errorf("the key both report: %+v, want depth 3 at 1.5/s", st)
	}
	if st := r.Keys[stats[keys-1].Key]; st.Depth != 1 || st.PerSecond != 0.5 {
		t.Errorf("a key one reports: %+v", st)
	}
	if err := q.PublishFlowStats(ctx, "dispatcher-1", nil); err != nil {
		t.Fatal(err)
	}
	if r, err := q.FlowStats(ctx); err != nil || len(r.Keys) != 1 || r.Reports != 1 {
		t.Errorf("after dispatcher-1's report went: %d keys, %d reports, %v", len(r.Keys), r.Reports, err)
	}
	if err := q.PublishFlowStats(ctx, "no.dots", stats[:1]); !errors.Is(err, queue.ErrInvalidRequest) {
		t.Errorf("a replica id with a dot: %v", err)
	}
}

// BenchmarkFlowStatsTenThousandKeys is the cost of a flow key listing's read of a
// dispatcher's report of 10,000 keys (go test -run X -bench FlowStats ./queue/), and of
// the dispatcher's write of it.
func BenchmarkFlowStatsTenThousandKeys(b *testing.B) {
	s, cfg, q := flowStore(b)
	stats := make([]queue.FlowStat, 10_000)
	for i := range stats {
		stats[i] = queue.FlowStat{Key: s.FlowKeyFor(cfg, fmt.Sprint("merchant-", i)), Depth: 1 + i%5, PerSecond: 0.5}
	}
	ctx := context.Background()
	b.Run("publish", func(b *testing.B) {
		for b.Loop() {
			if err := q.PublishFlowStats(ctx, "d1", stats); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("read", func(b *testing.B) {
		for b.Loop() {
			if r, err := q.FlowStats(ctx); err != nil || len(r.Keys) != len(stats) {
				b.Fatal(len(r.Keys), err)
			}
		}
	})
}
