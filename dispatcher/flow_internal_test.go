package dispatcher

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// The gate's figures of a key: its depth is its deliveries running plus its orders
// handed back; its rate the starts of the last whole FlowRateWindow; an idle key
// leaves the gate once its starts are out of the window.
func TestFlowGateStats(t *testing.T) {
	g := newFlowGate(limiter.NewMemory())
	f := queueconfig.FlowBy{From: "header:X", MaxInFlight: 40}
	t0 := time.Unix(1_000_000, 0)
	var releases []func()
	// 3 starts a second for 12 s.
	for i := range 36 {
		now := t0.Add(time.Duration(i) * time.Second / 3)
		release, _, ok, err := g.admit(context.Background(), "q", f, "k", "t"+string(rune('A'+i)), now)
		if !ok || err != nil {
			t.Fatalf("start %d: %v %v", i, ok, err)
		}
		releases = append(releases, release)
	}
	g.hold("q", "k", "held", time.Second, t0.Add(12*time.Second))
	for _, release := range releases[:30] {
		release()
	}
	st := g.stats("q", t0.Add(12*time.Second))
	if len(st) != 1 || st[0].Key != "k" || st[0].Depth != 6+1 || st[0].PerSecond != 3 {
		t.Fatalf("stats = %+v, want k with depth 7 (6 running, 1 held) at 3/s", st)
	}
	if other := g.stats("q2", t0.Add(12*time.Second)); len(other) != 0 {
		t.Errorf("another queue's stats: %+v", other)
	}
	for _, release := range releases[30:] {
		release()
	}
	g.mu.Lock()
	g.unpenLocked("held", t0.Add(13*time.Second))
	g.mu.Unlock()
	if st := g.stats("q", t0.Add(16*time.Second)); len(st) != 1 || st[0].Depth != 0 || st[0].PerSecond != 1.8 {
		t.Errorf("4 s later, nothing held: %+v, want depth 0 at 1.8/s (18 starts in the window)", st)
	}
	if st := g.stats("q", t0.Add(22*time.Second)); len(st) != 0 {
		t.Errorf("idle for the window: %+v, want the key gone", st)
	}
	if n := len(g.keys); n != 0 {
		t.Errorf("%d keys left in the gate", n)
	}
}
