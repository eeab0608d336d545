//go:build unix

package dispatcher_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestStoppedDispatcherStartsNothingBesideItsSuccessor: two dispatcher processes share
// a queue; the one delivering is stopped (SIGSTOP) for several pinned TTLs while it
// holds orders (one waiting for its slot, the next one fetched), the other takes the
// queue over, and the stopped one is resumed. It must start nothing beside its
// successor: before each start a dispatcher checks that the pin cannot have moved and
// its slot is current (lostSlot), and gives the orders it held back instead. Three
// rounds; the bound the package documents is one start, from a stop that falls between
// that check and the request's write.
func TestStoppedDispatcherStartsNothingBesideItsSuccessor(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("stalled", ds.URL)
	cfg.Outflow = limiter.PerSecond(20)
	store, _ := openStore(t, srv.Conn, cfg)
	park(t, store, "stalled", 0, 600)

	const pinnedTTL = time.Second
	procs := map[string]*dispatcher.Process{}
	for _, name := range []string{"a", "b"} {
		procs[name] = dispatcher.StartProcess(t, dispatcher.ProcessSpec{
			URL: srv.URL, Name: name, Queue: cfg,
			PinnedTTL: pinnedTTL, FetchWait: 300 * time.Millisecond, AckWait: 20 * time.Second,
		})
	}
	from := func(h hit) string { return h.header.Get("X-Test-Replica") }
	// deliveries by who that arrived after t0
	since := func(who string, t0 time.Time) int {
		k := 0
		for _, h := range ds.all() {
			if h.at.After(t0) && from(h) == who {
				k++
			}
		}
		return k
	}
	const rounds = 3
	beside := 0
	for round := range rounds {
		n := len(ds.all())
		waitFor(t, "deliveries", 60*time.Second, func() bool { return len(ds.all()) >= n+20 })
		hits := ds.all()
		stopped := from(hits[len(hits)-1])
		other := map[string]string{"a": "b", "b": "a"}[stopped]
		if err := procs[stopped].Stop(); err != nil {
			t.Fatal(err)
		}
		stoppedAt := time.Now()
		waitFor(t, "the successor to deliver", 60*time.Second, func() bool { return since(other, stoppedAt) >= 10 })
		time.Sleep(time.Until(stoppedAt.Add(3 * pinnedTTL)))
		if err := procs[stopped].Continue(); err != nil {
			t.Fatal(err)
		}
		resumedAt := time.Now()
		// The resumed one had its chance: its stalled orders went out or back.
		waitFor(t, "the successor to deliver after the resume", 60*time.Second, func() bool {
			return since(other, resumedAt.Add(2*time.Second)) >= 5
		})
		// Starts of the resumed dispatcher while its successor was delivering: after the
		// resume, before the successor's last delivery of the window.
		var last time.Time
		window := ds.all()
		for _, h := range window {
			if from(h) == other {
				last = h.at
			}
		}
		k := 0
		for _, h := range window {
			if from(h) == stopped && h.at.After(resumedAt) && h.at.Before(last) {
				k++
			}
		}
		t.Logf("round %d: %s stopped for %s, then started %d deliveries beside %s", round+1, stopped, resumedAt.Sub(stoppedAt).Round(time.Millisecond), k, other)
		if k > 1 {
			t.Errorf("round %d: the resumed dispatcher started %d deliveries beside its successor; the bound is 1", round+1, k)
		}
		beside += k
	}
	t.Logf("%d deliveries beside a successor in %d rounds", beside, rounds)
}
