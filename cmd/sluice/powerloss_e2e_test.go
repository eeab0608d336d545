//go:build linux

package main

import (
	"os"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/natstest/lazyfs"
)

// Power-loss tests: the NATS stores live on lazy filesystems (queue/natstest/lazyfs)
// that forget, at the cut, every write and directory entry not yet made durable by
// fsync. Every order that got a 202 is counted against what reaches a recording
// downstream (clDownstream) after the restart.

// plWait waits up to within for every ticket to reach the downstream and returns
// those that did not.
func plWait(down *clDownstream, tickets []string, within time.Duration) []string {
	deadline := time.Now().Add(within)
	for {
		missing := down.missing(tickets)
		if len(missing) == 0 || time.Now().After(deadline) {
			return missing
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// plCheckDeliveries fails t for an order delivered under two keys, or the same key
// delivered more than twice (once before the cut, once redelivered after it).
func plCheckDeliveries(t *testing.T, down *clDownstream) {
	t.Helper()
	down.mu.Lock()
	defer down.mu.Unlock()
	for _, m := range down.mismatches {
		t.Errorf("delivered under different keys: %s", m)
	}
	for key, n := range down.count {
		if n > 2 {
			t.Errorf("ticket %s (order %s) delivered %d times", key, down.orderOfKey[key], n)
		}
	}
}

// `sluice serve` with its embedded NATS (which syncs every write) on a lazy
// filesystem: the power goes mid-burst, while orders are parked and delivered; after
// a restart on what survived, every order that got a 202 reaches the downstream, and
// no Idempotency-Key more than twice.
func TestServePowerLossLosesNoAcceptedOrder(t *testing.T) {
	t.Parallel()
	disk := lazyfs.Mount(t)
	up, down := newUpstream(t, 0), newClDownstream(t)
	rulesPath := writeRules(t, t.TempDir(), clusterRules(down.URL))
	args := append([]string{"--rules", rulesPath, "--upstream", up.URL, "--data-dir", disk.Dir(), "--log-level", "info"}, clDispatchFlags...)
	p := startSluice(t, args...)

	// Four clients against 50 deliveries a second: the queue grows while it drains.
	l := startClLoad(t, "pl", []*sluiceProcess{p}, 4, 2*time.Millisecond, 100000)
	clWait(t, "orders parked and delivered", 30*time.Second, func() bool {
		return len(l.accepted()) >= 150 && down.delivered() >= 20
	})
	l.drop(p) // what the cut interrupts was never promised
	loss, err := lazyfs.PowerCut([]*os.Process{p.cmd.Process}, disk)
	if err != nil {
		t.Fatal(err)
	}
	<-p.done
	l.halt()
	tickets := l.accepted()
	deliveredAtCut := down.delivered()
	t.Logf("power cut with %d orders accepted and %d deliveries made; the cut discarded %s", len(tickets), deliveredAtCut, loss)
	if len(down.missing(tickets)) == 0 {
		t.Fatal("every accepted order was delivered before the cut; the test proves nothing")
	}

	startSluice(t, args...)
	missing := plWait(down, tickets, 45*time.Second)
	r := down.report("pl-", tickets)
	t.Logf("accepted (202) %d, delivered %d, lost %d, duplicates (same key) %d, delivered without a 202 %d; %s",
		r.accepted, r.delivered, r.lost, r.duplicates, r.unpromised, l.summary())
	if len(missing) > 0 {
		t.Errorf("%d of %d accepted orders lost to the power cut, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
	}
	plCheckDeliveries(t, down)
	l.check(t, 200, 202)
}
