package console

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"time"
)

// The history: a point every HistoryStep, the last HistoryPoints of them (an hour),
// in memory.
const (
	HistoryStep   = 10 * time.Second
	HistoryPoints = 360
	// historyQueues bounds the queues of a point (the first by name).
	historyQueues = 16
	// maxViewRules bounds the rule rows of a view.
	maxViewRules = 1000
	// maxOutcomes bounds the outcomes of a view and of a history point: the known
	// ones first, then the first others met.
	maxOutcomes = 16
)

func randUint64() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24)
	return binary.BigEndian.Uint64(b[:])
}

// replicaState is what the aggregator keeps of a replica: its newest report, the one
// before (for its current rates) and the one at the last history point.
type replicaState struct {
	last, prev, base *Report
	seenAt           time.Time // local time its newest report arrived
}

// aggregator sums the replicas' reports into rates and keeps the history ring. It is
// safe for concurrent use.
type aggregator struct {
	self string

	mu       sync.Mutex
	replicas map[string]*replicaState
	refused  map[string]time.Time // key → when its report was last refused
	ring     ring
}

func newAggregator(self string, points int) *aggregator {
	return &aggregator{self: self, replicas: map[string]*replicaState{}, refused: map[string]time.Time{},
		ring: ring{points: make([]historyPoint, points)}}
}

// observe takes one round of valid reports, read at now. A replica whose report has
// not changed for ReportTTL is dropped (stopped, or its key expired).
func (a *aggregator) observe(now time.Time, reports []Report) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for i := range reports {
		r := &reports[i]
		st := a.replicas[r.Replica]
		switch {
		case st == nil:
			if len(a.replicas) >= MaxReplicas+1 { // the peers and this process
				continue
			}
			a.replicas[r.Replica] = &replicaState{last: r, seenAt: now}
		case r.Seq > st.last.Seq && r.At.After(st.last.At):
			st.prev, st.last, st.seenAt = st.last, r, now
		case r.Seq != st.last.Seq:
			// Counted from anew (a report that goes back): its rates restart.
			*st = replicaState{last: r, seenAt: now}
		}
	}
	for id, st := range a.replicas {
		if now.Sub(st.seenAt) > ReportTTL {
			delete(a.replicas, id)
		}
	}
	for k, at := range a.refused {
		if now.Sub(at) > ReportTTL {
			delete(a.refused, k)
		}
	}
}

// refuse notes that the report under key k was refused.
func (a *aggregator) refuse(k string, now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.refused[k]; ok || len(a.refused) < MaxReplicas {
		a.refused[k] = now
	}
}

type seriesKey struct{ rule, outcome string }

// rates returns the decisions per second of each series between two reports of one
// replica (nil when they are too close to tell). A counter that went back counts 0.
func rates(from, to *Report) map[seriesKey]float64 {
	dt := to.At.Sub(from.At).Seconds()
	if from == to || dt < 0.1 {
		return nil
	}
	before := make(map[seriesKey]float64, len(from.Decisions))
	for _, d := range from.Decisions {
		before[seriesKey{d.Rule, d.Outcome}] = d.Total
	}
	out := make(map[seriesKey]float64, len(to.Decisions))
	for _, d := range to.Decisions {
		k := seriesKey{d.Rule, d.Outcome}
		out[k] += max(d.Total-before[k], 0) / dt
	}
	return out
}

// historyPoint is one point of the history. Outcomes is nil when no replica had a
// rate yet.
type historyPoint struct {
	At       time.Time          `json:"at"`
	Outcomes map[string]float64 `json:"outcomes"`
	Queues   []QueueSample      `json:"queues"`
}

// ring keeps the last len(points) history points.
type ring struct {
	points []historyPoint
	next   int // where the next point goes
	n      int // points held
}

func (r *ring) add(p historyPoint) {
	if len(r.points) == 0 {
		return
	}
	r.points[r.next] = p
	r.next = (r.next + 1) % len(r.points)
	r.n = min(r.n+1, len(r.points))
}

// all returns the points held, oldest first.
func (r *ring) all() []historyPoint {
	out := make([]historyPoint, 0, r.n)
	start := (r.next - r.n + len(r.points)) % max(len(r.points), 1)
	for i := range r.n {
		out = append(out, r.points[(start+i)%len(r.points)])
	}
	return out
}

// point adds a history point at now: each replica's decisions per second since the
// previous point (or, without a newer report, its current rates), summed, and the
// queues.
func (a *aggregator) point(now time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var outcomes map[string]float64
	for _, st := range a.replicas {
		var rs map[seriesKey]float64
		switch {
		case st.base != nil && st.last.Seq > st.base.Seq:
			rs = rates(st.base, st.last)
		case st.prev != nil:
			rs = rates(st.prev, st.last)
		}
		st.base = st.last
		if rs == nil {
			continue
		}
		if outcomes == nil {
			outcomes = zeroOutcomes()
		}
		for k, v := range rs {
			addOutcome(outcomes, k.outcome, v)
		}
	}
	qs := a.queuesLocked()
	a.ring.add(historyPoint{At: now.UTC(), Outcomes: outcomes, Queues: qs[:min(len(qs), historyQueues)]})
}

// addOutcome adds v to the outcome o of m, unless o is new and m holds maxOutcomes.
func addOutcome(m map[string]float64, o string, v float64) bool {
	if _, ok := m[o]; !ok && len(m) >= maxOutcomes {
		return false
	}
	m[o] += v
	return true
}

func zeroOutcomes() map[string]float64 {
	m := make(map[string]float64, len(knownOutcomes))
	for _, o := range knownOutcomes {
		m[o] = 0
	}
	return m
}

// queuesLocked returns the queues, each as the most recent report shows it (this
// process's first): a queue's depth and outflow are its stream's, not a replica's.
func (a *aggregator) queuesLocked() []QueueSample {
	ids := make([]string, 0, len(a.replicas))
	for id := range a.replicas {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(x, y string) int {
		if (x == a.self) != (y == a.self) {
			if x == a.self {
				return -1
			}
			return 1
		}
		return cmp.Or(a.replicas[y].seenAt.Compare(a.replicas[x].seenAt), cmp.Compare(x, y))
	})
	seen := map[string]bool{}
	var out []QueueSample
	for _, id := range ids {
		for _, q := range a.replicas[id].last.Queues {
			if !seen[q.Name] && len(out) < MaxReportQueues {
				seen[q.Name] = true
				out = append(out, q)
			}
		}
	}
	slices.SortFunc(out, func(x, y QueueSample) int { return cmp.Compare(x.Name, y.Name) })
	return out
}

// replicaView is one replica in the view.
type replicaView struct {
	ID   string `json:"id"`
	Host string `json:"host,omitempty"`
	Self bool   `json:"self"`
	// AgeSeconds: since its newest report arrived.
	AgeSeconds float64 `json:"age_seconds"`
	// PerSecond is its decisions per second over its last two reports; Measuring
	// while it has only one.
	PerSecond float64 `json:"per_second"`
	Measuring bool    `json:"measuring,omitempty"`
}

type ruleRate struct {
	Rule      string  `json:"rule"`
	Outcome   string  `json:"outcome"`
	PerSecond float64 `json:"per_second"`
}

// clusterView is the JSON of GET data/cluster.
type clusterView struct {
	At time.Time `json:"at"`
	// Scope is "cluster" (every replica's reports) or "process" (this one only: no
	// NATS, or the bucket is unreachable: Note says which).
	Scope string `json:"scope"`
	// ReportSeconds: how often each replica reports.
	ReportSeconds float64            `json:"report_seconds"`
	Note          string             `json:"note,omitempty"`
	Replicas      []replicaView      `json:"replicas"`
	Outcomes      map[string]float64 `json:"outcomes"`
	// Rules: decisions per second by rule and outcome, summed over the replicas (at
	// most maxViewRules rows; Truncated when there were more).
	Rules     []ruleRate    `json:"rules"`
	Truncated bool          `json:"truncated,omitempty"`
	Queues    []QueueSample `json:"queues"`
	// Refused: keys of the bucket whose report was not read (see ParseReport).
	Refused int `json:"refused"`
	History struct {
		StepSeconds float64        `json:"step_seconds"`
		Points      []historyPoint `json:"points"`
	} `json:"history"`
}

// view returns the current rates and the history.
func (a *aggregator) view(now time.Time) clusterView {
	a.mu.Lock()
	defer a.mu.Unlock()
	v := clusterView{At: now.UTC(), Outcomes: zeroOutcomes(), Replicas: []replicaView{}, Rules: []ruleRate{}, Refused: len(a.refused)}
	byRule := map[seriesKey]float64{}
	for id, st := range a.replicas {
		rv := replicaView{ID: id, Host: st.last.Host, Self: id == a.self, AgeSeconds: max(now.Sub(st.seenAt), 0).Seconds(),
			Measuring: st.prev == nil}
		if st.prev != nil {
			for k, r := range rates(st.prev, st.last) {
				if addOutcome(v.Outcomes, k.outcome, r) {
					byRule[k] += r
					rv.PerSecond += r
				}
			}
		}
		v.Replicas = append(v.Replicas, rv)
	}
	slices.SortFunc(v.Replicas, func(x, y replicaView) int {
		return cmp.Or(cmp.Compare(x.Host, y.Host), cmp.Compare(x.ID, y.ID))
	})
	for k, r := range byRule {
		v.Rules = append(v.Rules, ruleRate{Rule: k.rule, Outcome: k.outcome, PerSecond: r})
	}
	slices.SortFunc(v.Rules, func(x, y ruleRate) int {
		return cmp.Or(cmp.Compare(x.Rule, y.Rule), cmp.Compare(x.Outcome, y.Outcome))
	})
	if len(v.Rules) > maxViewRules {
		v.Rules, v.Truncated = v.Rules[:maxViewRules], true
	}
	v.Queues = a.queuesLocked()
	if v.Queues == nil {
		v.Queues = []QueueSample{}
	}
	v.History.Points = a.ring.all()
	return v
}
