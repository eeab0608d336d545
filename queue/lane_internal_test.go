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
