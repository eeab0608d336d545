package queue_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// laneConsumer refreshes the lanes before every pick, so that the delivery order does
// not depend on the machine's speed.
var laneConsumer = queue.ConsumerConfig{AckWait: 30 * time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 4, LaneRefresh: time.Nanosecond}

func laneConsumerOf(t *testing.T, s *queue.Store, name string) *queue.Consumer {
	t.Helper()
	q, err := s.Queue(name)
	if err != nil {
		t.Fatal(err)
	}
	c := q.Consumer()
	if err := c.Ensure(ctxT(t), laneConsumer); err != nil {
		t.Fatal(err)
	}
	return c
}

// parkAs parks an order of tenant with priority, tagged (header X-Tag) for the checks.
func parkAs(t *testing.T, s *queue.Store, q, tenant, priority, tag string) queue.Receipt {
	t.Helper()
	h := http.Header{"X-Tenant": {tenant}, "X-Tag": {tag}}
	rc, err := s.Park(ctxT(t), &queue.Request{Queue: q, Method: "POST", Path: "/orders", Header: h, Tenant: tenant, Priority: priority})
	if err != nil {
		t.Fatalf("park %s: %v", tag, err)
	}
	return rc
}

// deliver fetches and settles n orders and returns their tags in delivery order.
func deliver(t *testing.T, c *queue.Consumer, n int) []string {
	t.Helper()
	ctx := ctxT(t)
	var tags []string
	for range n {
		l := lease(t, c)
		if err := l.Verify(); err != nil {
			t.Fatalf("delivered order does not verify: %v", err)
		}
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
		tags = append(tags, l.Message().Header.Get("X-Tag"))
	}
	return tags
}

// otherLane returns a tenant whose lane differs from tenant's.
func otherLane(t *testing.T, s *queue.Store, cfg queueconfig.Config, tenant string) string {
	for i := range 100 {
		b := fmt.Sprintf("tenant-b%d", i)
		if s.LaneFor(cfg, "", b) != s.LaneFor(cfg, "", tenant) {
			return b
		}
	}
	t.Fatal("no tenant in another lane")
	return ""
}

// floodPositions parks flood orders of tenant A, delivers 5, parks 3 of tenant B and
// returns the positions (1-based, counted from the first delivery after B parked) at
// which B's orders are delivered.
func floodPositions(t *testing.T, cfg queueconfig.Config, flood int) []int {
	srv := natstest.Start(t)
	s := openStore(t, srv, cfg)
	c := laneConsumerOf(t, s, cfg.Name)
	b := "tenant-b"
	if cfg.FairBy != "" {
		b = otherLane(t, s, cfg, "tenant-a")
	}
	for i := range flood {
		parkAs(t, s, cfg.Name, "tenant-a", "", fmt.Sprintf("a%d", i))
	}
	deliver(t, c, 5)
	for i := range 3 {
		parkAs(t, s, cfg.Name, b, "", fmt.Sprintf("b%d", i))
	}
	var pos []int
	for i := 1; len(pos) < 3 && i <= flood+3; i++ {
		if tag := deliver(t, c, 1)[0]; strings.HasPrefix(tag, "b") {
			pos = append(pos, i)
		}
	}
	return pos
}

// TestFairByFlood: tenant A floods the queue with 1000 orders, then tenant B parks 3.
// With fair_by, B's orders take every other slot (two tenants with work share the
// outflow half and half); without, they wait behind the whole flood.
func TestFairByFlood(t *testing.T) {
	const flood = 1000
	fair := testConfig("fair")
	fair.FairBy = "header:X-Tenant"
	got := floodPositions(t, fair, flood)
	t.Logf("fair_by: tenant B's 3 orders delivered at positions %v after a flood of %d by tenant A", got, flood)
	if !slices.Equal(got, []int{1, 3, 5}) && !slices.Equal(got, []int{2, 4, 6}) {
		t.Errorf("fair_by: B's orders at positions %v, want every other slot", got)
	}
	if testing.Short() {
		return
	}
	got = floodPositions(t, testConfig("fifo"), flood)
	t.Logf("without fair_by: tenant B's orders delivered at positions %v", got)
	if want := []int{flood - 4, flood - 3, flood - 2}; !slices.Equal(got, want) {
		t.Errorf("FIFO: B's orders at positions %v, want %v (behind the flood)", got, want)
	}
}

func priorityConfig(name string, mode queueconfig.PriorityMode) queueconfig.Config {
	cfg := testConfig(name)
	cfg.Priorities = queueconfig.Priorities{Levels: []string{"high", "normal", "low"}, Default: "normal", Mode: mode}
	if mode == queueconfig.Weighted {
		cfg.Priorities.Weights = map[string]int{"high": 8, "normal": 2, "low": 1}
	}
	return cfg
}

// parkEachLevel parks n orders of each level of priorityConfig into queue q, lowest
// level first (FIFO would deliver them first), tagged with their level and number:
// low0, low1, … high<n-1>.
func parkEachLevel(t *testing.T, s *queue.Store, q string, n int) {
	t.Helper()
	for _, p := range []string{"low", "normal", "high"} {
		for i := range n {
			parkAs(t, s, q, "", p, fmt.Sprintf("%s%d", p, i))
		}
	}
}

// TestPriorityWeighted: with every level busy, each window of 11 slots (the sum of the
// weights) holds 8 high, 2 normal and 1 low order: a low order waits at most 10 slots.
func TestPriorityWeighted(t *testing.T) {
	srv := natstest.Start(t)
	cfg := priorityConfig("prio", queueconfig.Weighted)
	s := openStore(t, srv, cfg)
	c := laneConsumerOf(t, s, cfg.Name)
	parkEachLevel(t, s, cfg.Name, 40)
	parkAs(t, s, cfg.Name, "", "unknown-level", "default0") // the default level: normal
	got := deliver(t, c, 44)
	for w := 0; w+11 <= len(got); w += 11 {
		count := map[string]int{}
		for _, tag := range got[w : w+11] {
			count[strings.TrimRight(tag, "0123456789")]++
		}
		count["normal"] += count["default"]
		if count["high"] != 8 || count["normal"] != 2 || count["low"] != 1 {
			t.Errorf("window %d: %v, want 8 high, 2 normal, 1 low (order %v)", w/11, count, got)
		}
	}
	gap, last := 0, -1
	for i, tag := range got {
		if strings.HasPrefix(tag, "low") {
			gap, last = max(gap, i-last-1), i
		}
	}
	t.Logf("weighted 8/2/1: longest run of other deliveries before a low one: %d (bound 10)", gap)
	if gap > 10 {
		t.Errorf("a low order waited %d slots, bound 10", gap)
	}
}

// TestPriorityStrict: the highest level with work always goes first.
func TestPriorityStrict(t *testing.T) {
	srv := natstest.Start(t)
	cfg := priorityConfig("strict", queueconfig.Strict)
	s := openStore(t, srv, cfg)
	c := laneConsumerOf(t, s, cfg.Name)
	parkEachLevel(t, s, cfg.Name, 3)
	got := deliver(t, c, 9)
	want := []string{"high0", "high1", "high2", "normal0", "normal1", "normal2", "low0", "low1", "low2"}
	if !slices.Equal(got, want) {
		t.Errorf("strict order %v, want %v", got, want)
	}
}

// A full lane refuses a new order before anything is looked up, but a repeat of an
// accepted keyed order stores nothing: it gets its ticket, and a new key is refused.
func TestFullLaneAnswersARepeat(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("capped")
	cfg.FairBy, cfg.TenantMaxDepth = "header:X-Tenant", 1
	s := openStore(t, srv, cfg)
	keyed := func(key string) *queue.Request {
		return &queue.Request{Queue: cfg.Name, Method: "POST", Path: "/", Tenant: "tenant-a", IdempotencyKey: key, Body: []byte(`{}`)}
	}
	first, err := s.Park(ctxT(t), keyed("k1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Park(ctxT(t), keyed("k2")); !errors.Is(err, queue.ErrFull) {
		t.Fatalf("a second key into the full lane: %v, want ErrFull", err)
	}
	rc, err := s.Park(ctxT(t), keyed("k1"))
	if err != nil || !rc.Duplicate || rc.Ticket != first.Ticket {
		t.Errorf("a repeat into the full lane: %+v %v, want ticket %s as a duplicate", rc, err, first.Ticket)
	}
}

// TestTenantMaxDepth: a lane holding tenant_max_depth orders refuses more like a full
// queue; another tenant's lane still accepts.
func TestTenantMaxDepth(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("capped")
	cfg.FairBy, cfg.TenantMaxDepth = "header:X-Tenant", 3
	s := openStore(t, srv, cfg)
	for _, dispatched := range []bool{false, true} { // before and after a dispatcher set the lanes up
		if dispatched {
			laneConsumerOf(t, s, cfg.Name)
		}
		for i := range 3 {
			parkAs(t, s, cfg.Name, "tenant-a", "", fmt.Sprintf("a%d", i))
		}
		if dispatched { // the lane's consumer counts an order a moment after its write
			waitFor(t, func() bool { return lanePending(t, s) == 3 })
		}
		_, err := s.Park(ctxT(t), &queue.Request{Queue: cfg.Name, Method: "POST", Path: "/", Tenant: "tenant-a"})
		var fe *queue.FullError
		if !errors.Is(err, queue.ErrFull) || !errors.As(err, &fe) || fe.Lane == "" || fe.Depth != 3 || fe.Limit != "tenant_max_depth" || fe.Max != 3 || fe.RetryAfter < time.Second {
			t.Fatalf("dispatched %v: 4th order of a capped tenant: %v, want a FullError of its lane", dispatched, err)
		}
		parkAs(t, s, cfg.Name, otherLane(t, s, cfg, "tenant-a"), "", "b0")
		if err := s.Queues()[0].Stream().Purge(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}

// lanePending returns the waiting and handed-out orders the consumers of the store's
// one queue count.
func lanePending(t *testing.T, s *queue.Store) uint64 {
	var n uint64
	infos := s.Queues()[0].Stream().ListConsumers(ctxT(t))
	for ci := range infos.Info() {
		n += ci.NumPending + uint64(ci.NumAckPending)
	}
	if err := infos.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLanesLead: one dispatcher leads a laned queue; another gets nothing until the
// first lets go.
func TestLanesLead(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("led")
	cfg.FairBy = "header:X-Tenant"
	s := openStore(t, srv, cfg)
	c1 := laneConsumerOf(t, s, cfg.Name)
	c2 := laneConsumerOf(t, s, cfg.Name)
	for i := range 3 {
		parkAs(t, s, cfg.Name, "t", "", fmt.Sprintf("a%d", i))
	}
	deliver(t, c1, 1)
	held := lease(t, c1) // handed out, not settled
	q, _ := s.Queue(cfg.Name)
	if in, err := q.Info(ctxT(t)); err != nil || in.InFlight != 1 || in.Depth != 2 {
		t.Errorf("info of a laned queue: %+v, %v; want 1 in flight of 2", in, err)
	}
	held.Release(0)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	l, err := c2.Next(ctx)
	cancel()
	if err == nil || !errors.Is(err, queue.ErrNoMessages) {
		t.Fatalf("second dispatcher got %v, %v while the first leads", l, err)
	}
	if err := c1.Unpin(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := deliver(t, c2, 2); !slices.Equal(got, []string{"a1", "a2"}) {
		t.Errorf("second dispatcher after the first let go: %v", got)
	}
}

// TestLanesUpgrade: orders parked before a queue had lanes are still delivered once it
// has them, and laned orders once it has none again; status and cancel find laned
// tickets.
func TestLanesUpgrade(t *testing.T) {
	srv := natstest.Start(t)
	plain := testConfig("up")
	s := openStore(t, srv, plain)
	consumer(t, s, "up") // today's consumer, pinned, on every subject
	parkAs(t, s, "up", "t", "", "old0")

	laned := plain
	laned.FairBy = "header:X-Tenant"
	laned.Priorities = queueconfig.Priorities{Levels: []string{"high", "low"}, Mode: queueconfig.Strict}
	if _, err := s.Declare(ctxT(t), laned); err != nil {
		t.Fatal(err)
	}
	c := laneConsumerOf(t, s, "up")
	parkAs(t, s, "up", "t", "high", "new0")
	cancelled := parkAs(t, s, "up", "t", "low", "new1")
	rec, err := s.Status(ctxT(t), cancelled.Ticket)
	if err != nil || rec.Status != queue.StatusQueued {
		t.Fatalf("status of a laned order: %+v, %v", rec, err)
	}
	if err := s.Cancel(ctxT(t), cancelled.Ticket); err != nil {
		t.Fatalf("cancel a laned order: %v", err)
	}
	parkAs(t, s, "up", "t", "low", "new2")
	// The high order first; then the old one (in the default level, low) and the low
	// one share the low level's turns.
	if got := deliver(t, c, 3); got[0] != "new0" || !slices.Equal(slices.Sorted(slices.Values(got[1:])), []string{"new2", "old0"}) {
		t.Errorf("after the upgrade: %v, want new0 first, then new2 and old0", got)
	}
	parkAs(t, s, "up", "t", "low", "laned0")
	if _, err := s.Declare(ctxT(t), plain); err != nil {
		t.Fatal(err)
	}
	c = consumer(t, s, "up")
	if got := deliver(t, c, 1); !slices.Equal(got, []string{"laned0"}) {
		t.Errorf("after the lanes went: %v", got)
	}
}

// A store that first meets a queue unlaned still finds an order an earlier, laned
// configuration left in a lane (it looks in lanes only when there may be orders there).
func TestLanedOrderFoundAfterTheLanesWent(t *testing.T) {
	srv := natstest.Start(t)
	laned := testConfig("gone")
	laned.FairBy = "header:X-Tenant"
	left := parkAs(t, openStore(t, srv, laned), "gone", "t", "", "left")
	plain := openStore(t, srv, testConfig("gone")) // another process, unlaned from the start
	if rec, err := plain.Status(ctxT(t), left.Ticket); err != nil || rec.Status != queue.StatusQueued {
		t.Fatalf("status of an order left in a lane: %+v, %v", rec, err)
	}
	if err := plain.Cancel(ctxT(t), left.Ticket); err != nil {
		t.Fatalf("cancel an order left in a lane: %v", err)
	}
}

// floorPastALanedOrder sets up queue name with lanes (returned: the store and the
// configuration without them) and an order waiting in a lane below the ack floor of the
// consumer of unlaned orders: a replica not yet on the laned configuration parks an
// unlaned order after the laned one, and that consumer delivers it (the scheduler of
// the lanes would pick either first; this takes it straight from that consumer).
func floorPastALanedOrder(t *testing.T, srv *natstest.Server, name string) (*queue.Store, queueconfig.Config) {
	t.Helper()
	plain := testConfig(name)
	laned := plain
	laned.FairBy = "header:X-Tenant"
	a := openStore(t, srv, laned)
	b := openStore(t, srv, plain)
	parkAs(t, a, name, "t", "", "laned")
	parkAs(t, b, name, "", "", "unlaned")
	laneConsumerOf(t, a, name)
	ctx := ctxT(t)
	dispatch, err := srv.Stream(t, queue.StreamName(name)).Consumer(ctx, queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	batch, err := dispatch.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		order, err := queue.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		if tag := order.Header.Get("X-Tag"); tag != "unlaned" {
			t.Fatalf("the unlaned consumer delivered %q", tag)
		}
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return a, plain
}

// TestLanedOrderBelowTheFloorAfterTheLanesWent: while a queue had lanes, its consumer of
// unlaned orders delivered one (parked by a replica still without lanes) that came after
// an order waiting in a lane, so its ack floor passed that order. When the lanes go, the
// consumer takes every subject again and must still deliver the laned order; nor may
// Reclaim, which removes what lies at or below a consumer's ack floor, take it for
// acknowledged.
func TestLanedOrderBelowTheFloorAfterTheLanesWent(t *testing.T) {
	srv := natstest.Start(t)
	a, plain := floorPastALanedOrder(t, srv, "floor")
	if _, err := a.Declare(ctxT(t), plain); err != nil {
		t.Fatal(err)
	}
	c := consumer(t, a, "floor")
	if n, err := c.Reclaim(ctxT(t)); err != nil || n != 0 {
		t.Fatalf("reclaim took %d orders (%v): the laned order was never delivered", n, err)
	}
	if got := deliver(t, c, 1); !slices.Equal(got, []string{"laned"}) {
		t.Errorf("after the lanes went: %v, want the laned order", got)
	}
}

// TestReclaimAfterAnUpdateWidenedTheConsumer: an earlier sluice (or a replica still
// running it) widened the consumer of unlaned orders by an update when the lanes went,
// which kept its ack floor past an order still waiting in a lane. Reclaim must not take
// that order for acknowledged: it purges only the unlaned orders of that consumer.
func TestReclaimAfterAnUpdateWidenedTheConsumer(t *testing.T) {
	srv := natstest.Start(t)
	a, plain := floorPastALanedOrder(t, srv, "widened")
	ctx := ctxT(t)
	st := srv.Stream(t, queue.StreamName("widened"))
	dispatch, err := st.Consumer(ctx, queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	// What Ensure did before it made the consumer anew: the lanes' consumers deleted,
	// then the queue's consumer updated to every ready subject.
	list := st.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci.Name != queue.ConsumerName {
			if err := st.DeleteConsumer(ctx, ci.Name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	cfg := dispatch.CachedInfo().Config
	cfg.FilterSubject, cfg.FilterSubjects = "sluice.q.widened.>", nil
	if _, err := st.UpdateConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	q0, err := a.Declare(ctx, plain)
	if err != nil {
		t.Fatal(err)
	}
	// Reclaim (of a dispatcher still on the widened consumer) leaves the laned order.
	c := q0.Consumer()
	if n, err := c.Reclaim(ctx); err != nil || n != 0 {
		t.Fatalf("reclaim took %d orders (%v): the laned order was never delivered", n, err)
	}
	if si, err := st.Info(ctx); err != nil || si.State.Msgs != 1 {
		t.Fatalf("the stream holds %v orders (%v), want the laned one", si.State.Msgs, err)
	}
	// Ensure finds the laned order below the floor and makes the consumer anew.
	c = consumer(t, a, "widened")
	if got := deliver(t, c, 1); !slices.Equal(got, []string{"laned"}) {
		t.Errorf("after Ensure: %v, want the laned order", got)
	}
}

// tenantIn returns a tenant whose orders wait in lane tok of a queue of cfg.
func tenantIn(t *testing.T, s *queue.Store, cfg queueconfig.Config, tok string) string {
	t.Helper()
	for i := range 1000 {
		tenant := fmt.Sprintf("tenant-%d", i)
		if s.LaneFor(cfg, "", tenant) == tok {
			return tenant
		}
	}
	t.Fatalf("no tenant in lane %s", tok)
	return ""
}

// strayLaneConfigs returns a queue with four tenant lanes, the same queue without lanes
// and with one tenant lane: an order of lane p0t3 of the first is a stray in the last.
func strayLaneConfigs(name string) (four, plain, one queueconfig.Config) {
	plain = scheduledConfig(name)
	four = plain
	four.FairBy, four.FairLanes = "header:X-Tenant", 4
	one = four
	one.FairLanes = 1
	return four, plain, one
}

// laneGoneAndBack declares cfgs in turn on s, each followed by Ensure of c: the queue
// loses its lanes (their consumers are deleted) and gets fewer back.
func laneGoneAndBack(t *testing.T, s *queue.Store, c *queue.Consumer, cfgs ...queueconfig.Config) {
	t.Helper()
	for _, cfg := range cfgs {
		if _, err := s.Declare(ctxT(t), cfg); err != nil {
			t.Fatal(err)
		}
		if err := c.Ensure(ctxT(t), laneConsumer); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRequeueIntoALaneGone: a dead letter of lane p0t3 is re-queued (into its own lane:
// the lane is signed) after the queue lost its lanes and got one back. No lane
// consumer takes p0t3; the queue's consumer must.
func TestRequeueIntoALaneGone(t *testing.T) {
	srv := natstest.Start(t)
	four, plain, one := strayLaneConfigs("requeue")
	s := openStore(t, srv, four)
	c := laneConsumerOf(t, s, "requeue")
	rc := parkAs(t, s, "requeue", tenantIn(t, s, four, "p0t3"), "", "dead")
	ctx := ctxT(t)
	l := lease(t, c)
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Dead(ctx, "downstream answered 500", time.Second); err != nil {
		t.Fatal(err)
	}
	laneGoneAndBack(t, s, c, plain, one)
	if n, err := s.Requeue(ctx, "requeue", rc.Ticket); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	l = strayLease(t, c, rc.Ticket)
	settle(t, l)
}

// TestScheduledIntoALaneGone: a scheduled order of lane p0t3 (its target subject, lane
// included, is fixed when it is parked) falls due after the queue lost its lanes and
// got one back; it is delivered.
func TestScheduledIntoALaneGone(t *testing.T) {
	srv := natstest.Start(t)
	four, plain, one := strayLaneConfigs("later")
	s := openStore(t, srv, four)
	c := laneConsumerOf(t, s, "later")
	tenant := tenantIn(t, s, four, "p0t3")
	rc, err := s.Park(ctxT(t), &queue.Request{Queue: "later", Method: "POST", Path: "/orders", Tenant: tenant,
		Header: http.Header{"X-Tenant": {tenant}}, NotBefore: time.Now().Add(2 * time.Second)})
	if err != nil || rc.Status != queue.StatusScheduled {
		t.Fatalf("park: %+v, %v", rc, err)
	}
	laneGoneAndBack(t, s, c, plain, one)
	l := strayLease(t, c, rc.Ticket)
	settle(t, l)
}

// TestOrderInALaneNoConsumerTakes: a replica still on an older configuration of the
// queue (four tenant lanes) parks an order in a lane the current one (one lane) does
// not have, and no dispatcher ever made a consumer for; it is delivered.
func TestOrderInALaneNoConsumerTakes(t *testing.T) {
	r := newRollingLanes(t, "rolling")
	rc := parkAs(t, r.old, "rolling", r.stray, "", "stray")
	l := strayLease(t, r.c, rc.Ticket)
	// Handed out by the queue's consumer, which status and cancel ask for it.
	ctx := ctxT(t)
	if rec, err := r.cur.Status(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusDelivering {
		t.Errorf("status of the handed-out stray: %+v, %v; want delivering", rec, err)
	}
	if err := r.cur.Cancel(ctx, rc.Ticket); !errors.Is(err, queue.ErrNotCancellable) {
		t.Errorf("cancel of the handed-out stray: %v, want ErrNotCancellable", err)
	}
	settle(t, l)
}

// rollingLanes is a queue as a rolling change from four tenant lanes to one leaves it
// (strayLaneConfigs): cur, the current replica's store, has the queue with one lane and
// c its consumer set up; old, an older replica's store, still has four, and parks
// the orders of tenant stray in lane p0t3, which no consumer of cur's takes.
type rollingLanes struct {
	name     string
	srv      *natstest.Server
	four     queueconfig.Config
	cur, old *queue.Store
	c        *queue.Consumer
	stray    string
}

func newRollingLanes(t *testing.T, name string) *rollingLanes {
	t.Helper()
	r := &rollingLanes{name: name, srv: natstest.Start(t)}
	four, _, one := strayLaneConfigs(name)
	r.four = four
	r.cur = openStore(t, r.srv, one)
	r.c = laneConsumerOf(t, r.cur, name)
	r.old = openStore(t, r.srv, four)
	r.stray = tenantIn(t, r.old, four, "p0t3")
	return r
}

// ensureLaneTaken sets r.c up with cfg (once r.cur has the four lanes) and fails t
// unless lane p0t3 is no longer held by the queue's consumer and has its own, every
// ready subject taken once (checkLanesCovered); when says when that should hold.
func (r *rollingLanes) ensureLaneTaken(t *testing.T, cfg queue.ConsumerConfig, when string) {
	t.Helper()
	ctx := ctxT(t)
	if err := r.c.Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if r.c.LanesHeld() {
		t.Errorf("lane p0t3 still held %s", when)
	}
	if _, err := r.srv.Stream(t, queue.StreamName(r.name)).Consumer(ctx, "dispatch_p0t3"); err != nil {
		t.Errorf("lane p0t3 has no consumer %s: %v", when, err)
	}
	checkLanesCovered(t, r.srv, r.name)
}

// strayLease takes the next order from c and fails t unless it is ticket's, of lane
// p0t3 (the stray lane of strayLaneConfigs' tests).
func strayLease(t *testing.T, c *queue.Consumer, ticket string) *queue.Lease {
	t.Helper()
	l := lease(t, c)
	if m := l.Message(); m.Ticket != ticket || m.Lane != "p0t3" {
		t.Fatalf("delivered %s of lane %q, want %s of p0t3", m.Ticket, m.Lane, ticket)
	}
	return l
}

// checkLanesCovered lists the filters of the consumers of queue name; it fails t unless
// every ready subject of a laned queue is taken by exactly one: the unlaned orders and
// each valid lane (or every ready subject by the queue's consumer alone).
func checkLanesCovered(t *testing.T, srv *natstest.Server, name string) {
	t.Helper()
	ctx := ctxT(t)
	taken := map[string]string{}
	list := srv.Stream(t, queue.StreamName(name)).ListConsumers(ctx)
	for ci := range list.Info() {
		for _, f := range append([]string{ci.Config.FilterSubject}, ci.Config.FilterSubjects...) {
			if f == "" {
				continue
			}
			if other, ok := taken[f]; ok {
				t.Errorf("%s taken by %s and %s", f, other, ci.Name)
			}
			taken[f] = ci.Name
		}
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	if taken["sluice.q."+name+".>"] == queue.ConsumerName && len(taken) == 1 {
		return
	}
	want := []string{"sluice.q." + name + ".*"}
	for lv := range queueconfig.MaxPriorityLevels {
		for tn := range queueconfig.MaxFairLanes {
			want = append(want, fmt.Sprintf("sluice.q.%s.p%dt%d.*", name, lv, tn))
		}
	}
	for _, f := range want {
		if taken[f] == "" {
			t.Errorf("%s is taken by no consumer", f)
		}
		delete(taken, f)
	}
	if len(taken) > 0 {
		t.Errorf("unexpected filters: %v", taken)
	}
}

// TestLanesConcurrentEnsure: replicas with different lanes configured (a rolling
// change) set the consumers up at the same time, each trying again until it succeeds
// as a dispatcher does; every lane ends up taken by exactly one consumer, and orders
// of either configuration's lanes and of a lane neither has are delivered.
func TestLanesConcurrentEnsure(t *testing.T) {
	srv := natstest.Start(t)
	four, plain, _ := strayLaneConfigs("rolling")
	two := four
	two.FairLanes = 2
	prio := two
	prio.Priorities = queueconfig.Priorities{Levels: []string{"high", "low"}, Default: "low", Mode: queueconfig.Strict}
	a, b := openStore(t, srv, four), openStore(t, srv, two)
	qa, _ := a.Queue("rolling")
	qb, _ := b.Queue("rolling")
	ca, cb := qa.Consumer(), qb.Consumer()
	ensureBoth := func() {
		t.Helper()
		errs := make(chan error, 2)
		for _, c := range []*queue.Consumer{ca, cb} {
			go func() {
				deadline := time.Now().Add(20 * time.Second)
				for {
					err := c.Ensure(ctxT(t), laneConsumer)
					if err == nil || time.Now().After(deadline) {
						errs <- err
						return
					}
					time.Sleep(10 * time.Millisecond)
				}
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("ensure: %v", err)
			}
		}
		checkLanesCovered(t, srv, "rolling")
	}
	ensureBoth()
	laneGoneAndBack(t, a, ca, plain) // the lanes go: their consumers are deleted
	checkLanesCovered(t, srv, "rolling")
	for _, cfg := range []queueconfig.Config{four, prio} {
		if _, err := b.Declare(ctxT(t), cfg); err != nil {
			t.Fatal(err)
		}
		if _, err := a.Declare(ctxT(t), two); err != nil {
			t.Fatal(err)
		}
		ensureBoth()
	}
	// An order in each lane of the first, one of the last and a stray (p2t0, a level
	// none has had), delivered by a replica that set up again since the last change.
	if err := ca.Ensure(ctxT(t), laneConsumer); err != nil {
		t.Fatal(err)
	}
	old := openStore(t, srv, four)
	var want []string
	for _, tok := range []string{"p0t0", "p0t1", "p0t2", "p0t3"} {
		parkAs(t, old, "rolling", tenantIn(t, old, four, tok), "", tok)
		want = append(want, tok)
	}
	parkAs(t, b, "rolling", "", "low", "low")
	three := prio
	three.Priorities.Levels = []string{"high", "mid", "low"}
	parkAs(t, openStore(t, srv, three), "rolling", "", "low", "p2")
	want = append(want, "low", "p2")
	if got := deliver(t, ca, len(want)); !slices.Equal(slices.Sorted(slices.Values(got)), slices.Sorted(slices.Values(want))) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// TestStrayBelowTheFloorOfAnEarlierLanedConsumer: an earlier sluice's consumer of a
// laned queue took the unlaned orders alone, and its ack floor passed an order of a lane
// without a consumer. Reclaim leaves that order; Ensure makes the consumer anew with the
// lane, and the order is delivered.
func TestStrayBelowTheFloorOfAnEarlierLanedConsumer(t *testing.T) {
	srv := natstest.Start(t)
	four, plain, one := strayLaneConfigs("earlier")
	cur := openStore(t, srv, one)
	c := laneConsumerOf(t, cur, "earlier")
	ctx := ctxT(t)
	st := srv.Stream(t, queue.StreamName("earlier"))
	dispatch, err := st.Consumer(ctx, queue.ConsumerName)
	if err != nil {
		t.Fatal(err)
	}
	cfg := dispatch.CachedInfo().Config
	cfg.FilterSubject, cfg.FilterSubjects = "sluice.q.earlier.*", nil
	if _, err := st.UpdateConsumer(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	old := openStore(t, srv, four)
	parkAs(t, old, "earlier", tenantIn(t, old, four, "p0t3"), "", "stray")
	parkAs(t, openStore(t, srv, plain), "earlier", "", "", "unlaned")
	batch, err := dispatch.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ci, err := dispatch.Info(ctx); err != nil || ci.AckFloor.Stream < 2 {
		t.Fatalf("ack floor %+v, %v: not past the stray", ci, err)
	}
	if n, err := c.Reclaim(ctx); err != nil || n != 0 {
		t.Fatalf("reclaim took %d orders (%v): the stray was never delivered", n, err)
	}
	if err := c.Ensure(ctx, laneConsumer); err != nil {
		t.Fatal(err)
	}
	checkLanesCovered(t, srv, "earlier")
	if got := deliver(t, c, 1); !slices.Equal(got, []string{"stray"}) {
		t.Errorf("after Ensure: %v, want the stray", got)
	}
}

// TestLaneConsumerGone: a consumer of a laned queue deleted under the dispatcher that
// leads it (by hand, or by a replica that made it anew and stopped before it could
// create it again) is ErrConsumerGone, so the dispatcher sets the lanes up again; the
// orders it took are delivered.
func TestLaneConsumerGone(t *testing.T) {
	srv := natstest.Start(t)
	_, _, one := strayLaneConfigs("gone")
	s := openStore(t, srv, one)
	c := laneConsumerOf(t, s, "gone")
	parkAs(t, s, "gone", "t", "", "first")
	deliver(t, c, 1)
	ctx := ctxT(t)
	for _, name := range []string{"dispatch_p0t0", queue.ConsumerName} {
		if err := srv.Stream(t, queue.StreamName("gone")).DeleteConsumer(ctx, name); err != nil {
			t.Fatal(err)
		}
		parkAs(t, s, "gone", "t", "", name)
		nctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := c.Next(nctx)
		cancel()
		if !errors.Is(err, queue.ErrConsumerGone) {
			t.Fatalf("next after %s was deleted: %v, %v; want ErrConsumerGone", name, l, err)
		}
		if err := c.Ensure(ctx, laneConsumer); err != nil {
			t.Fatal(err)
		}
		if got := deliver(t, c, 1); !slices.Equal(got, []string{name}) {
			t.Errorf("after %s was set up again: %v", name, got)
		}
	}
}

// TestLaneHeldAtMostMaxLaneHold: on a queue whose orders of a lane are always some in
// flight, the lane gets its consumer once it has been held for MaxLaneHold.
func TestLaneHeldAtMostMaxLaneHold(t *testing.T) {
	r := newRollingLanes(t, "busy")
	parkAs(t, r.old, "busy", r.stray, "", "in flight")
	ctx := ctxT(t)
	inFlight := lease(t, r.c)
	if _, err := r.cur.Declare(ctx, r.four); err != nil {
		t.Fatal(err)
	}
	hold := laneConsumer
	hold.MaxLaneHold = time.Millisecond
	if err := r.c.Ensure(ctx, hold); err != nil {
		t.Fatal(err)
	}
	if !r.c.LanesHeld() {
		t.Fatal("LanesHeld false while the queue's consumer holds an order of p0t3")
	}
	time.Sleep(10 * time.Millisecond) // past MaxLaneHold, the order still in flight
	r.ensureLaneTaken(t, hold, "past MaxLaneHold")
	settle(t, inFlight)
}

// TestLaneAddedWhileItsOrdersAreHeld: the queue's consumer took a lane without a
// consumer of its own, and holds two of its orders, one being delivered, one handed
// back, when the configuration gets the lane. Neither is handed out beside its
// delivery by the queue's consumer (which redelivers what it handed out whatever its
// filter); once they are settled the lane gets its consumer.
func TestLaneAddedWhileItsOrdersAreHeld(t *testing.T) {
	r := newRollingLanes(t, "held")
	parkAs(t, r.old, "held", r.stray, "", "delivering")
	parkAs(t, r.old, "held", r.stray, "", "handed back")
	ctx := ctxT(t)
	delivering := lease(t, r.c)
	if err := delivering.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := delivering.Start(ctx); err != nil {
		t.Fatal(err)
	}
	lease(t, r.c).HandBack(ctx)
	if _, err := r.cur.Declare(ctx, r.four); err != nil {
		t.Fatal(err)
	}
	if err := r.c.Ensure(ctx, laneConsumer); err != nil {
		t.Fatal(err)
	}
	checkLanesCovered(t, r.srv, "held")
	if !r.c.LanesHeld() {
		t.Error("LanesHeld false while the queue's consumer holds orders of p0t3")
	}
	var got []string
	for {
		nctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		l, err := r.c.Next(nctx)
		cancel()
		if errors.Is(err, queue.ErrNoMessages) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, l.Message().Header.Get("X-Tag"))
		if err := l.Load(ctx); errors.Is(err, queue.ErrFinal) {
			continue // a copy of one settled meanwhile
		} else if err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(got, []string{"handed back"}) {
		t.Fatalf("handed out %q while the delivery went on; want the handed-back order once", got)
	}
	settle(t, delivering)
	r.ensureLaneTaken(t, laneConsumer, "once its orders were settled")
	parkAs(t, r.cur, "held", r.stray, "", "after")
	if got := deliver(t, r.c, 1); !slices.Equal(got, []string{"after"}) {
		t.Errorf("delivered %v, want the order parked after", got)
	}
}
