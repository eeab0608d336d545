//go:build unix

package main

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/natstest"
)

// TestChaos is a bounded nemesis run on the clustered shape: three nats-server nodes
// (R3 streams), two `sluice serve` replicas and a recording downstream, under a steady
// load of orders with unique Idempotency-Keys (some scheduled with Sluice-Not-Before)
// and of orders without one, sent again only after a 503 that says nothing was
// accepted (unkeyedLoad).
// One after the other, with the load running: the queue stream's leader is killed -9
// and restarted; a node is paused (SIGSTOP) for 10s; a replica is killed -9; the
// downstream answers 503 with Retry-After for 5s. Then everything heals and the
// checker prints a table and fails on any accepted order not delivered, an order
// delivered under another key or stored twice, an order delivered after every answer
// said nothing was accepted, a scheduled order delivered before its time, or more
// deliveries in a window than the outflow allows across the replicas.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster and two sluice replicas as processes, with faults")
	}
	started := time.Now()
	env, args := newClusterEnv(t, natstest.StartCluster(t, 3), func(downstreamURL string) string {
		return strings.Replace(clusterRules(downstreamURL), "max_in_flight: 8", "max_in_flight: 8\n    max_delay: 1m", 1)
	})
	nc := env.nats
	for range 2 {
		env.replicas = append(env.replicas, startSluice(t, args...))
	}
	env.waitStreamHealthy(t)

	// About 25 orders a second against an outflow of 50: a backlog builds only while
	// a fault holds deliveries back, and drains at the paced rate after it.
	l := startClLoad(t, "chaos", env.replicas, 3, 100*time.Millisecond, 100000)
	sched := startScheduled(l, 250*time.Millisecond)
	unkeyed := startUnkeyed(t, l, 300*time.Millisecond)
	var phases []chaosPhase
	phase := func(name string, fault func()) {
		t.Helper()
		from, acc, unav := time.Now(), l.accepted(), l.unavailable()
		fault()
		phases = append(phases, chaosPhase{name, time.Since(from), len(l.accepted()) - len(acc), l.unavailable() - unav})
	}
	loadFrom := time.Now()

	phase("steady load", func() { time.Sleep(5 * time.Second) })
	phase("stream leader killed -9, restarted after 5s", func() {
		node := nc.Node(env.waitStreamHealthy(t).Cluster.Leader)
		nc.Kill(node)
		time.Sleep(5 * time.Second)
		nc.Restart(node)
		nc.WaitReady()
		env.waitStreamHealthy(t)
	})
	phase("a follower paused (SIGSTOP) for 10s", func() {
		info := env.waitStreamHealthy(t)
		node := nc.Node(info.Cluster.Replicas[0].Name)
		p := nc.Process(node)
		if err := p.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second)
		if err := p.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		env.waitStreamHealthy(t)
	})
	phase("a sluice replica killed -9", func() {
		victim := env.replicas[1]
		l.drop(victim)
		victim.kill(t)
		env.replicas = env.replicas[:1]
		time.Sleep(5 * time.Second)
	})
	phase("downstream 503 with Retry-After: 2 for 5s", func() {
		env.down.refusing.Store(true)
		time.Sleep(5 * time.Second)
		env.down.refusing.Store(false)
		time.Sleep(3 * time.Second)
	})
	l.halt()
	sched.halt()
	unkeyed.halt()

	// Heal: every accepted order must arrive.
	tickets := slices.Concat(l.accepted(), sched.accepted(), unkeyed.accepted())
	missing := plWait(env.down, tickets, 90*time.Second)

	var b strings.Builder
	fmt.Fprintf(&b, "\n%-46s %8s %6s %12s\n", "phase", "seconds", "202s", "503 answers")
	for _, p := range phases {
		fmt.Fprintf(&b, "%-46s %8.1f %6d %12d\n", p.name, p.took.Seconds(), p.accepted, p.unavailable)
	}
	r := env.down.report("chaos-", l.accepted())
	rs := env.down.report("chs-", sched.accepted())
	env.down.mu.Lock()
	refused := env.down.refused
	early := 0
	for tk, due := range sched.dueTimes() {
		if at, ok := env.down.first[tk]; ok && at.Before(due) {
			early++
			t.Errorf("scheduled order %s delivered at %s, before its time %s", tk, at.Format(time.RFC3339Nano), due.Format(time.RFC3339))
		}
	}
	env.down.mu.Unlock()
	fmt.Fprintf(&b, "orders: accepted %d (+%d scheduled), delivered %d (+%d), lost %d, duplicates with the same key %d, "+
		"delivered without a 202 %d; scheduled delivered early %d; downstream 503s %d\n",
		r.accepted, rs.accepted, r.delivered, rs.delivered, len(missing), r.duplicates+rs.duplicates, r.unpromised+rs.unpromised, early, refused)
	fmt.Fprintf(&b, "%s\n%s\n", l.summary(), unkeyed.summary())

	// Pacing across the replicas, over the whole run (see testClusterReplicaKilled
	// for the arrival-jitter slack).
	arrivals := env.down.arrivalsSince(loadFrom)
	slack := int(math.Ceil(clOutflow * clArrivalJitter.Seconds()))
	fmt.Fprintf(&b, "%-10s %14s %6s\n", "window", "most arrivals", "bound")
	for _, window := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second} {
		bound := int(math.Ceil(clOutflow*window.Seconds())) + 1
		most := clMaxInWindow(arrivals, window)
		fmt.Fprintf(&b, "%-10s %14d %6d\n", window, most, bound)
		if most > bound+slack {
			t.Errorf("%d requests reached the downstream within %s: over the outflow bound %d (+%d for arrival jitter)", most, window, bound, slack)
		}
	}
	t.Logf("chaos run in %s:%s", time.Since(started).Round(time.Second), b.String())
	if len(missing) > 0 {
		t.Errorf("%d of %d accepted orders lost, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
	}
	plCheckDeliveries(t, env.down)
	unkeyed.check(t, env.down)
	if r.accepted == 0 || rs.accepted == 0 || len(unkeyed.accepted()) == 0 {
		t.Error("no order was accepted: the run proves nothing")
	}
}

type chaosPhase struct {
	name                  string
	took                  time.Duration
	accepted, unavailable int
}

// unavailable returns how many answers were 503.
func (l *clLoad) unavailable() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.statuses[http.StatusServiceUnavailable]
}

// scheduled posts an order scheduled 3s ahead (Sluice-Not-Before) every pause to the
// front doors of a clLoad, and keeps the due time of each one accepted.
type scheduled struct {
	load *clLoad
	stop chan struct{}
	wg   sync.WaitGroup

	mu  sync.Mutex
	due map[string]time.Time // ticket → estimated_delivery
}

func startScheduled(l *clLoad, pause time.Duration) *scheduled {
	s := &scheduled{load: l, stop: make(chan struct{}), due: map[string]time.Time{}}
	s.wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-s.stop:
				return
			case <-time.After(pause):
			}
			targets := *l.targets.Load()
			if len(targets) == 0 {
				return
			}
			order := fmt.Sprintf("chs-%d", n)
			r, err := postOrder(targets[n%len(targets)].url, "/v1/orders", order, fmt.Sprintf(`{"order":%q}`, order),
				"Idempotency-Key", strconv.Quote(order), "Sluice-Not-Before", "3", "X-User-ID", "user-scheduled")
			if err != nil || r.status != http.StatusAccepted {
				continue // not promised
			}
			var a accepted
			if err := json.Unmarshal([]byte(r.body), &a); err != nil {
				continue
			}
			due, err := time.Parse(time.RFC3339, a.EstimatedDelivery)
			if err != nil {
				continue
			}
			s.mu.Lock()
			s.due[a.Ticket] = due
			s.mu.Unlock()
		}
	})
	return s
}

func (s *scheduled) halt() {
	close(s.stop)
	s.wg.Wait()
}

func (s *scheduled) accepted() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.due))
	for tk := range s.due {
		out = append(out, tk)
	}
	return out
}

func (s *scheduled) dueTimes() map[string]time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]time.Time, len(s.due))
	for tk, due := range s.due {
		out[tk] = due
	}
	return out
}

// unkeyedLoad posts an order without an Idempotency-Key every pause to the front doors
// of a clLoad, as a client that follows a 503's advice: after a 503 that names no
// ticket (nothing was accepted) it sends the same order again, a new request that
// would be a second order had the first been stored, up to ten requests in all; after a 503 that
// names the ticket the order may have been accepted as, or a connection cut by a kill,
// it sends nothing more. The downstream sees every order's X-Order, so an order stored
// twice arrives under two tickets (clDownstream's mismatches), and check fails on an
// order given up after 503s that arrives all the same.
type unkeyedLoad struct {
	load *clLoad
	stop chan struct{}
	once sync.Once
	wg   sync.WaitGroup

	mu       sync.Mutex
	tickets  map[string]string // order → the ticket of its 202
	refused  []string          // orders given up after ten 503s that named no ticket
	resent   int               // requests sent again after a 503 that named no ticket
	unsure   int               // orders answered 503 naming a ticket, or cut off by a kill
	problems []string          // answers sluice must never give
}

func startUnkeyed(t *testing.T, l *clLoad, pause time.Duration) *unkeyedLoad {
	u := &unkeyedLoad{load: l, stop: make(chan struct{}), tickets: map[string]string{}}
	t.Cleanup(u.halt)
	u.wg.Go(func() {
		for n := 0; ; n++ {
			select {
			case <-u.stop:
				return
			case <-time.After(pause):
			}
			u.send(n, fmt.Sprintf("%s%d", unkeyedPrefix, n))
		}
	})
	return u
}

// send posts order until it is answered anything but a 503 naming no ticket.
func (u *unkeyedLoad) send(n int, order string) {
	for attempt := 0; ; attempt++ {
		targets := *u.load.targets.Load()
		if len(targets) == 0 {
			return
		}
		p := targets[(n+attempt)%len(targets)]
		status, ticket, maybe, err := u.load.post(p.url, order, "user-unkeyed", "")
		u.mu.Lock()
		again := false
		switch {
		case err != nil && !u.load.alive(p):
			u.unsure++
		case err != nil:
			u.problems = append(u.problems, fmt.Sprintf("order %s: %v", order, err))
		case status == http.StatusAccepted:
			u.tickets[order] = ticket
		case status == http.StatusOK:
		case status == http.StatusServiceUnavailable && maybe != "":
			u.unsure++
		case status == http.StatusServiceUnavailable || status == http.StatusTooManyRequests:
			if again = attempt < 9; again {
				u.resent++
			} else {
				u.refused = append(u.refused, order)
			}
		default:
			u.problems = append(u.problems, fmt.Sprintf("order %s: status %d", order, status))
		}
		u.mu.Unlock()
		if !again {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (u *unkeyedLoad) halt() {
	u.once.Do(func() { close(u.stop) })
	u.wg.Wait()
}

// accepted returns the tickets of the orders answered 202.
func (u *unkeyedLoad) accepted() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.tickets))
	for _, tk := range u.tickets {
		out = append(out, tk)
	}
	return out
}

func (u *unkeyedLoad) summary() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return fmt.Sprintf("unkeyed orders: accepted %d, sent again after a 503 that named no ticket %d, given up %d, "+
		"answered 503 naming a ticket or cut off by a kill %d", len(u.tickets), u.resent, len(u.refused), u.unsure)
}

// check fails t for an answer sluice must never give, an order given up after 503s
// that said nothing was accepted that arrived all the same, and an order that arrived
// under another ticket than its 202's. Call it after halt, once the orders are in.
func (u *unkeyedLoad) check(t *testing.T, down *clDownstream) {
	t.Helper()
	u.mu.Lock()
	defer u.mu.Unlock()
	down.mu.Lock()
	defer down.mu.Unlock()
	for _, p := range u.problems {
		t.Error(p)
	}
	for _, order := range u.refused {
		if tk, ok := down.keyOfOrder[order]; ok {
			t.Errorf("order %s was answered 503 with no ticket ten times, yet delivered as %s", order, tk)
		}
	}
	for order, tk := range u.tickets {
		if got, ok := down.keyOfOrder[order]; ok && got != tk {
			t.Errorf("order %s was accepted as %s, delivered as %s", order, tk, got)
		}
	}
}
