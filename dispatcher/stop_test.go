package dispatcher_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A dispatcher that stops cleanly hands back at once what it fetched but did not start
// (look-ahead, waiting for a pacing slot): with a 10-minute ack wait, every order still
// arrives through the other dispatcher long before the ack wait could have expired.
func TestCleanStopHandsOrdersBack(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("handback", ds.URL)
	cfg.Outflow = limiter.PerSecond(5) // orders wait for their slots in the dispatcher
	store, _ := openStore(t, srv.Conn, cfg)
	tickets := park(t, store, "handback", 0, 40)

	const ackWait = 10 * time.Minute
	started := time.Now()
	opts := []dispatcher.Option{dispatcher.WithAckWait(ackWait), dispatcher.WithPinnedTTL(2 * time.Second)}
	replicas := map[string]*replica{}
	for _, name := range []string{"a", "b"} {
		replicas[name] = startReplica(t, srv, cfg, name, opts...)
	}
	// Stop whichever is delivering, three times over, each time mid-run; a fresh
	// replica replaces it, as in a rolling restart.
	for i, next := range []string{"c", "d", "e"} {
		waitFor(t, "deliveries", 60*time.Second, func() bool { return len(ds.keys()) >= 6*(i+1) })
		hits := ds.all()
		active := hits[len(hits)-1].header.Get("X-Test-Replica")
		r := replicas[active]
		r.cancel()
		<-r.done
		delete(replicas, active)
		replicas[next] = startReplica(t, srv, cfg, next, opts...)
	}
	waitFor(t, "every order", 3*time.Minute, func() bool { return len(ds.keys()) == len(tickets) })
	if took := time.Since(started); took >= ackWait {
		t.Fatalf("took %s: the ack wait may have expired", took)
	}
	for _, tk := range tickets {
		if n := ds.count(tk); n != 1 {
			t.Errorf("order %s delivered %d times", tk, n)
		}
	}
	t.Logf("%d orders through 3 clean stops in %s", len(tickets), time.Since(started).Round(time.Millisecond))
}

// The same through a restart of the NATS server with the dispatcher (sluice serve's
// embedded server restarts with the process): the hand-back must outlive the server's
// memory, or the orders wait out the ack wait.
func TestCleanStopHandsOrdersBackAcrossServerRestart(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("handback", ds.URL)
	cfg.Outflow = limiter.PerSecond(2)
	store, _ := openStore(t, srv.Conn, cfg)
	tickets := park(t, store, "handback", 0, 12)

	const ackWait = 10 * time.Minute
	started := time.Now()
	opts := []dispatcher.Option{dispatcher.WithAckWait(ackWait)}
	for i, name := range []string{"a", "b", "c"} {
		r := startReplica(t, srv, cfg, name, opts...)
		waitFor(t, "deliveries", 60*time.Second, func() bool { return len(ds.keys()) >= 3*(i+1) })
		r.cancel()
		<-r.done
		srv.Restart()
	}
	startReplica(t, srv, cfg, "d", opts...)
	waitFor(t, "every order", 3*time.Minute, func() bool { return len(ds.keys()) == len(tickets) })
	if took := time.Since(started); took >= ackWait {
		t.Fatalf("took %s: the ack wait may have expired", took)
	}
	for _, tk := range tickets {
		if n := ds.count(tk); n != 1 {
			t.Errorf("order %s delivered %d times", tk, n)
		}
	}
}
