package console

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/queue"
)

// The cluster view. Every replica with queues (NATS) publishes a Report of its own
// counters every ReportInterval to the key-value bucket ReportsBucket, under a key of
// its own (a random id per process start); the bucket's TTL removes the key of a
// replica that stopped. A console reads every key, sums the decisions of every replica
// and keeps a history of the last hour in memory (History). A process without NATS
// (sluice rls) shows itself only, and the view says so (Scope "process").
//
// Who may write: the bucket lives in sluice's NATS account, and of its users only
// sluice may publish on $KV.sluice_console.> (deploy/nats/accounts.conf). A report is
// still read as hostile input: at most MaxReportBytes (the bucket refuses larger
// values too), strict JSON, at most MaxReportSeries decision series and
// MaxReportQueues queues, names of at most maxNameLen bytes, counts finite and not
// negative, outcomes of a-z and _ (a later sluice may count more outcomes than these
// know: the view keeps at most maxOutcomes of them); anything else drops the report, which is
// logged once per replica and counted in the view (Refused). At most MaxReplicas keys
// are read.
const (
	// ReportsBucket is the key-value bucket of the replicas' reports.
	ReportsBucket = "sluice_console"
	// ReportInterval is how often a replica publishes its report (and reads the
	// others').
	ReportInterval = 5 * time.Second
	// ReportTTL is how long a report lives in the bucket after its last write: a
	// replica that stops publishing leaves the view within ReportTTL.
	ReportTTL = 4 * ReportInterval
	// MaxReportBytes bounds one report, in the bucket and on read.
	MaxReportBytes = 64 << 10
	// MaxReportSeries bounds a report's decision series (rule × outcome).
	MaxReportSeries = 512
	// MaxReportQueues bounds a report's queues.
	MaxReportQueues = 64
	// MaxReplicas bounds the reports a console reads.
	MaxReplicas = 64
	// reportsBucketBytes caps the bucket: every replica's report at its largest.
	reportsBucketBytes = MaxReplicas * MaxReportBytes * 2
	maxNameLen         = 256
	// maxCount bounds a counter or a depth (2^53: an exact float64).
	maxCount = 1 << 53
)

// Report is what one replica publishes: its decision counters as they are (totals
// since it started) and the queues as it sees them.
type Report struct {
	// Replica is the key of the report: a random id per process start.
	Replica string `json:"replica"`
	// Host is the replica's host name, for the operator.
	Host string `json:"host,omitempty"`
	// Seq grows by one with every report of the replica.
	Seq uint64 `json:"seq"`
	// At is when the counters were read, on the replica's clock. Rates of a replica
	// are computed between two of its own reports, so clocks need not agree.
	At        time.Time        `json:"at"`
	Decisions []decisionSeries `json:"decisions"`
	Queues    []QueueSample    `json:"queues,omitempty"`
}

// QueueSample is a queue as a replica sees it: a queue's depth and achieved outflow are
// the stream's, the same on every replica.
type QueueSample struct {
	Name     string `json:"name"`
	Depth    uint64 `json:"depth"`
	MaxDepth int64  `json:"max_depth"`
	// Achieved is the orders per second that left the queue (queue.Info.Achieved);
	// nil until measured.
	Achieved   *float64 `json:"achieved,omitempty"`
	Configured float64  `json:"configured"`
}

// ErrBadReport is wrapped by the errors of a report that is not read.
var ErrBadReport = errors.New("console: bad report")

var knownOutcomes = []string{decide.OutcomeAllowed, decide.OutcomeRejected, decide.OutcomeDeferred,
	decide.OutcomeShadowDenied, decide.OutcomeError, decide.OutcomeQuotaExhausted}

// ParseReport decodes and checks a report read from the bucket (see the limits
// above).
func ParseReport(b []byte) (Report, error) {
	var r Report
	if len(b) > MaxReportBytes {
		return r, fmt.Errorf("%w: %d bytes, at most %d", ErrBadReport, len(b), MaxReportBytes)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("%w: %w", ErrBadReport, err)
	}
	if err := r.check(); err != nil {
		return Report{}, err
	}
	return r, nil
}

func (r *Report) check() error {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrBadReport}, a...)...)
	}
	switch {
	case !validReplicaID(r.Replica):
		return bad("replica id %.40q", r.Replica)
	case len(r.Host) > maxNameLen:
		return bad("host name of %d bytes", len(r.Host))
	case r.At.IsZero():
		return bad("no time")
	case len(r.Decisions) > MaxReportSeries:
		return bad("%d decision series, at most %d", len(r.Decisions), MaxReportSeries)
	case len(r.Queues) > MaxReportQueues:
		return bad("%d queues, at most %d", len(r.Queues), MaxReportQueues)
	}
	for _, d := range r.Decisions {
		if len(d.Rule) > maxNameLen || !validOutcome(d.Outcome) || !count(d.Total) {
			return bad("decision series %.40q %.40q %v", d.Rule, d.Outcome, d.Total)
		}
	}
	for _, q := range r.Queues {
		if q.Name == "" || len(q.Name) > maxNameLen || q.Depth > maxCount || q.MaxDepth > maxCount || !count(q.Configured) ||
			q.Achieved != nil && !count(*q.Achieved) {
			return bad("queue %.40q", q.Name)
		}
	}
	return nil
}

// validOutcome: 1 to 32 of [a-z_], as the outcome label's values are.
func validOutcome(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c == '_') {
			return false
		}
	}
	return true
}

// count reports whether x is a usable count or rate: finite, not negative, exact.
func count(x float64) bool { return x >= 0 && x <= maxCount && !math.IsNaN(x) }

// validReplicaID: what NewReplicaID makes, 1 to 64 of [a-z0-9-] (a valid key).
func validReplicaID(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// Cluster publishes this replica's report and reads every replica's, for the
// console's overview and history. Create it with NewCluster and run it with Run.
type Cluster struct {
	self  string
	host  string
	kv    func(ctx context.Context) (jetstream.KeyValue, error) // nil: this process only
	local func(ctx context.Context) Report
	now   func() time.Time
	log   *slog.Logger
	agg   *aggregator
	every time.Duration // between reports (ReportInterval)
	step  time.Duration // between history points (HistoryStep)

	tickMu sync.Mutex // one Tick at a time
	seq    uint64
	warned map[string]bool // replicas whose bad report was logged

	mu        sync.Mutex
	kvErr     error     // of the latest exchange with the bucket
	lastRound time.Time // of the latest Tick
	lastTick  time.Time // of the latest history point
}

// ClusterOption configures a Cluster.
type ClusterOption func(*Cluster)

// WithReportsBucket makes the view the cluster's: open returns the bucket (for
// example OpenReportsBucket on the queue store's connection), and may fail while NATS
// is unreachable (the view is then this process's, and says why).
func WithReportsBucket(open func(ctx context.Context) (jetstream.KeyValue, error)) ClusterOption {
	return func(c *Cluster) { c.kv = open }
}

// WithInterval publishes and reads every d instead of ReportInterval, and adds a
// history point every 2d (so the history spans HistoryPoints × 2d); d is between 1s
// and ReportTTL/2.
func WithInterval(d time.Duration) ClusterOption {
	return func(c *Cluster) { c.every, c.step = d, 2*d }
}

// WithClusterClock replaces time.Now, for tests.
func WithClusterClock(now func() time.Time) ClusterOption { return func(c *Cluster) { c.now = now } }

// WithClusterLogger sets the logger (default slog.Default()).
func WithClusterLogger(l *slog.Logger) ClusterOption { return func(c *Cluster) { c.log = l } }

// WithHost names the replica for the operator (default: none).
func WithHost(h string) ClusterOption { return func(c *Cluster) { c.host = truncate(h, maxNameLen) } }

// NewCluster returns the cluster view of the replica id (NewReplicaID), whose own
// counters local reads.
func NewCluster(id string, local func(ctx context.Context) Report, opts ...ClusterOption) (*Cluster, error) {
	if !validReplicaID(id) {
		return nil, fmt.Errorf("%w: replica id %q", ErrInvalidOption, id)
	}
	if local == nil {
		return nil, fmt.Errorf("%w: nil local report", ErrInvalidOption)
	}
	c := &Cluster{self: id, local: local, now: time.Now, log: slog.Default(), warned: map[string]bool{},
		every: ReportInterval, step: HistoryStep}
	for _, o := range opts {
		o(c)
	}
	if c.every < time.Second || c.every > ReportTTL/2 {
		return nil, fmt.Errorf("%w: report interval %s is not between 1s and %s", ErrInvalidOption, c.every, ReportTTL/2)
	}
	c.agg = newAggregator(id, HistoryPoints)
	return c, nil
}

// NewReplicaID returns a fresh replica id: 16 random hex digits.
func NewReplicaID() string {
	return fmt.Sprintf("%016x", randUint64())
}

// Run publishes and reads every ReportInterval, and adds a point to the history every
// HistoryStep (see WithInterval), until ctx ends.
func (c *Cluster) Run(ctx context.Context) {
	t := time.NewTicker(c.every)
	defer t.Stop()
	for {
		c.Tick(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Tick does one round of Run: reads this process's counters, publishes them, reads
// the others' and, when HistoryStep has passed since the last point, adds one.
func (c *Cluster) Tick(ctx context.Context) {
	c.tickMu.Lock()
	defer c.tickMu.Unlock()
	c.seq++
	r := c.local(ctx)
	r.Replica, r.Host, r.Seq = c.self, c.host, c.seq
	if r.At.IsZero() {
		r.At = c.now()
	}
	reports := []Report{r}
	if c.kv != nil {
		peers, err := c.exchange(ctx, r)
		c.mu.Lock()
		was := c.kvErr
		c.kvErr = err
		c.mu.Unlock()
		// Said when it starts and when it ends, not every round.
		switch {
		case ctx.Err() != nil:
			// Stopping: an exchange cut short is no trouble to report.
		case err != nil && was == nil:
			c.log.Warn("console: the replicas' reports cannot be exchanged; the console's figures miss the other replicas meanwhile", "err", err)
		case err == nil && was != nil:
			c.log.Info("console: the replicas' reports are exchanged again")
		}
		reports = append(reports, peers...)
	}
	now := c.now()
	c.agg.observe(now, reports)
	c.mu.Lock()
	c.lastRound = now
	due := c.lastTick.IsZero() || now.Sub(c.lastTick) >= c.step
	if due {
		c.lastTick = now
	}
	c.mu.Unlock()
	if due {
		c.agg.point(now)
	}
}

// tickIfDue ticks when ReportInterval has passed since the last round: the console's
// own process-only view, which no Run drives, is ticked by its readers.
func (c *Cluster) tickIfDue(ctx context.Context) {
	c.mu.Lock()
	due := c.lastRound.IsZero() || c.now().Sub(c.lastRound) >= c.every
	c.mu.Unlock()
	if due {
		c.Tick(ctx)
	}
}

// view returns the cluster's figures as they are now.
func (c *Cluster) view() clusterView {
	v := c.agg.view(c.now())
	v.ReportSeconds, v.History.StepSeconds = c.every.Seconds(), c.step.Seconds()
	c.mu.Lock()
	err := c.kvErr
	c.mu.Unlock()
	v.Scope = "cluster"
	switch {
	case c.kv == nil:
		v.Scope = "process"
		v.Note = "This process only: it has no NATS (no queues) to share its counters with the other replicas."
	case err != nil:
		v.Note = "The replicas' reports cannot be exchanged now (" + truncate(err.Error(), 200) +
			"): the figures may miss replicas until NATS answers."
	}
	return v
}

// exchange publishes r and returns the other replicas' valid reports.
func (c *Cluster) exchange(ctx context.Context, r Report) ([]Report, error) {
	ctx, cancel := context.WithTimeout(ctx, c.every)
	defer cancel()
	kv, err := c.kv(ctx)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, err
	}
	if len(b) > MaxReportBytes {
		// A rules set with very many rules: the largest series are kept.
		r.Decisions = r.Decisions[:min(len(r.Decisions), MaxReportSeries/4)]
		if b, err = json.Marshal(r); err != nil {
			return nil, err
		}
	}
	if _, err := kv.Put(ctx, c.self, b); err != nil {
		return nil, fmt.Errorf("publish this replica's report: %w", err)
	}
	keys, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list the reports: %w", err)
	}
	var names []string
	for k := range keys.Keys() {
		names = append(names, k)
		if len(names) > MaxReplicas { // the peers and this replica
			break
		}
	}
	_ = keys.Stop()
	var out []Report
	for _, k := range names {
		if k == c.self {
			continue
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			continue // gone meanwhile
		}
		if err != nil {
			return out, fmt.Errorf("read report %s: %w", k, err)
		}
		p, err := ParseReport(e.Value())
		if err == nil && p.Replica != k {
			err = fmt.Errorf("%w: report of %.40q under the key %.40q", ErrBadReport, p.Replica, k)
		}
		if err != nil {
			c.agg.refuse(k, c.now())
			if !c.warned[k] && len(c.warned) < MaxReplicas {
				c.warned[k] = true
				c.log.Warn("console: a replica's report is refused", "key", truncate(k, 64), "err", err)
			}
			continue
		}
		out = append(out, p)
	}
	return out, nil
}

// OpenReportsBucket creates or opens the reports bucket on js: memory storage (the
// reports are worth nothing after a restart), history 1, ReportTTL, MaxReportBytes per
// value and a byte cap for MaxReplicas of them.
func OpenReportsBucket(ctx context.Context, js jetstream.JetStream, replicas int) (jetstream.KeyValue, error) {
	cfg := jetstream.KeyValueConfig{
		Bucket:       ReportsBucket,
		Description:  "sluice console: each replica's counters",
		History:      1,
		TTL:          ReportTTL,
		MaxValueSize: MaxReportBytes,
		MaxBytes:     reportsBucketBytes,
		Storage:      jetstream.MemoryStorage,
		Replicas:     max(replicas, 1),
	}
	kv, err := js.KeyValue(ctx, ReportsBucket)
	if err == nil {
		return kv, nil
	}
	// Created, not updated: a replica starting beside this one may have just created
	// it and be watching it, and nats-server does not serialise an update of a stream
	// with the creation of a consumer on it.
	kv, err = js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		return js.KeyValue(ctx, ReportsBucket)
	}
	return kv, err
}

// LocalReport returns the function of NewCluster for a process whose decisions g
// gathers and whose queues store holds (either may be nil).
func LocalReport(g prometheus.Gatherer, store interface{ Load() *queue.Store }) func(ctx context.Context) Report {
	return func(ctx context.Context) Report {
		var r Report
		if g != nil {
			r.Decisions, _ = gatherDecisions(g)
		}
		if len(r.Decisions) > MaxReportSeries {
			r.Decisions = r.Decisions[:MaxReportSeries]
		}
		var st *queue.Store
		if store != nil {
			st = store.Load()
		}
		if st == nil {
			return r
		}
		qs := st.Queues()
		slices.SortFunc(qs, func(a, b *queue.Queue) int { return cmp.Compare(a.Name(), b.Name()) })
		for _, q := range qs[:min(len(qs), MaxReportQueues)] {
			ictx, cancel := context.WithTimeout(ctx, ReportInterval/2)
			in, err := q.Info(ictx)
			cancel()
			if err != nil {
				continue
			}
			s := QueueSample{Name: in.Name, Depth: in.Depth, MaxDepth: in.Config.MaxDepth, Configured: in.Config.Outflow.PerSecondFloat()}
			if in.AchievedOver > 0 {
				a := in.Achieved
				s.Achieved = &a
			}
			r.Queues = append(r.Queues, s)
		}
		return r
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
