package console

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// fakeReplica is a replica's counters that a test moves on.
type fakeReplica struct {
	mu      sync.Mutex
	allowed float64
	queues  []QueueSample
	now     func() time.Time
}

func (f *fakeReplica) add(n float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.allowed += n
}

func (f *fakeReplica) report(context.Context) Report {
	f.mu.Lock()
	defer f.mu.Unlock()
	return Report{At: f.now(), Queues: f.queues, Decisions: []decisionSeries{{Rule: "orders", Outcome: decide.OutcomeAllowed, Total: f.allowed}}}
}

// The JSON of data/cluster, as the page reads it.
type clusterJSON struct {
	Scope    string             `json:"scope"`
	Note     string             `json:"note"`
	Outcomes map[string]float64 `json:"outcomes"`
	Replicas []struct {
		ID        string  `json:"id"`
		Host      string  `json:"host"`
		Self      bool    `json:"self"`
		PerSecond float64 `json:"per_second"`
	} `json:"replicas"`
	Rules []struct {
		Rule      string  `json:"rule"`
		Outcome   string  `json:"outcome"`
		PerSecond float64 `json:"per_second"`
	} `json:"rules"`
	Queues []struct {
		Name       string   `json:"name"`
		Depth      uint64   `json:"depth"`
		Achieved   *float64 `json:"achieved"`
		Configured float64  `json:"configured"`
	} `json:"queues"`
	Refused int `json:"refused"`
	History struct {
		StepSeconds float64 `json:"step_seconds"`
		Points      []struct {
			At       time.Time          `json:"at"`
			Outcomes map[string]float64 `json:"outcomes"`
			Queues   []struct {
				Name  string `json:"name"`
				Depth uint64 `json:"depth"`
			} `json:"queues"`
		} `json:"points"`
	} `json:"history"`
}

func (f *fixture) cluster(cookie string) clusterJSON {
	f.t.Helper()
	w := f.do(req{method: "GET", target: "/console/data/cluster", cookie: cookie})
	var v clusterJSON
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		f.t.Fatalf("data/cluster: %d %s", w.Code, w.Body)
	}
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		f.t.Fatalf("data/cluster: %v\n%s", err, w.Body)
	}
	return v
}

// reportsBucket starts a NATS server and returns it with the opener of its reports
// bucket.
func reportsBucket(t *testing.T) (*natstest.Server, func(ctx context.Context) (jetstream.KeyValue, error)) {
	t.Helper()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	return srv, func(ctx context.Context) (jetstream.KeyValue, error) { return OpenReportsBucket(ctx, js, 1) }
}

// Two replicas share one NATS bucket: the console of the first shows both, their
// decisions summed, the queues, and a history point per step; a hostile value in the
// bucket is counted and changes nothing else; a stopped replica leaves.
func TestClusterData(t *testing.T) {
	_, open := reportsBucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var clock atomic.Pointer[time.Time]
	start := t0
	clock.Store(&start)
	now := func() time.Time { return *clock.Load() }
	a, b := &fakeReplica{now: now}, &fakeReplica{now: now}
	a.queues = []QueueSample{{Name: "orders", Depth: 7, MaxDepth: 100, Configured: 5}}
	quiet := slog.New(slog.DiscardHandler)
	ca, err := NewCluster("aaaaaaaaaaaaaaaa", a.report, WithReportsBucket(open), WithClusterClock(now), WithHost("host-a"), WithClusterLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	cb, err := NewCluster("bbbbbbbbbbbbbbbb", b.report, WithReportsBucket(open), WithClusterClock(now), WithHost("host-b"), WithClusterLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, nil, WithCluster(ca))
	cookie, _ := f.login()

	step := func(d time.Duration, na, nb float64) {
		a.add(na)
		b.add(nb)
		n := now().Add(d)
		clock.Store(&n)
		cb.Tick(ctx) // b first: a reads b's newest report
		ca.Tick(ctx)
	}
	step(0, 0, 0)
	v := f.cluster(cookie)
	if v.Scope != "cluster" || v.Note != "" || len(v.Replicas) != 2 {
		t.Fatalf("first round: %+v", v)
	}
	step(5*time.Second, 50, 100) // a 10/s, b 20/s
	v = f.cluster(cookie)
	if v.Outcomes["allowed"] != 30 || len(v.Rules) != 1 || v.Rules[0].PerSecond != 30 {
		t.Errorf("summed: outcomes %v rules %+v", v.Outcomes, v.Rules)
	}
	for _, r := range v.Replicas {
		if want := map[string]float64{"host-a": 10, "host-b": 20}[r.Host]; r.PerSecond != want || r.Self != (r.Host == "host-a") {
			t.Errorf("replica %+v, want %v/s", r, want)
		}
	}
	if len(v.Queues) != 1 || v.Queues[0].Name != "orders" || v.Queues[0].Depth != 7 || v.Queues[0].Configured != 5 || v.Queues[0].Achieved != nil {
		t.Errorf("queues %+v", v.Queues)
	}
	step(5*time.Second, 50, 100) // 10 s after the first point: a second one
	v = f.cluster(cookie)
	if ps := v.History.Points; v.History.StepSeconds != 10 || len(ps) != 2 || ps[0].Outcomes != nil || ps[1].Outcomes["allowed"] != 30 ||
		len(ps[1].Queues) != 1 || ps[1].Queues[0].Depth != 7 {
		t.Errorf("history %+v", v.History)
	}

	// Hostile values under other keys: refused, counted, nothing else changes.
	kv, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for k, val := range map[string]string{
		"evil1": `{"replica":"evil1","at":"2026-12-01T10:00:00Z","decisions":[{"rule":"x","outcome":"allowed","total":1e300}]}`,
		"evil2": `not json <script>alert(1)</script>`,
		"evil3": `{"replica":"aaaaaaaaaaaaaaaa","seq":99,"at":"2026-12-01T10:00:00Z"}`, // posing as a
	} {
		if _, err := kv.Put(ctx, k, []byte(val)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := kv.Put(ctx, "evil4", make([]byte, MaxReportBytes+1)); err == nil {
		t.Error("the bucket took a value over MaxReportBytes")
	}
	step(5*time.Second, 50, 100)
	v = f.cluster(cookie)
	if v.Refused != 3 || len(v.Replicas) != 2 || v.Outcomes["allowed"] != 30 {
		t.Errorf("with hostile values: refused %d, replicas %+v, outcomes %v", v.Refused, v.Replicas, v.Outcomes)
	}

	// b stops: within ReportTTL it is gone from the view.
	for range int(ReportTTL/ReportInterval) + 1 {
		a.add(50)
		n := now().Add(ReportInterval)
		clock.Store(&n)
		ca.Tick(ctx)
	}
	v = f.cluster(cookie)
	if len(v.Replicas) != 1 || v.Replicas[0].Host != "host-a" || v.Outcomes["allowed"] != 10 {
		t.Errorf("after b stopped: replicas %+v outcomes %v", v.Replicas, v.Outcomes)
	}
}

// Without NATS the console shows this process, read when the page asks, and says so;
// LocalReport reads the decisions from the metrics and the queues from the store.
func TestClusterDataProcessOnly(t *testing.T) {
	f := newFixture(t, nil)
	cookie, _ := f.login()
	v := f.cluster(cookie)
	if v.Scope != "process" || !strings.Contains(v.Note, "This process only") || len(v.Replicas) != 1 || !v.Replicas[0].Self {
		t.Fatalf("process only: %+v", v)
	}
	f.advance(ReportInterval)
	if v = f.cluster(cookie); len(v.Rules) != 2 || len(v.History.Points) != 1 {
		t.Errorf("second reading: rules %+v, history %+v", v.Rules, v.History)
	}
	if w := f.do(req{method: "GET", target: "/console/data/cluster?history=0", cookie: cookie}); w.Code != 200 || !strings.Contains(w.Body.String(), `"points": []`) {
		t.Errorf("without the history: %d %s", w.Code, w.Body)
	}
	if w := f.do(req{method: "GET", target: "/console/data/cluster"}); w.Code != 401 {
		t.Errorf("without a session: %d", w.Code)
	}

	_, store := parktest.Store(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(10), MaxDepth: 50, Downstream: "http://127.0.0.1:1"})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := store.Park(ctx, &queue.Request{Queue: "orders", Rule: "orders", Method: "POST", Path: "/v1/orders"}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m, err := decide.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	m.Count("orders", decide.OutcomeDeferred)
	var p atomic.Pointer[queue.Store]
	p.Store(store)
	r := LocalReport(reg, &p)(ctx)
	if len(r.Decisions) == 0 || len(r.Queues) != 1 || r.Queues[0].Depth != 1 || r.Queues[0].MaxDepth != 50 || r.Queues[0].Configured != 10 {
		t.Errorf("local report %+v", r)
	}
	found := false
	for _, d := range r.Decisions {
		found = found || d.Rule == "orders" && d.Outcome == decide.OutcomeDeferred && d.Total == 1
	}
	if !found {
		t.Errorf("local report's decisions %+v", r.Decisions)
	}
}

// NATS down: the view stays the cluster's and says that reports cannot be exchanged.
func TestClusterDataNATSDown(t *testing.T) {
	srv, open := reportsBucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	a := &fakeReplica{now: time.Now}
	c, err := NewCluster("aaaaaaaaaaaaaaaa", a.report, WithClusterLogger(slog.New(slog.DiscardHandler)), WithReportsBucket(open))
	if err != nil {
		t.Fatal(err)
	}
	c.Tick(ctx)
	srv.Shutdown()
	c.Tick(ctx)
	v := c.view()
	if v.Scope != "cluster" || !strings.Contains(v.Note, "cannot be exchanged") || len(v.Replicas) != 1 {
		t.Errorf("NATS down: %+v", v)
	}
}

func TestNewCluster(t *testing.T) {
	local := (&fakeReplica{now: time.Now}).report
	for name, tc := range map[string]struct {
		id    string
		local func(context.Context) Report
		opts  []ClusterOption
	}{
		"bad id":         {"Not/An-Id", local, nil},
		"empty id":       {"", local, nil},
		"no local":       {"ab", nil, nil},
		"short interval": {"ab", local, []ClusterOption{WithInterval(100 * time.Millisecond)}},
		"long interval":  {"ab", local, []ClusterOption{WithInterval(time.Minute)}},
	} {
		if _, err := NewCluster(tc.id, tc.local, tc.opts...); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	if id := NewReplicaID(); !validReplicaID(id) || id == NewReplicaID() {
		t.Errorf("replica id %q", id)
	}
}

// A bucket flooded with keys: at most MaxReplicas reports are read, and the view
// stays within its bounds.
func TestClusterManyKeys(t *testing.T) {
	_, open := reportsBucket(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	kv, err := open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := range MaxReplicas + 36 {
		id := fmt.Sprintf("peer-%03d", i)
		b, _ := json.Marshal(report(id, 1, t0, "r", "allowed", 1.0))
		if _, err := kv.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	c, err := NewCluster("aaaaaaaaaaaaaaaa", (&fakeReplica{now: time.Now}).report, WithReportsBucket(open),
		WithClusterLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	c.Tick(ctx)
	if v := c.view(); len(v.Replicas) > MaxReplicas+1 || len(v.Replicas) < MaxReplicas/2 || v.Note != "" {
		t.Errorf("%d replicas in the view (note %q), want at most %d", len(v.Replicas), v.Note, MaxReplicas+1)
	}
}

// On a 3-node JetStream cluster the bucket is replicated (R3, in memory) and two
// replicas connected to different nodes see each other.
func TestReportsBucketOnCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster")
	}
	cl := natstest.StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var cs []*Cluster
	for i, id := range []string{"aaaaaaaaaaaaaaaa", "bbbbbbbbbbbbbbbb"} {
		js, err := jetstream.New(cl.Connect(t))
		if err != nil {
			t.Fatal(err)
		}
		c, err := NewCluster(id, (&fakeReplica{now: time.Now}).report, WithClusterLogger(slog.New(slog.DiscardHandler)),
			WithReportsBucket(func(ctx context.Context) (jetstream.KeyValue, error) { return OpenReportsBucket(ctx, js, 3) }))
		if err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
		if i == 0 {
			kv, err := OpenReportsBucket(ctx, js, 3)
			if err != nil {
				t.Fatal(err)
			}
			st, err := kv.Status(ctx)
			if err != nil || st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Replicas != 3 ||
				st.(*jetstream.KeyValueBucketStatus).StreamInfo().Config.Storage != jetstream.MemoryStorage || st.TTL() != ReportTTL {
				t.Fatalf("bucket %+v %v", st, err)
			}
		}
	}
	cs[0].Tick(ctx)
	cs[1].Tick(ctx)
	cs[0].Tick(ctx)
	if v := cs[0].view(); len(v.Replicas) != 2 || v.Note != "" {
		t.Errorf("view on a cluster: %+v", v)
	}
}
