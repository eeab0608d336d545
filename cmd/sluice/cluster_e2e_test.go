package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// The clustered shape on one machine, as it runs in production on many: three
// nats-server processes in one JetStream cluster (R3 streams), one redis-server, two
// `sluice serve` replicas sharing both, and a real downstream that deduplicates by
// Idempotency-Key. The servers are started once; the subtests run one after the other
// on them, each leaving the cluster healthy for the next:
//
//	limit   two replicas sharing Redis allow at most the configured limit
//	nats    the queue stream's leader is killed -9 under load, later restarted
//	redis   Redis is stopped under load, later restarted
//	replica the replica whose dispatcher delivers is killed -9 with a backlog
//
// Every assertion is on counts; times only bound how long a condition is waited for.

// clOutflow is the orders queue's outflow rate, per second.
const clOutflow = 50

// clLimit is what the "limited" rule allows in all over the test: a token bucket of
// clLimit that refills clLimit per hour, which is far less than one token over a run.
const clLimit = 30

func clusterRules(downstreamURL string) string {
	return fmt.Sprintf(`
domain: e2e-cluster
descriptors:
  # Orders: beyond the first one everything is deferred. This decision is cached in
  # process once over the limit (its retry-after is an hour), so it costs Redis nothing.
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: cluster_orders}
    algorithm: token_bucket
    failure_mode: local
    on_limit: defer
    queue: orders
  # A generous per-user limit, allowed every time: a Redis round trip per order, which
  # is what the Redis outage is felt on.
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000, name: cluster_per_user}
    failure_mode: local
  # The limit that must hold across replicas. Closed: a decision Redis could not
  # make is a rejection, so no local fallback can allow more than the limit.
  - key: route
    value: limited
    rate_limit: {unit: hour, requests_per_unit: %d, name: cluster_limited}
    algorithm: token_bucket
    failure_mode: closed
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}]
      - [{key: user, from: "header:X-User-ID"}]
  - name: limited
    match: {path: /v1/limited}
    descriptors:
      - [{key: route, value: limited}]
queues:
  orders:
    outflow: {rate: %d/s}
    max_in_flight: 8
    downstream: %s
`, clLimit, clOutflow, downstreamURL)
}

// clArrivalJitter is how much later than its paced start a delivery may reach the
// downstream without failing the pacing check.
const clArrivalJitter = 100 * time.Millisecond

// clDispatchFlags make crash recovery take seconds: a message taken by a dead
// dispatcher comes back after 4s, a queue pinned to a dead dispatcher moves after 1s.
var clDispatchFlags = []string{"--delivery-timeout", "3s", "--ack-wait", "4s", "--failover-after", "1s"}

// clDownstream is the orders API: it counts deliveries per ticket (Sluice-Ticket; a
// repeat is counted as a suppressed duplicate), checks that each order carries its
// client's own Idempotency-Key (clientKey), and records when each request arrived and under which
// ticket each order (X-Order) came; an order without X-Order is counted by its ticket
// alone. While refusing is set it answers every request
// 503 with Retry-After (recorded as an arrival, not as a delivery).
type clDownstream struct {
	*httptest.Server
	refusing atomic.Bool

	mu         sync.Mutex
	refused    int                  // 503s answered while refusing
	first      map[string]time.Time // first delivery per ticket
	count      map[string]int       // deliveries per ticket
	orderOfKey map[string]string    // ticket → X-Order
	keyOfOrder map[string]string    // X-Order → ticket
	mismatches []string             // orders seen under two tickets or with another key
	arrivals   []time.Time          // every request
}

func newClDownstream(t *testing.T) *clDownstream {
	d := &clDownstream{count: map[string]int{}, first: map[string]time.Time{}, orderOfKey: map[string]string{}, keyOfOrder: map[string]string{}}
	d.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		io.Copy(io.Discard, r.Body)
		key, order := r.Header.Get("Sluice-Ticket"), r.Header.Get("X-Order")
		d.mu.Lock()
		d.arrivals = append(d.arrivals, now)
		if d.refusing.Load() {
			d.refused++
			d.mu.Unlock()
			w.Header().Set("Retry-After", "2")
			http.Error(w, "orders API overloaded", http.StatusServiceUnavailable)
			return
		}
		if order == "" { // an order its client sent without a key: counted by ticket alone
			if d.count[key] == 0 {
				d.first[key] = now
			}
			d.count[key]++
			d.mu.Unlock()
			w.WriteHeader(http.StatusCreated)
			return
		}
		if got, want := r.Header.Get("Idempotency-Key"), clientKey(order, key); got != want {
			d.mismatches = append(d.mismatches, fmt.Sprintf("order %s delivered with Idempotency-Key %s, not the client's", order, got))
		}
		if d.count[key] == 0 {
			d.first[key] = now
		}
		d.count[key]++
		d.orderOfKey[key] = order
		if prev, ok := d.keyOfOrder[order]; ok && prev != key {
			d.mismatches = append(d.mismatches, fmt.Sprintf("order %s under keys %s and %s", order, prev, key))
		}
		d.keyOfOrder[order] = key
		d.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"order":%q}`, order)
	}))
	t.Cleanup(d.Close)
	return d
}

// unkeyedPrefix starts the orders a client sends without an Idempotency-Key (see
// unkeyedLoad).
const unkeyedPrefix = "unk-"

// clientKey is the Idempotency-Key order must arrive with as ticket: the client's own,
// its quoted name, or for an order sent without one the ticket, which the dispatcher
// sends in its place.
func clientKey(order, ticket string) string {
	if strings.HasPrefix(order, unkeyedPrefix) {
		return ticket
	}
	return strconv.Quote(order)
}

// missing returns the tickets that never arrived.
func (d *clDownstream) missing(tickets []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, tk := range tickets {
		if d.count[tk] == 0 {
			out = append(out, tk)
		}
	}
	return out
}

func (d *clDownstream) delivered() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.arrivals)
}

func (d *clDownstream) arrivalsSince(from time.Time) []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []time.Time
	for _, at := range d.arrivals {
		if !at.Before(from) {
			out = append(out, at)
		}
	}
	return out
}

// clReport is what one fault run did, as the downstream saw it.
type clReport struct {
	accepted, delivered, lost, duplicates, unpromised int
}

// report counts, for the orders whose X-Order starts with prefix: accepted (202),
// delivered (accepted and arrived), lost (accepted, never arrived), duplicates
// suppressed (repeat deliveries of one key) and unpromised (arrived, but the client
// never got a 202 for it: stored while its answer was lost to the fault).
func (d *clDownstream) report(prefix string, tickets []string) clReport {
	d.mu.Lock()
	defer d.mu.Unlock()
	r := clReport{accepted: len(tickets)}
	promised := map[string]bool{}
	for _, tk := range tickets {
		promised[tk] = true
		if d.count[tk] > 0 {
			r.delivered++
		} else {
			r.lost++
		}
	}
	for key, n := range d.count {
		if !strings.HasPrefix(d.orderOfKey[key], prefix) {
			continue
		}
		r.duplicates += n - 1
		if !promised[key] {
			r.unpromised++
		}
	}
	return r
}

// clLoad sends orders, each with its own Idempotency-Key, from a few workers to the
// live front doors, as a well-behaved client does: a 503 or 429 is retried with the
// same key after a pause, a few times, then given up.
type clLoad struct {
	prefix string
	pause  time.Duration
	max    int64
	client *http.Client

	targets atomic.Pointer[[]*sluiceProcess]
	stop    atomic.Bool
	seq     atomic.Int64
	wg      sync.WaitGroup

	mu       sync.Mutex
	tickets  []string
	statuses map[int]int // every answer
	answers  int
	proxied  int      // 200: within the limit, proxied at once
	refused  int      // orders given up after repeated 503 / 429
	cutOff   int      // transport errors to a front door that was killed
	problems []string // what a live sluice must never do
}

func startClLoad(t *testing.T, prefix string, targets []*sluiceProcess, workers int, pause time.Duration, max int) *clLoad {
	l := &clLoad{prefix: prefix, pause: pause, max: int64(max), statuses: map[int]int{},
		client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}}
	l.targets.Store(&targets)
	for w := range workers {
		l.wg.Go(func() { l.worker(w) })
	}
	t.Cleanup(l.halt)
	return l
}

// drop stops sending to p (before it is killed).
func (l *clLoad) drop(p *sluiceProcess) {
	live := slices.DeleteFunc(slices.Clone(*l.targets.Load()), func(q *sluiceProcess) bool { return q == p })
	l.targets.Store(&live)
}

func (l *clLoad) alive(p *sluiceProcess) bool { return slices.Contains(*l.targets.Load(), p) }

func (l *clLoad) halt() {
	l.stop.Store(true)
	l.wg.Wait()
	l.client.CloseIdleConnections()
}

func (l *clLoad) worker(w int) {
	for i := w; !l.stop.Load(); i++ {
		n := l.seq.Add(1)
		if n > l.max {
			return
		}
		order := fmt.Sprintf("%s-%d", l.prefix, n)
		for attempt := 0; ; attempt++ {
			targets := *l.targets.Load()
			if len(targets) == 0 {
				return
			}
			p := targets[(i+attempt)%len(targets)]
			status, ticket, _, err := l.post(p.url, order, fmt.Sprint("user-", w), strconv.Quote(order))
			l.mu.Lock()
			retry := false
			switch {
			case err != nil && !l.alive(p):
				l.cutOff++ // killed under it: whatever it parked was never promised
				retry = attempt < 10
			case err != nil:
				l.problems = append(l.problems, fmt.Sprintf("order %s: %v", order, err))
			default:
				l.answers++
				l.statuses[status]++
				switch status {
				case http.StatusAccepted:
					l.tickets = append(l.tickets, ticket)
				case http.StatusOK:
					l.proxied++
				case http.StatusServiceUnavailable, http.StatusTooManyRequests:
					retry = attempt < 10
					if !retry {
						l.refused++
					}
				default:
					l.problems = append(l.problems, fmt.Sprintf("order %s: status %d", order, status))
				}
			}
			l.mu.Unlock()
			if !retry {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		time.Sleep(l.pause)
	}
}

// post sends order as user, with the Idempotency-Key key unless it is "", and
// returns the status, the ticket of a 202, and the ticket a 503 says the order may have
// been accepted as ("" when it says nothing was).
func (l *clLoad) post(base, order, user, key string) (status int, ticket, maybe string, err error) {
	req, err := http.NewRequest("POST", base+"/v1/orders", strings.NewReader(fmt.Sprintf(`{"order":%q}`, order)))
	if err != nil {
		return 0, "", "", err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Order", order)
	req.Header.Set("X-User-ID", user)
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := l.client.Do(req)
	if err != nil {
		return 0, "", "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, "", "", err
	}
	var a struct {
		Ticket string `json:"ticket"`
	}
	switch resp.StatusCode {
	case http.StatusAccepted:
		if err := json.Unmarshal(b, &a); err != nil || !queue.ValidTicket(a.Ticket) {
			return 0, "", "", fmt.Errorf("202 with body %q", b)
		}
		return resp.StatusCode, a.Ticket, "", nil
	case http.StatusServiceUnavailable:
		if resp.Header.Get("Retry-After") == "" {
			return 0, "", "", fmt.Errorf("503 without Retry-After: %s", b)
		}
		if err := json.Unmarshal(b, &a); err != nil || a.Ticket != "" && !queue.ValidTicket(a.Ticket) {
			return 0, "", "", fmt.Errorf("503 with body %q", b)
		}
		return resp.StatusCode, "", a.Ticket, nil
	}
	return resp.StatusCode, "", "", nil
}

func (l *clLoad) accepted() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.tickets)
}

func (l *clLoad) answered() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.answers
}

func (l *clLoad) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	codes := make([]int, 0, len(l.statuses))
	for c := range l.statuses {
		codes = append(codes, c)
	}
	sort.Ints(codes)
	var parts []string
	for _, c := range codes {
		parts = append(parts, fmt.Sprintf("%d×%d", l.statuses[c], c))
	}
	return fmt.Sprintf("answers %s; proxied %d, refused after retries %d, cut off by a kill %d",
		strings.Join(parts, " "), l.proxied, l.refused, l.cutOff)
}

// check fails t for anything a live sluice must not do, and for statuses other than
// allowed.
func (l *clLoad) check(t *testing.T, allowed ...int) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range l.problems {
		t.Error(p)
	}
	for code, n := range l.statuses {
		if !slices.Contains(allowed, code) {
			t.Errorf("%d answers %d, want only %v", n, code, allowed)
		}
	}
}

// checkServed is check for a run whose every order should be answered 200 or 202 in
// the end: a 503 is also the honest answer to an order whose write was not stored
// within the publish timeout (a loaded machine: R3 writes, or a lazy filesystem's
// syncs, late), which the client sends again; an order refused ten times fails t. Call
// it after halt: the workers are gone.
func (l *clLoad) checkServed(t *testing.T) {
	t.Helper()
	l.check(t, http.StatusOK, http.StatusAccepted, http.StatusServiceUnavailable)
	if l.refused > 0 {
		t.Errorf("%d orders refused after ten tries", l.refused)
	}
}

// clusterEnv is the shape every subtest runs on.
type clusterEnv struct {
	nats     *natstest.Cluster
	js       jetstream.JetStream
	redis    *redistest.Server
	up       *upstream
	down     *clDownstream
	replicas []*sluiceProcess
}

func TestCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster, Redis and two sluice replicas as processes")
	}
	started := time.Now()
	env := &clusterEnv{redis: redistest.Start(t), nats: natstest.StartCluster(t, 3)}
	js, err := jetstream.New(env.nats.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	env.js = js
	env.up, env.down = newUpstream(t, 0), newClDownstream(t)
	rulesPath := writeRules(t, t.TempDir(), clusterRules(env.down.URL))
	args := append([]string{"--rules", rulesPath, "--upstream", env.up.URL, "--log-level", "info",
		"--nats", env.nats.URL(), "--queue-key", testQueueKey, "--replicas", "3", "--redis", "redis://" + env.redis.Addr() + "/0",
		"--redis-timeout", "5s"}, clDispatchFlags...) // shared counts only while Redis answers: not decided by failure_mode on a loaded machine
	for range 2 {
		env.replicas = append(env.replicas, startSluice(t, args...))
	}
	env.waitStreamHealthy(t)
	t.Logf("cluster up in %s", time.Since(started).Round(time.Millisecond))

	for _, st := range []struct {
		name string
		run  func(*testing.T, *clusterEnv)
	}{
		{"limit holds across replicas", testClusterLimit},
		{"NATS stream leader killed", testClusterNATSLeaderKilled},
		{"Redis stopped and restarted", testClusterRedisOutage},
		{"sluice replica killed", testClusterReplicaKilled},
	} {
		phase := time.Now()
		t.Run(st.name, func(t *testing.T) { st.run(t, env) })
		t.Logf("%s: %s", st.name, time.Since(phase).Round(time.Millisecond))
	}
}

// newClusterEnv puts an upstream and a recording downstream beside the running
// cluster nc and returns the shape without replicas, and the arguments of a `sluice
// serve` replica on it (R3 queues) under rules(the downstream's URL).
func newClusterEnv(t *testing.T, nc *natstest.Cluster, rules func(downstreamURL string) string) (*clusterEnv, []string) {
	t.Helper()
	js, err := jetstream.New(nc.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	env := &clusterEnv{nats: nc, js: js, up: newUpstream(t, 0), down: newClDownstream(t)}
	rulesPath := writeRules(t, t.TempDir(), rules(env.down.URL))
	return env, append([]string{"--rules", rulesPath, "--upstream", env.up.URL, "--log-level", "info",
		"--nats", nc.URL(), "--queue-key", testQueueKey, "--replicas", "3"}, clDispatchFlags...)
}

// streamInfo reads the orders stream's info through any running node.
func (env *clusterEnv) streamInfo() (*jetstream.StreamInfo, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	s, err := env.js.Stream(ctx, queue.StreamName("orders"))
	if err != nil {
		return nil, err
	}
	return s.Info(ctx)
}

// waitStreamHealthy waits until the orders stream has a leader and two current
// followers, all three nodes running.
func (env *clusterEnv) waitStreamHealthy(t *testing.T) *jetstream.StreamInfo {
	t.Helper()
	var info *jetstream.StreamInfo
	var err error
	clWait(t, "the orders stream with a leader and two current replicas", 60*time.Second, func() bool {
		info, err = env.streamInfo()
		if err != nil || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
			return false
		}
		for _, p := range info.Cluster.Replicas {
			if !p.Current || p.Offline {
				return false
			}
		}
		return true
	})
	return info
}

// clWait polls cond until it holds.
func clWait(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// clMetric sums the samples of /metrics whose series starts with prefix (a name, or a
// name with the opening of its labels).
func clMetric(t *testing.T, p *sluiceProcess, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(p.admin + "/metrics")
	if err != nil {
		t.Fatalf("metrics: %v", err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, prefix) || strings.HasPrefix(line, "#") {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			v, err := strconv.ParseFloat(line[i+1:], 64)
			if err == nil {
				sum += v
			}
		}
	}
	return sum
}

// waitDelivered waits until every ticket has reached the downstream and the queue is
// empty on p (nothing left unacknowledged, so no late redelivery can follow), then
// logs and checks the run's counts.
func (env *clusterEnv) waitDelivered(t *testing.T, l *clLoad, p *sluiceProcess) clReport {
	t.Helper()
	tickets := l.accepted()
	deadline := time.Now().Add(90 * time.Second)
	for {
		missing := env.down.missing(tickets)
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d accepted orders never reached the downstream, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	const depth = `sluice_queue_depth{queue="orders"} `
	clWait(t, "an empty orders queue", 60*time.Second, func() bool {
		resp, err := http.Get(p.admin + "/metrics")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), depth+"0\n")
	})
	r := env.down.report(l.prefix+"-", tickets)
	t.Logf("accepted (202) %d, delivered %d, duplicates suppressed by the downstream %d, lost %d; "+
		"delivered although their client got no 202 %d", r.accepted, r.delivered, r.duplicates, r.lost, r.unpromised)
	t.Logf("%s", l.summary())
	if r.lost != 0 {
		t.Errorf("%d accepted orders lost", r.lost)
	}
	env.down.mu.Lock()
	for _, m := range env.down.mismatches {
		t.Errorf("delivered twice under different keys: %s", m)
	}
	env.down.mu.Unlock()
	return r
}

// (d) Two replicas sharing Redis allow at most the limit: a token bucket of clLimit
// whose refill over the test is far less than a token, so the expected count is exact.
func testClusterLimit(t *testing.T, env *clusterEnv) {
	a, b := env.replicas[0], env.replicas[1]
	fallbacks := func() float64 {
		return clMetric(t, a, "sluice_limiter_fallback_total") + clMetric(t, b, "sluice_limiter_fallback_total")
	}
	before, hitsBefore := fallbacks(), env.up.hits.Load()
	const total = 4 * clLimit
	var allowed, rejected atomic.Int64
	var wg sync.WaitGroup
	for i := range 8 {
		target := env.replicas[i%2].url
		wg.Go(func() {
			for range total / 8 {
				resp, err := http.Get(target + "/v1/limited")
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				switch resp.StatusCode {
				case http.StatusOK:
					allowed.Add(1)
				case http.StatusTooManyRequests:
					rejected.Add(1)
				default:
					t.Errorf("status %d", resp.StatusCode)
				}
			}
		})
	}
	wg.Wait()
	fell := fallbacks() - before
	t.Logf("two replicas: %d allowed, %d rejected of %d; limit %d; Redis fallbacks meanwhile %v", allowed.Load(), rejected.Load(), total, clLimit, fell)
	if allowed.Load()+rejected.Load() != total {
		t.Fatalf("%d answers, want %d", allowed.Load()+rejected.Load(), total)
	}
	if allowed.Load() > clLimit {
		t.Errorf("two replicas allowed %d, more than the limit %d", allowed.Load(), clLimit)
	}
	// Closed failure mode: a decision Redis did not make (too slow on a loaded machine)
	// is a rejection, which may only lower the count.
	if fell == 0 && allowed.Load() != clLimit {
		t.Errorf("two replicas allowed %d with Redis answering every decision, want exactly %d", allowed.Load(), clLimit)
	}
	if hits := env.up.hits.Load() - hitsBefore; hits != allowed.Load() {
		t.Errorf("upstream saw %d requests, want the %d allowed", hits, allowed.Load())
	}
}

// (a) Orders keep coming while the node that leads the queue's stream is killed -9
// and later restarted: every 202 is delivered, once as the downstream sees it; what
// was refused meanwhile got 503 or 429.
func testClusterNATSLeaderKilled(t *testing.T, env *clusterEnv) {
	info := env.waitStreamHealthy(t)
	leader := info.Cluster.Leader
	node, err := strconv.Atoi(strings.TrimPrefix(leader, "n"))
	if err != nil || node < 1 || node > 3 {
		t.Fatalf("stream leader %q is not one of n1…n3", leader)
	}
	node-- // natstest names node i "n{i+1}"

	l := startClLoad(t, "nats", env.replicas, 4, 50*time.Millisecond, 2000)
	clWait(t, "60 orders accepted before the kill", 60*time.Second, func() bool { return len(l.accepted()) >= 60 })
	killedAt, acceptedAtKill := time.Now(), len(l.accepted())
	env.nats.Kill(node)
	t.Logf("killed %s, the orders stream's leader, with %d orders accepted and %d delivered", leader, acceptedAtKill, env.down.delivered())
	clWait(t, "orders accepted again with the leader dead", 60*time.Second, func() bool {
		return len(l.accepted()) >= acceptedAtKill+40
	})
	info2, err := env.streamInfo()
	if err == nil && info2.Cluster != nil {
		t.Logf("new leader %s after %s; %d more orders accepted", info2.Cluster.Leader, time.Since(killedAt).Round(time.Millisecond), len(l.accepted())-acceptedAtKill)
	}
	env.nats.Restart(node)
	env.nats.WaitReady()
	restartedAt := len(l.accepted())
	env.waitStreamHealthy(t)
	clWait(t, "orders accepted after the restart", 60*time.Second, func() bool { return len(l.accepted()) >= restartedAt+20 })
	l.halt()
	l.check(t, http.StatusOK, http.StatusAccepted, http.StatusServiceUnavailable, http.StatusTooManyRequests)
	env.waitDelivered(t, l, env.replicas[0])
}

// (b) Redis stops under load and starts again (empty): the front doors keep answering
// without a 5xx, each replica decides locally meanwhile and counts it, and goes back
// to Redis once it answers.
func testClusterRedisOutage(t *testing.T, env *clusterEnv) {
	const series = `sluice_limiter_fallback_total{mode="local"}`
	fallbacks := func() []float64 {
		return []float64{clMetric(t, env.replicas[0], series), clMetric(t, env.replicas[1], series)}
	}
	before := fallbacks()
	l := startClLoad(t, "redis", env.replicas, 4, 50*time.Millisecond, 2000)
	clWait(t, "30 orders accepted before Redis stops", 60*time.Second, func() bool { return len(l.accepted()) >= 30 })
	env.redis.Stop()
	stoppedAt := l.answered()
	clWait(t, "fallbacks counted on both replicas", 30*time.Second, func() bool {
		now := fallbacks()
		return now[0] > before[0] && now[1] > before[1]
	})
	clWait(t, "60 orders answered with Redis down", 60*time.Second, func() bool { return l.answered() >= stoppedAt+60 })
	during := fallbacks()
	if err := env.redis.Restart(); err != nil {
		t.Fatal(err)
	}
	// Back on Redis: across a stretch of at least 40 answers, no fallback is counted
	// any more. The probe backs off to at most 5s, so this comes within seconds.
	prev, prevAnswers := fallbacks(), l.answered()
	clWait(t, "the replicas back on Redis", 60*time.Second, func() bool {
		now, answers := fallbacks(), l.answered()
		if answers-prevAnswers < 40 {
			return false
		}
		if slices.Equal(now, prev) {
			return true
		}
		prev, prevAnswers = now, answers
		return false
	})
	keys, err := env.redis.Client().DBSize(context.Background()).Result()
	if err != nil || keys == 0 {
		t.Errorf("the restarted Redis holds %d keys (%v): the replicas do not use it", keys, err)
	}
	l.halt()
	after := fallbacks()
	t.Logf("fallbacks (local) per replica: before %v, after the outage %v, at the end %v; %d keys in the restarted Redis", before, during, after, keys)
	l.checkServed(t)
	env.waitDelivered(t, l, env.replicas[0])
}

// (c) The replica whose dispatcher delivers is killed -9 while the queue holds a
// backlog: the other keeps accepting, takes the queue over, and the downstream never
// sees more than the configured outflow allows.
func testClusterReplicaKilled(t *testing.T, env *clusterEnv) {
	phaseStart := time.Now()
	// Faster than the outflow, so a backlog builds up.
	l := startClLoad(t, "replica", env.replicas, 4, 5*time.Millisecond, 1000)
	deliveredBefore := env.down.delivered()
	clWait(t, "a backlog of 100 orders", 60*time.Second, func() bool {
		return len(l.accepted())-(env.down.delivered()-deliveredBefore) >= 100
	})
	// The pinned one is the replica whose delivered counter moves.
	const series = `sluice_queue_delivered_total{queue="orders"}`
	var victim, survivor *sluiceProcess
	clWait(t, "the delivering replica", 30*time.Second, func() bool {
		a0, b0 := clMetric(t, env.replicas[0], series), clMetric(t, env.replicas[1], series)
		time.Sleep(300 * time.Millisecond)
		da, db := clMetric(t, env.replicas[0], series)-a0, clMetric(t, env.replicas[1], series)-b0
		switch {
		case da > 0 && db == 0:
			victim, survivor = env.replicas[0], env.replicas[1]
		case db > 0 && da == 0:
			victim, survivor = env.replicas[1], env.replicas[0]
		}
		return victim != nil
	})
	l.drop(victim)
	killedAt, acceptedAtKill, deliveredAtKill := time.Now(), len(l.accepted()), env.down.delivered()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	env.replicas = []*sluiceProcess{survivor}
	t.Logf("killed the delivering replica with %d orders accepted in this run and %d delivered", acceptedAtKill, deliveredAtKill-deliveredBefore)
	clWait(t, "the survivor accepting", 60*time.Second, func() bool { return len(l.accepted()) >= acceptedAtKill+50 })
	l.halt()
	l.checkServed(t)
	clWait(t, "deliveries after the kill", 60*time.Second, func() bool { return env.down.delivered() > deliveredAtKill+50 })
	env.waitDelivered(t, l, survivor)

	// Pacing: no window of Δt holds more than ceil(rate × Δt) + 1 deliveries, before,
	// across and after the fail-over. The times are taken at the downstream, after the
	// connection and the scheduling of two processes on a loaded machine: a delivery that
	// arrives late can share a window with one paced a full window after it, so arrivals
	// are allowed clArrivalJitter on top of the bound. Two replicas delivering at once
	// would show twice the rate.
	arrivals := env.down.arrivalsSince(phaseStart)
	slack := int(math.Ceil(clOutflow * clArrivalJitter.Seconds()))
	for _, window := range []time.Duration{time.Second, 2 * time.Second, 5 * time.Second} {
		bound := int(math.Ceil(clOutflow*window.Seconds())) + 1
		most := clMaxInWindow(arrivals, window)
		t.Logf("most deliveries arriving in a window of %s: %d (pacing bound %d)", window, most, bound)
		if most > bound+slack {
			t.Errorf("%d deliveries arrived within %s: over the outflow bound %d (+%d for arrival jitter)", most, window, bound, slack)
		}
	}
	after := env.down.arrivalsSince(killedAt)
	if len(after) > 1 {
		span := after[len(after)-1].Sub(after[0])
		t.Logf("after the kill: %d deliveries over %s (%.1f/s against %d/s configured)", len(after), span.Round(time.Millisecond),
			float64(len(after)-1)/span.Seconds(), clOutflow)
	}
}

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

// clMaxInWindow returns the most times that fall in one window [t, t+w].
func clMaxInWindow(times []time.Time, w time.Duration) int {
	times = slices.Clone(times)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	most, j := 0, 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) <= w {
			j++
		}
		most = max(most, j-i)
	}
	return most
}

// sluice serve starts before its NATS cluster exists (a NATS rollout, pods started in
// any order): it does not exit, proxies what its rules allow, answers defers 503 with
// Retry-After, logs the wait once, and once the cluster forms it declares the queues
// and delivers what it then accepts.
func TestServeBeforeNATSCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node NATS cluster and sluice as processes")
	}
	cluster := natstest.PrepareCluster(t, 3) // ports known, nothing running
	up, down := newUpstream(t, 0), newClDownstream(t)
	rulesPath := writeRules(t, t.TempDir(), clusterRules(down.URL))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL,
		"--nats", cluster.URL(), "--queue-key", testQueueKey, "--replicas", "3"}, clDispatchFlags...)...)

	order := func(key string) result {
		t.Helper()
		r, err := postOrder(p.url, "/v1/orders", key, fmt.Sprintf(`{"order":%q}`, key), "Idempotency-Key", strconv.Quote(key))
		if err != nil {
			t.Fatalf("order %s: %v\n%s", key, err, p.output)
		}
		return r
	}
	// The orders rule allows one order an hour; it is proxied.
	if r := order("first"); r.status != http.StatusOK || r.header.Get("X-Upstream") != "yes" {
		t.Fatalf("first order with no NATS: %d %q, want 200 from the upstream", r.status, r.body)
	}
	for i := range 3 {
		r := order(fmt.Sprintf("early-%d", i))
		if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
			t.Fatalf("deferred order with no NATS: %d (Retry-After %q) %q, want 503 with Retry-After", r.status, r.header.Get("Retry-After"), r.body)
		}
	}
	if r := send(t, "GET", p.url+"/v1/limited", nil); r.status != http.StatusOK || r.header.Get("X-Upstream") != "yes" {
		t.Fatalf("allowed request with no NATS: %d %q", r.status, r.body)
	}
	// The replica serves: ready. NATS trouble shows in the status only.
	if r := send(t, "GET", p.admin+"/readyz", nil); r.status != http.StatusOK {
		t.Errorf("/readyz with no NATS: %d %s, want 200 (the replica serves)", r.status, r.body)
	}
	if st, _ := getStatusJSON(t, p, ""); st.Dependencies["nats"].State != "down" || st.Dependencies["nats"].LastError == "" {
		t.Errorf("status with no NATS: %+v, want nats down with its error", st.Dependencies["nats"])
	}
	// A reload while the declaration is retried: the newest set is what gets declared.
	writeRules(t, filepath.Dir(rulesPath), clusterRules(down.URL)+"  later:\n    outflow: {rate: 5/s}\n    downstream: "+down.URL+"\n")
	clWait(t, "the rules reloaded", 30*time.Second, func() bool { return strings.Contains(p.output.String(), "rules: reloaded") })
	select {
	case <-p.done:
		t.Fatalf("sluice exited with no NATS:\n%s", p.output)
	default:
	}

	if err := cluster.Start(); err != nil {
		t.Fatal(err)
	}
	// A client retrying with the same key, as a 503 asks: accepted once declared.
	var ticket string
	clWait(t, "a deferred order accepted once the cluster runs", 90*time.Second, func() bool {
		r := order("after-start")
		switch r.status {
		case http.StatusAccepted:
			var a accepted
			if err := json.Unmarshal([]byte(r.body), &a); err != nil || !queue.ValidTicket(a.Ticket) {
				t.Fatalf("202 body %q: %v", r.body, err)
			}
			ticket = a.Ticket
			return true
		case http.StatusServiceUnavailable:
			if r.header.Get("Retry-After") == "" {
				t.Fatalf("503 without Retry-After: %s", r.body)
			}
			time.Sleep(200 * time.Millisecond)
			return false
		}
		t.Fatalf("order while the cluster forms: %d %s", r.status, r.body)
		return false
	})
	clWait(t, "the order delivered downstream", 60*time.Second, func() bool { return len(down.missing([]string{ticket})) == 0 })
	waitStatus(t, p.url, ticket, "done", 30*time.Second)
	clWait(t, "status: nats up", 30*time.Second, func() bool {
		st, _ := getStatusJSON(t, p, "")
		return st.Dependencies["nats"].State == "up"
	})

	out := p.output.String()
	if n := strings.Count(out, "queues not declared yet"); n != 1 {
		t.Errorf("the wait for NATS logged %d times, want once (at the state change):\n%s", n, out)
	}
	if !strings.Contains(out, "queues declared") || !strings.Contains(out, `msg=dispatching queue=orders`) ||
		!strings.Contains(out, `msg=dispatching queue=later`) {
		t.Errorf("no log of the queues declared and dispatched:\n%s", out)
	}
	js, err := jetstream.New(cluster.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{queue.StreamName("orders"), queue.StreamName("later"), queue.DeadStream} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatalf("stream %s: %v", name, err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3", name, r)
		}
	}
}
