package queue

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

func TestLaneTokens(t *testing.T) {
	cfg := queueconfig.Config{FairBy: "header:X-Tenant", Priorities: queueconfig.Priorities{Levels: []string{"a", "b", "c"}}}.WithDefaults()
	seen := map[string]bool{}
	for _, l := range lanesOf(cfg) {
		tok := l.token()
		back, ok := parseLane(tok)
		if !ok || back != l || seen[tok] {
			t.Errorf("lane %+v: token %q parses to %+v, %v (seen %v)", l, tok, back, ok, seen[tok])
		}
		seen[tok] = true
		if subj := ReadySubject("q", tok, "t"); strings.Count(subj, ".") != 4 {
			t.Errorf("subject %q", subj)
		}
	}
	if len(seen) != 3*queueconfig.DefaultFairLanes {
		t.Errorf("%d lanes", len(seen))
	}
	for _, bad := range []string{"", "p", "p1", "t1", "p1t", "p-1t0", "p01t0", "p1t99", "p9t0", "p1t0x", "p1.t0", "p+1t0"} {
		if validLane(bad) {
			t.Errorf("lane %q accepted", bad)
		}
	}
}

func FuzzParseLane(f *testing.F) {
	for _, s := range []string{"p0t0", "p7t63", "p8t0", "p0t64", "p00t0", "x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, ok := parseLane(s)
		if !ok {
			return
		}
		if l.token() != s || strings.ContainsAny(s, ".*> \t") {
			t.Errorf("lane %q parsed to %+v", s, l)
		}
	})
}

// TestSchedulerWeightedBound drives the scheduler alone: with every level busy, each
// window of W = 11 picks holds 8, 2 and 1 of the levels, and a busy tenant lane of a
// level gets every k-th of its level's picks with k lanes busy.
func TestSchedulerWeightedBound(t *testing.T) {
	cfg := queueconfig.Config{FairBy: "client_ip", FairLanes: 4, Priorities: queueconfig.Priorities{
		Levels: []string{"h", "n", "l"}, Mode: queueconfig.Weighted, Weights: map[string]int{"h": 8, "n": 2, "l": 1}}}.WithDefaults()
	sc := newScheduler(cfg, nil, nil, 0)
	for _, lv := range sc.levels {
		for _, ls := range lv[:3] { // three busy tenant lanes per level
			ls.pending = 1 << 30
		}
	}
	perLane := map[lane]int{}
	for w := range 30 {
		count := make([]int, 3)
		for range 11 {
			ls, level := sc.pick()
			sc.take(ls, level)
			count[level]++
			perLane[ls.l]++
		}
		if count[0] != 8 || count[1] != 2 || count[2] != 1 {
			t.Fatalf("window %d: %v, want [8 2 1]", w, count)
		}
	}
	for l, n := range perLane {
		if want := []int{80, 20, 10}[l.level]; n != want {
			t.Errorf("lane %+v: %d picks, want %d (a third of its level's)", l, n, want)
		}
	}
}

func BenchmarkSchedulerPick(b *testing.B) {
	cfg := queueconfig.Config{FairBy: "client_ip", FairLanes: 64, Priorities: queueconfig.Priorities{
		Levels: []string{"h", "n", "l"}, Weights: map[string]int{"h": 8, "n": 2, "l": 1}}}.WithDefaults()
	sc := newScheduler(cfg, nil, nil, 0)
	for _, lv := range sc.levels {
		for i, ls := range lv {
			if i%2 == 0 {
				ls.pending = 1 << 40
			}
		}
	}
	for b.Loop() {
		ls, level := sc.pick()
		sc.take(ls, level)
	}
}
