package console

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)

func report(id string, seq uint64, at time.Time, series ...any) Report {
	r := Report{Replica: id, Seq: seq, At: at}
	for i := 0; i+3 <= len(series); i += 3 {
		r.Decisions = append(r.Decisions, decisionSeries{Rule: series[i].(string), Outcome: series[i+1].(string), Total: series[i+2].(float64)})
	}
	return r
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// Two replicas' counters become rates each between its own two reports (their clocks
// disagree by a minute), summed by outcome and by rule.
func TestAggregatorSumsReplicas(t *testing.T) {
	a := newAggregator("aaaa", 4)
	skew := time.Minute
	a.observe(t0, []Report{
		report("aaaa", 1, t0, "orders", "allowed", 100.0, "orders", "deferred", 10.0),
		report("bbbb", 7, t0.Add(skew), "orders", "allowed", 50.0),
	})
	v := a.view(t0)
	if v.Outcomes["allowed"] != 0 || len(v.Replicas) != 2 || !v.Replicas[0].Measuring {
		t.Fatalf("one report each: %+v", v)
	}
	a.observe(t0.Add(5*time.Second), []Report{
		report("aaaa", 2, t0.Add(5*time.Second), "orders", "allowed", 150.0, "orders", "deferred", 20.0),
		// bbbb's second report is 10 s after its first, on its own clock.
		report("bbbb", 8, t0.Add(skew+10*time.Second), "orders", "allowed", 150.0, "tiny", "rejected", 30.0),
	})
	v = a.view(t0.Add(5 * time.Second))
	// aaaa: allowed 50/5 = 10, deferred 2; bbbb: allowed 100/10 = 10, tiny rejected 3.
	if !near(v.Outcomes["allowed"], 20) || !near(v.Outcomes["deferred"], 2) || !near(v.Outcomes["rejected"], 3) {
		t.Errorf("outcomes %v", v.Outcomes)
	}
	want := map[string]float64{"orders/allowed": 20, "orders/deferred": 2, "tiny/rejected": 3}
	if len(v.Rules) != len(want) {
		t.Errorf("rules %+v", v.Rules)
	}
	for _, r := range v.Rules {
		if !near(want[r.Rule+"/"+r.Outcome], r.PerSecond) {
			t.Errorf("rule %s %s: %v/s, want %v", r.Rule, r.Outcome, r.PerSecond, want[r.Rule+"/"+r.Outcome])
		}
	}
	for _, rv := range v.Replicas {
		if w := map[string]float64{"aaaa": 12, "bbbb": 13}[rv.ID]; !near(rv.PerSecond, w) || rv.Measuring || rv.Self != (rv.ID == "aaaa") {
			t.Errorf("replica %+v, want %v/s", rv, w)
		}
	}
}

// A counter that goes back (a hostile or restarted peer) counts nothing; a report
// with a lower sequence starts the replica anew; a repeated report changes nothing.
func TestAggregatorCountersGoingBack(t *testing.T) {
	a := newAggregator("aaaa", 4)
	a.observe(t0, []Report{report("bbbb", 5, t0, "r", "allowed", 100.0)})
	a.observe(t0.Add(time.Second), []Report{report("bbbb", 5, t0, "r", "allowed", 100.0)}) // the same
	a.observe(t0.Add(5*time.Second), []Report{report("bbbb", 6, t0.Add(5*time.Second), "r", "allowed", 10.0)})
	if v := a.view(t0.Add(5 * time.Second)); v.Outcomes["allowed"] != 0 {
		t.Errorf("a counter that went back: %v/s", v.Outcomes["allowed"])
	}
	a.observe(t0.Add(10*time.Second), []Report{report("bbbb", 1, t0.Add(10*time.Second), "r", "allowed", 0.0)})
	if v := a.view(t0.Add(10 * time.Second)); len(v.Replicas) != 1 || !v.Replicas[0].Measuring {
		t.Errorf("after a lower sequence: %+v", v.Replicas)
	}
}

// A replica whose report stops changing leaves the view after ReportTTL.
func TestAggregatorDropsStoppedReplicas(t *testing.T) {
	a := newAggregator("aaaa", 4)
	a.observe(t0, []Report{report("aaaa", 1, t0), report("bbbb", 1, t0)})
	at := t0.Add(ReportTTL)
	a.observe(at, []Report{report("aaaa", 2, at), report("bbbb", 1, t0)})
	if v := a.view(at); len(v.Replicas) != 2 {
		t.Fatalf("within the TTL: %+v", v.Replicas)
	}
	at = at.Add(time.Second)
	a.observe(at, []Report{report("aaaa", 3, at), report("bbbb", 1, t0)})
	if v := a.view(at); len(v.Replicas) != 1 || v.Replicas[0].ID != "aaaa" {
		t.Errorf("past the TTL: %+v", v.Replicas)
	}
}

// The ring keeps the last N points, oldest first; each point is the replicas' rates
// since the previous point, whatever the number of reports between.
func TestRingHistory(t *testing.T) {
	a := newAggregator("aaaa", 3)
	total := 0.0
	for i := range 6 {
		at := t0.Add(time.Duration(i) * HistoryStep)
		// Two reports per step: 10 decisions/s in step i.
		for j := 1; j <= 2; j++ {
			total += 5 * float64(i+1) * 2
			r := report("aaaa", uint64(2*i+j), at.Add(time.Duration(j)*HistoryStep/2), "r", "allowed", total)
			r.Queues = []QueueSample{{Name: "orders", Depth: uint64(i), Configured: 5}}
			a.observe(r.At, []Report{r})
		}
		a.point(at.Add(HistoryStep))
	}
	ps := a.view(t0).History.Points
	if len(ps) != 3 {
		t.Fatalf("%d points, want 3", len(ps))
	}
	for k, p := range ps {
		i := k + 3
		if !p.At.Equal(t0.Add(time.Duration(i+1)*HistoryStep)) || len(p.Queues) != 1 || p.Queues[0].Depth != uint64(i) {
			t.Errorf("point %d: %+v", k, p)
		}
		if want := 2 * float64(i+1); !near(p.Outcomes["allowed"], want) {
			t.Errorf("point %d: allowed %v/s, want %v", k, p.Outcomes["allowed"], want)
		}
	}
	// The first point of a replica with one report has no rates: null, not zero.
	b := newAggregator("aaaa", 3)
	b.observe(t0, []Report{report("aaaa", 1, t0)})
	b.point(t0)
	if p := b.view(t0).History.Points; len(p) != 1 || p[0].Outcomes != nil {
		t.Errorf("first point %+v", p)
	}
	var empty ring
	empty.add(historyPoint{})
	if len(empty.all()) != 0 {
		t.Error("a ring of no points holds one")
	}
}

// Outcomes this sluice does not know (a newer replica's) are shown, at most
// maxOutcomes of them in all.
func TestAggregatorOutcomesBounded(t *testing.T) {
	a := newAggregator("aaaa", 2)
	var series0, series1 []any
	for i := range 26 {
		o := "new_" + strings.Repeat("x", i+1)
		series0 = append(series0, "r", o, 0.0)
		series1 = append(series1, "r", o, 10.0)
	}
	a.observe(t0, []Report{report("bbbb", 1, t0, series0...)})
	a.observe(t0.Add(time.Second), []Report{report("bbbb", 2, t0.Add(time.Second), series1...)})
	a.point(t0.Add(time.Second))
	v := a.view(t0.Add(time.Second))
	if len(v.Outcomes) != maxOutcomes || len(v.History.Points[0].Outcomes) != maxOutcomes {
		t.Errorf("%d outcomes in the view, %d in the point, want %d", len(v.Outcomes), len(v.History.Points[0].Outcomes), maxOutcomes)
	}
	if len(v.Rules) != maxOutcomes-len(knownOutcomes) || !near(v.Replicas[0].PerSecond, 10*float64(maxOutcomes-len(knownOutcomes))) {
		t.Errorf("rules %d, per second %v", len(v.Rules), v.Replicas[0].PerSecond)
	}
}

// The queues come from this process's report first, then from the newest of the
// others, each queue once.
func TestAggregatorQueues(t *testing.T) {
	a := newAggregator("aaaa", 3)
	self := report("aaaa", 1, t0)
	self.Queues = []QueueSample{{Name: "orders", Depth: 5}}
	old := report("bbbb", 1, t0)
	old.Queues = []QueueSample{{Name: "orders", Depth: 1}, {Name: "tiny", Depth: 1}}
	a.observe(t0, []Report{old})
	newer := report("cccc", 1, t0)
	newer.Queues = []QueueSample{{Name: "tiny", Depth: 9}}
	a.observe(t0.Add(time.Second), []Report{self, newer})
	qs := a.view(t0).Queues
	if len(qs) != 2 || qs[0].Name != "orders" || qs[0].Depth != 5 || qs[1].Name != "tiny" || qs[1].Depth != 9 {
		t.Errorf("queues %+v", qs)
	}
}

func TestParseReport(t *testing.T) {
	good := report("0123456789abcdef", 3, t0, "orders", "allowed", 12.0)
	good.Queues = []QueueSample{{Name: "orders", Depth: 3, Configured: 5}}
	b, _ := json.Marshal(good)
	if r, err := ParseReport(b); err != nil || r.Replica != good.Replica || len(r.Decisions) != 1 {
		t.Fatalf("good report: %+v %v", r, err)
	}
	many := func(n int) string {
		s := make([]string, n)
		for i := range s {
			s[i] = `{"rule":"r","outcome":"allowed","total":1}`
		}
		return strings.Join(s, ",")
	}
	for name, in := range map[string]string{
		"not JSON":          `{"replica":`,
		"no replica":        `{"seq":1,"at":"2026-12-01T10:00:00Z"}`,
		"bad replica":       `{"replica":"../x","seq":1,"at":"2026-12-01T10:00:00Z"}`,
		"no time":           `{"replica":"ab","seq":1}`,
		"unknown outcome":   `{"replica":"ab","at":"2026-12-01T10:00:00Z","decisions":[{"rule":"r","outcome":"<script>","total":1}]}`,
		"negative count":    `{"replica":"ab","at":"2026-12-01T10:00:00Z","decisions":[{"rule":"r","outcome":"allowed","total":-1}]}`,
		"huge count":        `{"replica":"ab","at":"2026-12-01T10:00:00Z","decisions":[{"rule":"r","outcome":"allowed","total":1e300}]}`,
		"long rule":         `{"replica":"ab","at":"2026-12-01T10:00:00Z","decisions":[{"rule":"` + strings.Repeat("x", 300) + `","outcome":"allowed","total":1}]}`,
		"too many series":   `{"replica":"ab","at":"2026-12-01T10:00:00Z","decisions":[` + many(MaxReportSeries+1) + `]}`,
		"unnamed queue":     `{"replica":"ab","at":"2026-12-01T10:00:00Z","queues":[{"name":"","depth":1}]}`,
		"negative outflow":  `{"replica":"ab","at":"2026-12-01T10:00:00Z","queues":[{"name":"q","configured":-5}]}`,
		"negative achieved": `{"replica":"ab","at":"2026-12-01T10:00:00Z","queues":[{"name":"q","achieved":-5}]}`,
		"too large":         `{"replica":"ab","host":"` + strings.Repeat("x", MaxReportBytes) + `"}`,
	} {
		if _, err := ParseReport([]byte(in)); !errors.Is(err, ErrBadReport) {
			t.Errorf("%s: %v, want ErrBadReport", name, err)
		}
	}
}

// FuzzParseReport: whatever a peer writes, ParseReport answers a report within the
// limits or ErrBadReport, and the aggregator takes any accepted report.
func FuzzParseReport(f *testing.F) {
	b, _ := json.Marshal(report("0123456789abcdef", 3, t0, "orders", "allowed", 12.0))
	f.Add(b)
	f.Add([]byte(`{"replica":"ab","at":"2026-12-01T10:00:00Z","queues":[{"name":"q","depth":1,"achieved":2}]}`))
	f.Add([]byte(`{"replica":"ab","seq":18446744073709551615,"at":"9999-12-31T23:59:59Z"}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := ParseReport(in)
		if err != nil {
			if !errors.Is(err, ErrBadReport) {
				t.Fatalf("error %v is not ErrBadReport", err)
			}
			return
		}
		if len(r.Decisions) > MaxReportSeries || len(r.Queues) > MaxReportQueues || !validReplicaID(r.Replica) {
			t.Fatalf("accepted out of bounds: %+v", r)
		}
		a := newAggregator("self", 2)
		a.observe(t0, []Report{r})
		r.Seq++
		r.At = r.At.Add(time.Second)
		a.observe(t0.Add(time.Second), []Report{r})
		a.point(t0.Add(time.Second))
		v := a.view(t0.Add(time.Second))
		if _, err := json.Marshal(v); err != nil {
			t.Fatalf("the view of an accepted report does not encode: %v", err)
		}
	})
}
