package queue_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A queue that leaves the rules keeps its stream; a later process (no rules naming it)
// adopts it with the configuration stored at declaration, its tickets' status works,
// the gauge says orphaned, and it can be retired once empty.
func TestOrphanAdoptedAndRetired(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	cfg := testConfig("old")
	cfg.Outflow = limiter.Rate{Count: 3, Period: 2 * time.Second}
	cfg.MaxAttempts = 4
	cfg.Downstream = "http://orders.internal:8080"
	first := openStore(t, srv, cfg)
	var tickets []string
	for range 3 {
		rc, err := first.Park(ctx, order("old", "x"))
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, rc.Ticket)
	}

	// The "restart": a new store whose rules declare only "new".
	reg := prometheus.NewRegistry()
	s, err := queue.Open(ctx, srv.Conn, queue.WithRegisterer(reg), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, testConfig("new")); err != nil {
		t.Fatal(err)
	}
	orphans, err := s.AdoptOrphans(ctx, []string{"new"})
	if err != nil {
		t.Fatal(err)
	}
	if len(orphans) != 1 || orphans[0].Name != "old" || orphans[0].Depth != 3 || orphans[0].Queue == nil || orphans[0].Err != nil {
		t.Fatalf("orphans: %+v", orphans)
	}
	q := orphans[0].Queue
	if !q.Orphaned() {
		t.Error("adopted queue not marked orphaned")
	}
	if got := q.Config(); got.Outflow != cfg.Outflow || got.MaxAttempts != 4 || got.Downstream != cfg.Downstream {
		t.Errorf("stored config: %+v", got)
	}
	st, err := s.Status(ctx, tickets[0])
	if err != nil || st.Status != queue.StatusQueued || st.Queue != "old" {
		t.Fatalf("status of an orphaned ticket: %+v %v", st, err)
	}
	if v := gaugeOf(t, reg, "sluice_queue_orphaned", "old"); v != 1 {
		t.Errorf("orphaned gauge of old: %v", v)
	}
	if v := gaugeOf(t, reg, "sluice_queue_orphaned", "new"); v != 0 {
		t.Errorf("orphaned gauge of new: %v", v)
	}
	info, err := q.Info(ctx)
	if err != nil || !info.Orphaned || info.Depth != 3 || info.Oldest.IsZero() {
		t.Errorf("info: %+v %v", info, err)
	}

	if _, err := s.Retire(ctx, "new", false); !errors.Is(err, queue.ErrDeclared) {
		t.Errorf("retire a declared queue: %v", err)
	}
	if _, err := s.Retire(ctx, "old", false); !errors.Is(err, queue.ErrNotEmpty) {
		t.Errorf("retire a queue holding orders: %v", err)
	}
	if _, err := s.Retire(ctx, "nosuch", false); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("retire an unknown queue: %v", err)
	}
	if _, err := s.Retire(ctx, "../x", false); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("retire a bad name: %v", err)
	}
	// Drain it (as a dispatcher would) and retire it.
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		jm, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if err := jm.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.Retire(ctx, "old", false)
	if err != nil || n != 0 {
		t.Fatalf("retire the drained queue: %d %v", n, err)
	}
	if _, err := s.Queue("old"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("retired queue still in the store: %v", err)
	}
	if _, err := s.JetStream().Stream(ctx, queue.StreamName("old")); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("retired stream: %v", err)
	}
	// The first store, whose rules lose "old" (and never had "new"), forgets the
	// retired queue and adopts "new".
	if orphans, err := first.AdoptOrphans(ctx, nil); err != nil || len(orphans) != 1 || orphans[0].Name != "new" {
		t.Errorf("orphans after retire: %+v %v", orphans, err)
	}
	if _, err := first.Queue("old"); !errors.Is(err, queue.ErrUnknownQueue) {
		t.Errorf("first store still has the retired queue: %v", err)
	}
}

// --drop retires a queue with its orders and dead letters.
func TestRetireDrop(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv, testConfig("gone"))
	for range 2 {
		if _, err := s.Park(ctx, order("gone", "x")); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.AdoptOrphans(ctx, nil); err != nil {
		t.Fatal(err)
	}
	n, err := s.Retire(ctx, "gone", true)
	if err != nil || n != 2 {
		t.Fatalf("retire --drop: %d %v", n, err)
	}
}

// A stream declared by an older sluice has no stored configuration: it is reported,
// not drained.
func TestOrphanWithoutStoredConfig(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv)
	if _, err := s.JetStream().CreateStream(ctx, jetstream.StreamConfig{Name: queue.StreamName("legacy"),
		Subjects: []string{"sluice.q.legacy.*"}, Retention: jetstream.WorkQueuePolicy}); err != nil {
		t.Fatal(err)
	}
	orphans, err := s.AdoptOrphans(ctx, nil)
	if err != nil || len(orphans) != 1 || orphans[0].Queue != nil || !errors.Is(orphans[0].Err, queue.ErrInvalidConfig) {
		t.Fatalf("legacy orphan: %+v %v", orphans, err)
	}
}

func gaugeOf(t *testing.T, reg *prometheus.Registry, name, q string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "queue" && l.GetValue() == q {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{queue=%q}", name, q)
	return 0
}

func TestCancel(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv, testConfig("orders"))
	q, _ := s.Queue("orders")
	rc, err := s.Park(ctx, order("orders", "cancel me"))
	if err != nil {
		t.Fatal(err)
	}
	keep, err := s.Park(ctx, order("orders", "keep me"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Fatalf("cancel a queued order: %v", err)
	}
	st, err := s.Status(ctx, rc.Ticket)
	if err != nil || st.Status != queue.StatusCancelled || !st.Status.Final() {
		t.Fatalf("status after cancel: %+v %v", st, err)
	}
	if d, _ := q.Depth(ctx); d != 1 {
		t.Errorf("depth after cancel: %d", d)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Errorf("cancel again: %v", err)
	}
	for _, bad := range []string{queue.NewTicket(), "short", strings.Repeat("A", 26), "../../../etc/passwd"} {
		if err := s.Cancel(ctx, bad); !errors.Is(err, queue.ErrNotFound) {
			t.Errorf("cancel %q: %v", bad, err)
		}
	}

	// Handed to a dispatcher (no record yet): delivering, not cancellable.
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: queue.ConsumerName, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	jm, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, keep.Ticket); !errors.Is(err, queue.ErrNotCancellable) {
		t.Errorf("cancel a delivering order: %v", err)
	}
	// Its attempt failed: queued again with a record; now it can be cancelled, and a
	// dispatcher that read the record before cancel cannot mark it delivering.
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: keep.Ticket, Queue: "orders", Status: queue.StatusQueued, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	if err := jm.NakWithDelay(time.Hour); err != nil {
		t.Fatal(err)
	}
	seen, err := s.Record(ctx, keep.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, keep.Ticket); err != nil {
		t.Fatalf("cancel a queued retry: %v", err)
	}
	if err := s.MarkDelivering(ctx, seen); !errors.Is(err, queue.ErrCancelled) {
		t.Errorf("mark delivering after cancel: %v", err)
	}
	if d, _ := q.Depth(ctx); d != 0 {
		t.Errorf("depth: %d", d)
	}
}

// The other order of the race: the dispatcher marks delivering first, and the cancel
// is refused.
func TestMarkDeliveringBeforeCancel(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv, testConfig("orders"))
	rc, err := s.Park(ctx, order("orders", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusQueued, Attempts: 1}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Record(ctx, rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.MarkDelivering(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); !errors.Is(err, queue.ErrNotCancellable) || !strings.Contains(err.Error(), "delivering") {
		t.Errorf("cancel while delivering: %v", err)
	}
	// Final tickets are not cancellable either.
	rec.Status = queue.StatusDone
	if err := s.SaveRecord(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); !errors.Is(err, queue.ErrNotCancellable) {
		t.Errorf("cancel a done order: %v", err)
	}
}

func TestPauseResume(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv, testConfig("orders"))
	q, _ := s.Queue("orders")
	if err := q.Pause(ctx, time.Now().Add(time.Hour)); !errors.Is(err, queue.ErrNoDispatcher) {
		t.Errorf("pause without a consumer: %v", err)
	}
	if _, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: queue.ConsumerName, AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	until := time.Now().Add(time.Hour).Truncate(time.Second)
	if err := q.Pause(ctx, until); err != nil {
		t.Fatal(err)
	}
	info, err := q.Info(ctx)
	if err != nil || !info.PausedUntil.Equal(until) {
		t.Fatalf("paused until %v, want %v (%v)", info.PausedUntil, until, err)
	}
	if err := q.Resume(ctx); err != nil {
		t.Fatal(err)
	}
	if info, err := q.Info(ctx); err != nil || !info.PausedUntil.IsZero() {
		t.Fatalf("after resume: paused until %v (%v)", info.PausedUntil, err)
	}
}

func TestPurgeDeadLetterTickets(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	s := openStore(t, srv, testConfig("orders"))
	q, _ := s.Queue("orders")
	cons, err := q.Stream().CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "t", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	var tickets []string
	for range 3 {
		if _, err := s.Park(ctx, order("orders", "d")); err != nil {
			t.Fatal(err)
		}
		jm, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		m, err := queue.Decode(jm)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.DeadLetter(ctx, m, 8, "500"); err != nil {
			t.Fatal(err)
		}
		_ = jm.Term()
		tickets = append(tickets, m.Ticket)
	}
	n, err := s.PurgeDeadLetters(ctx, "orders", tickets[1], queue.NewTicket())
	if n != 1 || !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("purge one known and one unknown ticket: %d %v", n, err)
	}
	left, _ := s.DeadLetters(ctx, "orders", 0)
	if len(left) != 2 || left[0].Message.Ticket != tickets[0] || left[1].Message.Ticket != tickets[2] {
		t.Errorf("left: %d", len(left))
	}
	if n, err := s.PurgeDeadLetters(ctx, "orders"); n != 2 || err != nil {
		t.Errorf("purge all: %d %v", n, err)
	}
}
