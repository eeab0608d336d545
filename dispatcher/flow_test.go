package dispatcher_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// parkFlow parks n orders of flow key value flow, with idempotency keys
// prefix0…prefix{n-1}.
func parkFlow(t *testing.T, s *queue.Store, queueName, flow, prefix string, n int) {
	t.Helper()
	for i := range n {
		_, err := s.Park(ctxT(t), &queue.Request{Queue: queueName, Method: "POST", Path: "/orders", Flow: flow,
			Header: http.Header{"Idempotency-Key": {fmt.Sprintf("%s%d", prefix, i)}}})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// arrivals returns the first arrival of each idempotency key with the prefix.
func arrivals(ds *downstream, prefix string) []time.Time {
	var out []time.Time
	seen := map[string]bool{}
	for _, h := range ds.all() {
		if strings.HasPrefix(h.key, prefix) && !seen[h.key] {
			seen[h.key] = true
			out = append(out, h.at)
		}
	}
	return out
}

// flowQueue declares a queue with an outflow of 100/s, max_in_flight 8 and flow, on
// a NATS server of its own, delivering to a recording downstream.
func flowQueue(t *testing.T, name string, flow queueconfig.FlowBy) (*natstest.Server, *downstream, queueconfig.Config, *queue.Store, *queue.Queue) {
	t.Helper()
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig(name, ds.URL)
	cfg.Outflow, cfg.MaxInFlight, cfg.FlowBy = limiter.PerSecond(100), 8, flow
	store, q := openStore(t, srv.Conn, cfg)
	return srv, ds, cfg, store, q
}

// TestFlowByKeyRates: merchant A floods a queue whose outflow (100/s) is far above the
// per-key rate (5/s); merchant B's orders, parked after the whole flood, still leave
// at B's own 5/s instead of waiting behind A's (which a FIFO at 5/s would make them
// do for 20 s), and neither key ever exceeds ceil(5 × Δt) + 1 starts in any window
// Δt, measured at the downstream.
func TestFlowByKeyRates(t *testing.T) {
	srv, ds, cfg, store, _ := flowQueue(t, "flow", queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5), MaxInFlight: 2})
	const flood, few = 100, 10
	parkFlow(t, store, cfg.Name, "merchant-a", "a", flood)
	parkFlow(t, store, cfg.Name, "merchant-b", "b", few)
	startReplica(t, srv, cfg, "r1")
	waitFor(t, "B's orders", 60*time.Second, func() bool { return len(arrivals(ds, "b")) == few })
	a, b := arrivals(ds, "a"), arrivals(ds, "b")
	t.Logf("when B's %d orders were delivered (in %s), %d of A's %d were", few, b[len(b)-1].Sub(b[0]).Round(time.Millisecond), len(a), flood)
	if len(a) >= flood {
		t.Errorf("all of A's flood was delivered before B's orders: B waited behind A")
	}
	for key, times := range map[string][]time.Time{"A": a, "B": b} {
		n, bound, window := fullestWindow(cfg.FlowBy.Rate, times)
		t.Logf("key %s: fullest window %s held %d starts (bound %d)", key, window.Round(time.Millisecond), n, bound)
		if n > bound {
			t.Errorf("key %s: %d starts within %s, more than ceil(rate × Δt) + 1 = %d", key, n, window, bound)
		}
	}
	for _, h := range ds.all() {
		if v := h.header.Get(queue.HeaderFlowKey); v != "" {
			t.Errorf("the flow key reached the downstream: %s: %s", queue.HeaderFlowKey, v)
		}
	}
}

// TestFlowByMaxInFlight: a key with max_in_flight 2 never has more than 2 deliveries
// running at once, while another key's run beside them.
func TestFlowByMaxInFlight(t *testing.T) {
	srv := natstest.Start(t)
	var (
		mu         sync.Mutex
		running    = map[string]int{}
		most       = map[string]int{}
		concurrent atomic.Int64
		mostAll    atomic.Int64
	)
	ds := newDownstream(t, func(h hit, n int) (int, http.Header, string) {
		k := h.key[:1]
		mu.Lock()
		running[k]++
		most[k] = max(most[k], running[k])
		mu.Unlock()
		c := concurrent.Add(1)
		for m := mostAll.Load(); c > m && !mostAll.CompareAndSwap(m, c); m = mostAll.Load() {
		}
		time.Sleep(150 * time.Millisecond)
		concurrent.Add(-1)
		mu.Lock()
		running[k]--
		mu.Unlock()
		return http.StatusOK, nil, "ok"
	})
	cfg := baseConfig("flowmax", ds.URL)
	cfg.Outflow, cfg.MaxInFlight = limiter.PerSecond(200), 8
	cfg.FlowBy = queueconfig.FlowBy{From: "header:X-Merchant", MaxInFlight: 2}
	store, _ := openStore(t, srv.Conn, cfg)
	parkFlow(t, store, cfg.Name, "merchant-a", "a", 20)
	parkFlow(t, store, cfg.Name, "merchant-b", "b", 20)
	startReplica(t, srv, cfg, "r1")
	waitFor(t, "every order", 60*time.Second, func() bool { return len(ds.keys()) == 40 })
	mu.Lock()
	defer mu.Unlock()
	t.Logf("most deliveries running at once: key a %d, key b %d, both %d", most["a"], most["b"], mostAll.Load())
	if most["a"] > 2 || most["b"] > 2 {
		t.Errorf("a key had more than its max_in_flight 2 deliveries running: a %d, b %d", most["a"], most["b"])
	}
}

// TestFlowByTenThousandKeys: 10,000 keys with one order each are all delivered: a key
// costs a hash in the stored order and, while it has an order starting, one leaky
// bucket that expires once idle.
func TestFlowByTenThousandKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("parks and delivers 10,000 orders")
	}
	srv := natstest.Start(t)
	ds := newDownstream(t, func(h hit, n int) (int, http.Header, string) { return http.StatusOK, nil, "" })
	cfg := baseConfig("flowmany", ds.URL)
	cfg.Outflow, cfg.MaxInFlight = limiter.PerSecond(1000), 32
	cfg.FlowBy = queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(1), MaxInFlight: 1}
	cfg.MaxDepth = 20_000
	store, q := openStore(t, srv.Conn, cfg)
	const keys = 10_000
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < keys; i += 8 {
				_, err := store.Park(ctxT(t), &queue.Request{Queue: cfg.Name, Method: "POST", Path: "/orders",
					Flow: fmt.Sprintf("merchant-%d", i), Header: http.Header{"Idempotency-Key": {fmt.Sprintf("k%d", i)}}})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	lim := limiter.NewMemory()
	startedAt := time.Now()
	startReplica(t, srv, cfg, "r1", dispatcher.WithFlowLimiter(lim))
	// The dispatcher's reports of its keys, read once a second meanwhile.
	var most, reads int
	var readTime time.Duration
	nextRead := time.Now()
	waitFor(t, "every order", 5*time.Minute, func() bool {
		if now := time.Now(); now.After(nextRead) {
			nextRead = now.Add(time.Second)
			if r, err := q.FlowStats(ctxT(t)); err == nil {
				most, reads, readTime = max(most, len(r.Keys)), reads+1, readTime+time.Since(now)
			}
		}
		return len(ds.keys()) == keys
	})
	t.Logf("%d keys, one order each: delivered in %s; flow limiter tracks %d keys; the reports held at most %d keys (%d reads, %s each on average)",
		keys, time.Since(startedAt).Round(time.Millisecond), lim.Len(), most, reads, (readTime / time.Duration(max(reads, 1))).Round(time.Microsecond))
	if most == 0 {
		t.Error("no report of the keys being delivered")
	}
	if n := len(ds.all()); n != keys {
		t.Errorf("%d deliveries for %d orders", n, keys)
	}
}

// TestFlowByPauseHoldsOnlyThatKey: an operator's pause of one flow key holds its
// orders while another key's are delivered; its resume lets them go; a pinned rate
// replaces the queue's flow_by rate for that key alone.
func TestFlowByPauseHoldsOnlyThatKey(t *testing.T) {
	srv, ds, cfg, store, q := flowQueue(t, "flowpause", queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(50)})
	if err := q.SetFlow(ctxT(t), "merchant-a", queue.FlowControl{PausedUntil: time.Now().Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	if err := q.SetFlow(ctxT(t), "merchant-c", queue.FlowControl{Rate: limiter.PerSecond(2)}); err != nil {
		t.Fatal(err)
	}
	if fc, err := q.Flow(ctxT(t), "merchant-a"); err != nil || !fc.Paused(time.Now()) {
		t.Fatalf("merchant-a's settings: %+v, %v", fc, err)
	}
	parkFlow(t, store, cfg.Name, "merchant-a", "a", 10)
	parkFlow(t, store, cfg.Name, "merchant-b", "b", 10)
	parkFlow(t, store, cfg.Name, "merchant-c", "c", 6)
	startReplica(t, srv, cfg, "r1")
	waitFor(t, "B's and C's orders", 60*time.Second, func() bool {
		return len(arrivals(ds, "b")) == 10 && len(arrivals(ds, "c")) == 6
	})
	if n := len(arrivals(ds, "a")); n != 0 {
		t.Fatalf("%d of the paused key's orders were delivered", n)
	}
	// The dispatcher reports the paused key's 10 orders as its depth, and the keys
	// it delivered as started lately (their orders gone from their depth).
	a, b := store.FlowKeyFor(cfg, "merchant-a"), store.FlowKeyFor(cfg, "merchant-b")
	var report queue.FlowReport
	waitFor(t, "the report of the paused key's depth", 30*time.Second, func() bool {
		var err error
		report, err = q.FlowStats(ctxT(t))
		return err == nil && report.Keys[a].Depth == 10
	})
	if st := report.Keys[b]; st.Depth != 0 || st.PerSecond <= 0 || report.Reports != 1 {
		t.Errorf("the delivered key: %+v (want depth 0, a rate) in %d reports", st, report.Reports)
	}
	t.Logf("report while merchant-a is paused: a %+v, b %+v", report.Keys[a], report.Keys[b])
	n, bound, window := fullestWindow(limiter.PerSecond(2), arrivals(ds, "c"))
	t.Logf("pinned rate 2/s: fullest window %s held %d starts (bound %d)", window.Round(time.Millisecond), n, bound)
	if n > bound {
		t.Errorf("the key with a pinned rate of 2/s had %d starts within %s (bound %d)", n, window, bound)
	}
	if err := q.SetFlow(ctxT(t), "merchant-a", queue.FlowControl{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "A's orders after the resume", 60*time.Second, func() bool { return len(arrivals(ds, "a")) == 10 })
	waitFor(t, "the paused key's depth to go once delivered", 30*time.Second, func() bool {
		r, err := q.FlowStats(ctxT(t))
		return err == nil && r.Keys[a].Depth == 0
	})
	if flows, err := q.Flows(ctxT(t)); err != nil || len(flows) != 1 {
		t.Errorf("settings left: %v, %v (want merchant-c's pinned rate alone)", flows, err)
	}
}

// TestFlowByRedisLimiter: with a Redis flow limiter (limiter/redisstore on a real
// Redis) the keys keep their rate, and their state vanishes from Redis once they are
// idle (every key has a TTL).
func TestFlowByRedisLimiter(t *testing.T) {
	rs := redistest.Start(t)
	lim, err := redisstore.New(rs.Client(), redisstore.WithTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lim.Close() })
	srv, ds, cfg, store, _ := flowQueue(t, "flowredis", queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)})
	parkFlow(t, store, cfg.Name, "merchant-a", "a", 10)
	parkFlow(t, store, cfg.Name, "merchant-b", "b", 10)
	startReplica(t, srv, cfg, "r1", dispatcher.WithFlowLimiter(lim))
	waitFor(t, "every order", 60*time.Second, func() bool { return len(ds.keys()) == 20 })
	for _, key := range []string{"a", "b"} {
		n, bound, window := fullestWindow(cfg.FlowBy.Rate, arrivals(ds, key))
		if n > bound {
			t.Errorf("key %s: %d starts within %s (bound %d)", key, n, window, bound)
		}
	}
	waitFor(t, "the idle keys to leave Redis", 30*time.Second, func() bool {
		n, err := rs.Client().DBSize(ctxT(t)).Result()
		return err == nil && n == 0
	})
}

// TestFlowByRedisLimiterAcrossFailover: two dispatchers, as two processes would, each
// with a Redis flow limiter of its own on one Redis. The first delivers a key's first
// order and dies; the second takes the queue over and keeps the key's pace from the
// shared bucket: its first start of the key is one key interval after the dead one's
// last (a flow limiter in memory would start it as soon as the order came back, a
// fail-over later: 3 s, not 10, in a run with memory limiters).
func TestFlowByRedisLimiterAcrossFailover(t *testing.T) {
	rs := redistest.Start(t)
	newLim := func() limiter.Limiter {
		lim, err := redisstore.New(rs.Client(), redisstore.WithTimeout(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = lim.Close() })
		return lim
	}
	rate := limiter.Rate{Count: 1, Period: 10 * time.Second}
	srv, ds, cfg, store, _ := flowQueue(t, "flowfailover", queueconfig.FlowBy{From: "header:X-Merchant", Rate: rate})
	parkFlow(t, store, cfg.Name, "merchant-a", "a", 2)
	r1 := startReplica(t, srv, cfg, "r1", dispatcher.WithFlowLimiter(newLim()))
	waitFor(t, "the first order", 30*time.Second, func() bool { return len(arrivals(ds, "a")) == 1 })
	startReplica(t, srv, cfg, "r2", dispatcher.WithFlowLimiter(newLim()))
	r1.kill()
	waitFor(t, "the second order, from r2", 60*time.Second, func() bool { return len(arrivals(ds, "a")) == 2 })
	a := arrivals(ds, "a")
	var by []string
	for _, h := range ds.all() {
		by = append(by, h.header.Get("X-Test-Replica"))
	}
	gap := a[1].Sub(a[0])
	t.Logf("the key's two starts, by %v: %s apart (the key's interval %s)", by, gap.Round(time.Millisecond), rate.Interval())
	if by[len(by)-1] != "r2" {
		t.Fatalf("the second order was delivered by %v, not by the replica that took over", by)
	}
	// The arrivals are the starts plus the request's way to the downstream, which
	// may differ by some milliseconds between the two.
	if gap < rate.Interval()-250*time.Millisecond {
		t.Errorf("the key's starts across the fail-over were %s apart, less than its interval %s", gap, rate.Interval())
	}
}
