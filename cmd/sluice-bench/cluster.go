package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/cmd/internal/progress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/childproc"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

const clusterHelp = `Usage: sluice-bench cluster [flags]

Runs the clustered shape on this machine and puts a steady load through it: three
nats-server processes in one JetStream cluster (the queue stream has 3 replicas), one
redis-server, --replicas 'sluice serve' processes sharing both, an upstream for the
requests within their limits, and a downstream for deferred orders that deduplicates
by Idempotency-Key, as an idempotent API does.

The load is --rate requests per second for --duration, spread over the replicas:
  POST /v1/orders  per user (--users of them) a token bucket of 2 refilling 1/s; over
                   it the order is deferred into the queue "orders", drained to the
                   downstream at --outflow across all replicas;
  GET /v1/quotes   a --quote-share of the requests, limited to 10/s in all; over it 429.
Faults can be injected at given times into the run: the node leading the queue's
stream killed -9 (restarted --nats-down-for later), Redis stopped (restarted empty
--redis-down-for later), the replica whose dispatcher delivers killed -9 (not
restarted). After the load the queue drains (at most --drain-timeout), then the
report: requests accepted (proxied at once), rejected (429), deferred (202),
unavailable (503), deferred orders delivered and lost (must be 0), duplicate
deliveries the downstream suppressed, and the achieved outflow against the
configured one. The exit status is 1 when an order was lost.

sluice and nats-server (the version in go.mod) are built unless --sluice and
--nats-server name binaries; building needs the repository as working directory.
`

const clusterBenchRules = `domain: bench-cluster
descriptors:
  - key: route
    value: orders
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1, name: orders_per_user}
        algorithm: token_bucket
        burst: 2
        on_limit: defer
        queue: orders
  - key: route
    value: quotes
    rate_limit: {unit: second, requests_per_unit: 10, name: quotes}
    algorithm: token_bucket
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors:
      - [{key: route, value: orders}, {key: user, from: "header:X-User-ID"}]
  - name: quotes
    match: {path: /v1/quotes}
    descriptors:
      - [{key: route, value: quotes}]
queues:
  orders:
    outflow: {rate: %s}
    max_in_flight: 8
    downstream: %s
`

type clusterConfig struct {
	duration, drainTimeout                  time.Duration
	rate, workers, replicas, users          int
	quoteShare                              float64
	outflow                                 limiter.Rate
	killNATSAt, natsDownFor                 time.Duration
	stopRedisAt, redisDownFor               time.Duration
	killReplicaAt                           time.Duration
	deliveryTimeout, ackWait, failoverAfter time.Duration
	progressEvery                           time.Duration
	sluicePath, natsServerPath              string
}

func runCluster(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("cluster", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg clusterConfig
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long the load runs")
	fs.IntVar(&cfg.rate, "rate", 100, "requests per second, orders and quotes together")
	fs.IntVar(&cfg.workers, "workers", 64, "most requests under way at once")
	fs.IntVar(&cfg.replicas, "replicas", 2, "sluice serve replicas")
	fs.IntVar(&cfg.users, "users", 20, "distinct users placing orders")
	fs.Float64Var(&cfg.quoteShare, "quote-share", 0.2, "share of the requests that are quotes (0 to 1)")
	outflow := fs.String("outflow", "50/s", "outflow `rate` of the orders queue")
	fs.DurationVar(&cfg.killNATSAt, "kill-nats-at", 0, "kill -9 the NATS node leading the queue's stream this long into the load (0: never)")
	fs.DurationVar(&cfg.natsDownFor, "nats-down-for", 3*time.Second, "how long the killed NATS node stays down")
	fs.DurationVar(&cfg.stopRedisAt, "stop-redis-at", 0, "stop Redis this long into the load (0: never)")
	fs.DurationVar(&cfg.redisDownFor, "redis-down-for", 3*time.Second, "how long Redis stays down")
	fs.DurationVar(&cfg.killReplicaAt, "kill-replica-at", 0, "kill -9 the replica whose dispatcher delivers this long into the load (0: never; needs --replicas 2 or more)")
	fs.DurationVar(&cfg.drainTimeout, "drain-timeout", 2*time.Minute, "longest wait for the queue to drain after the load")
	fs.DurationVar(&cfg.deliveryTimeout, "delivery-timeout", 3*time.Second, "the replicas' --delivery-timeout")
	fs.DurationVar(&cfg.ackWait, "ack-wait", 5*time.Second, "the replicas' --ack-wait: when a killed dispatcher's messages come back")
	fs.DurationVar(&cfg.failoverAfter, "failover-after", time.Second, "the replicas' --failover-after: when another replica takes a dead one's queue")
	fs.DurationVar(&cfg.progressEvery, "progress-every", 0, "progress line interval (default: 250ms on a terminal, 1s otherwise)")
	fs.StringVar(&cfg.sluicePath, "sluice", "", "sluice binary to run (default: build ./cmd/sluice)")
	fs.StringVar(&cfg.natsServerPath, "nats-server", "", "nats-server binary to run (default: build the version in go.mod)")
	out := addOutputFlags(fs, false)
	if code, done := parseModeFlags(fs, args, clusterHelp, stdout); done {
		return code
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice-bench cluster: "+format+"\n", a...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return usageErr("unexpected argument %q", fs.Arg(0))
	}
	f := strings.TrimSpace(*outflow)
	if !strings.Contains(f, "/") {
		f += "/s"
	}
	var err error
	if cfg.outflow, err = limiter.ParseRate(f); err != nil {
		return usageErr("--outflow: %v", err)
	}
	switch {
	case cfg.duration <= 0 || cfg.rate <= 0 || cfg.workers <= 0 || cfg.users <= 0 || cfg.drainTimeout <= 0:
		return usageErr("--duration, --rate, --workers, --users and --drain-timeout must be positive")
	case cfg.replicas < 1:
		return usageErr("--replicas must be at least 1")
	case cfg.quoteShare < 0 || cfg.quoteShare > 1:
		return usageErr("--quote-share must be between 0 and 1")
	case cfg.killNATSAt < 0 || cfg.stopRedisAt < 0 || cfg.killReplicaAt < 0:
		return usageErr("fault times must not be negative")
	case cfg.killReplicaAt > 0 && cfg.replicas < 2:
		return usageErr("--kill-replica-at needs --replicas 2 or more")
	case cfg.ackWait <= cfg.deliveryTimeout:
		return usageErr("--ack-wait must exceed --delivery-timeout")
	}

	b := &clusterBench{cfg: cfg, stderr: stderr}
	defer b.close()
	if err := b.start(ctx); err != nil {
		fmt.Fprintf(stderr, "sluice-bench cluster: %v\n", err)
		return exitFailure
	}
	rep, err := b.run(ctx)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench cluster: %v\n", err)
		return exitFailure
	}
	if out.json {
		err = rep.writeJSON(stdout, cfg)
	} else {
		err = rep.write(stdout)
	}
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench cluster: writing the report: %v\n", err)
		return exitFailure
	}
	if rep.Lost > 0 || !rep.Drained {
		fmt.Fprintf(stderr, "sluice-bench cluster: %d accepted orders lost, queue drained: %v\n", rep.Lost, rep.Drained)
		return exitFailure
	}
	return exitOK
}

// clusterBench is one run: the processes, the servers it runs in process, and what
// the load saw.
type clusterBench struct {
	cfg    clusterConfig
	stderr io.Writer
	dir    string

	nats     *natstest.Cluster
	redis    *redistest.Server
	replicas []*benchReplica
	live     atomic.Pointer[[]*benchReplica]
	up, down *http.Server
	ds       *benchDownstream
	js       jetstream.JetStream
	nc       *nats.Conn

	sent, accepted, rejected, deferred, unavailable, cutOff, errs atomic.Int64
	firstErr                                                      atomic.Pointer[string]

	mu       sync.Mutex
	tickets  []string
	parkedAt []time.Time // when each 202 came
	events   []string    // faults, as they happen
}

// benchReplica is one sluice serve process.
type benchReplica struct {
	name, url, admin, log string
	proc                  *childproc.Process
}

func (b *clusterBench) start(ctx context.Context) (err error) {
	if b.dir, err = os.MkdirTemp("", "sluice-bench-cluster-"); err != nil {
		return err
	}
	if b.cfg.sluicePath == "" {
		fmt.Fprintln(b.stderr, "building sluice…")
		b.cfg.sluicePath = filepath.Join(b.dir, "sluice")
		if err := buildSluice(ctx, b.cfg.sluicePath); err != nil {
			return err
		}
	}
	if b.cfg.natsServerPath == "" {
		fmt.Fprintln(b.stderr, "building nats-server (the version in go.mod; cached after the first time)…")
		if b.cfg.natsServerPath, err = natstest.ServerBinary(); err != nil {
			return fmt.Errorf("%w (run from within the repository, or pass --nats-server)", err)
		}
	}
	fmt.Fprintln(b.stderr, "starting 3 NATS nodes, Redis, the upstream and the downstream…")
	if b.nats, err = natstest.NewCluster(3, natstest.WithServerBinary(b.cfg.natsServerPath)); err != nil {
		return err
	}
	if b.redis, err = redistest.New(); err != nil {
		return fmt.Errorf("starting redis-server: %w", err)
	}
	b.ds = newBenchDownstream()
	if b.down, err = serveLocal(b.ds); err != nil {
		return err
	}
	okBody := []byte(`{"ok":true}`)
	if b.up, err = serveLocal(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(okBody)
	})); err != nil {
		return err
	}
	rulesPath := filepath.Join(b.dir, "rules.yaml")
	rules := fmt.Sprintf(clusterBenchRules, b.cfg.outflow, "http://"+b.down.Addr)
	if err := os.WriteFile(rulesPath, []byte(rules), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(b.stderr, "starting %d sluice replicas…\n", b.cfg.replicas)
	queueKey := base64.StdEncoding.EncodeToString(benchKey()) // shared by the replicas, like their NATS
	for i := range b.cfg.replicas {
		listen, admin := freeAddr(), freeAddr()
		r := &benchReplica{name: fmt.Sprintf("sluice-%d", i+1), url: "http://" + listen, admin: "http://" + admin,
			log: filepath.Join(b.dir, fmt.Sprintf("sluice-%d.log", i+1))}
		args := []string{"serve", "--rules", rulesPath, "--upstream", "http://" + b.up.Addr,
			"--listen", listen, "--admin-listen", admin, "--log-level", "warn",
			"--data-dir", filepath.Join(b.dir, r.name), "--nats", b.nats.URL(), "--queue-key", queueKey, "--replicas", "3",
			"--redis", "redis://" + b.redis.Addr() + "/0",
			"--delivery-timeout", b.cfg.deliveryTimeout.String(), "--ack-wait", b.cfg.ackWait.String(),
			"--failover-after", b.cfg.failoverAfter.String()}
		if err := r.start(ctx, b.cfg.sluicePath, args); err != nil {
			return err
		}
		b.replicas = append(b.replicas, r)
	}
	live := slices.Clone(b.replicas)
	b.live.Store(&live)
	if b.nc, err = nats.Connect(b.nats.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond)); err != nil {
		return fmt.Errorf("connecting to NATS: %w", err)
	}
	if b.js, err = jetstream.New(b.nc); err != nil {
		return err
	}
	return nil
}

func (r *benchReplica) start(ctx context.Context, bin string, args []string) error {
	proc, err := childproc.Start(exec.Command(bin, args...), r.log)
	if err != nil {
		return fmt.Errorf("%s: %w", r.name, err)
	}
	r.proc = proc
	// Ready (serving) and its queues declared: /readyz does not wait for NATS.
	if err := proc.WaitReady(ctx, 60*time.Second, 50*time.Millisecond, r.ready); err != nil {
		return fmt.Errorf("%s: %w:\n%s", r.name, err, childproc.Tail(r.log, 3000))
	}
	return nil
}

// ready reports whether the replica's /readyz answers 200 and its status shows NATS
// up (the queues declared).
func (r *benchReplica) ready() bool {
	resp, err := http.Get(r.admin + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false
	}
	resp, err = http.Get(r.admin + "/sluice/v1/status")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var st struct {
		Dependencies map[string]struct {
			State string `json:"state"`
		} `json:"dependencies"`
	}
	return json.NewDecoder(resp.Body).Decode(&st) == nil && st.Dependencies["nats"].State == "up"
}

func (r *benchReplica) kill() {
	if r.proc != nil {
		r.proc.Kill()
	}
}

func serveLocal(h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

func (b *clusterBench) close() {
	if b.nc != nil {
		b.nc.Close()
	}
	for _, r := range b.replicas {
		r.kill()
	}
	if b.nats != nil {
		b.nats.Close()
	}
	if b.redis != nil {
		b.redis.Close()
	}
	for _, s := range []*http.Server{b.up, b.down} {
		if s != nil {
			_ = s.Close()
		}
	}
	if b.dir != "" {
		_ = os.RemoveAll(b.dir)
	}
}

func (b *clusterBench) event(format string, a ...any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.events = append(b.events, fmt.Sprintf(format, a...))
}

func (b *clusterBench) fail(format string, a ...any) {
	b.errs.Add(1)
	msg := fmt.Sprintf(format, a...)
	b.firstErr.CompareAndSwap(nil, &msg)
}

// run sends the load, injects the faults, waits for the queue to drain and sums up.
func (b *clusterBench) run(ctx context.Context) (*clusterReport, error) {
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: b.cfg.workers, MaxIdleConnsPerHost: b.cfg.workers}}
	defer client.CloseIdleConnections()
	start := time.Now()
	var faults sync.WaitGroup
	faultCtx, stopFaults := context.WithCancel(ctx)
	defer stopFaults()
	at := func(d time.Duration, f func()) {
		if d <= 0 {
			return
		}
		faults.Go(func() {
			select {
			case <-time.After(time.Until(start.Add(d))):
				f()
			case <-faultCtx.Done():
			}
		})
	}
	at(b.cfg.killNATSAt, func() { b.killNATSLeader(faultCtx, start) })
	at(b.cfg.stopRedisAt, func() { b.stopRedis(faultCtx, start) })
	at(b.cfg.killReplicaAt, func() { b.killDeliveringReplica(start) })

	prog := newClusterProgress(b.stderr, b.cfg.progressEvery)
	stopProg := make(chan struct{})
	var progDone sync.WaitGroup
	phase := atomic.Pointer[string]{}
	loading := "load"
	phase.Store(&loading)
	progDone.Go(func() {
		t := time.NewTicker(prog.every)
		defer t.Stop()
		for {
			select {
			case <-stopProg:
				return
			case <-t.C:
				prog.Show(b.progressLine(start, *phase.Load()))
			}
		}
	})

	// The load: request i starts at start + i/rate, at most --workers under way.
	interval := time.Duration(float64(time.Second) / float64(b.cfg.rate))
	sem := make(chan struct{}, b.cfg.workers)
	var inFlight sync.WaitGroup
load:
	for i := 0; ; i++ {
		next := start.Add(time.Duration(i) * interval)
		if next.Sub(start) >= b.cfg.duration {
			break
		}
		select {
		case <-time.After(time.Until(next)):
		case <-ctx.Done():
			break load
		}
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
			break load
		}
		inFlight.Go(func() {
			defer func() { <-sem }()
			b.request(client, i)
		})
	}
	inFlight.Wait()
	loadEnd := time.Now()
	// Faults still pending restart what they stopped before the drain.
	faults.Wait()

	draining := "draining"
	phase.Store(&draining)
	b.mu.Lock()
	tickets := slices.Clone(b.tickets)
	b.mu.Unlock()
	drained := b.drain(ctx, tickets)
	close(stopProg)
	progDone.Wait()
	prog.Show(b.progressLine(start, "done"))
	prog.End()
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return b.report(start, loadEnd, tickets, drained), nil
}

func (b *clusterBench) progressLine(start time.Time, phase string) string {
	return fmt.Sprintf("%-8s elapsed %5.1fs  accepted %d  rejected %d  deferred %d  delivered %d  unavailable %d  errors %d",
		phase, time.Since(start).Seconds(), b.accepted.Load(), b.rejected.Load(), b.deferred.Load(),
		b.ds.unique(), b.unavailable.Load(), b.errs.Load())
}

// request sends request i: an order, or a quote for a share of them.
func (b *clusterBench) request(client *http.Client, i int) {
	live := *b.live.Load()
	if len(live) == 0 {
		return
	}
	r := live[i%len(live)]
	quote := int(float64(i+1)*b.cfg.quoteShare) > int(float64(i)*b.cfg.quoteShare)
	var req *http.Request
	if quote {
		req, _ = http.NewRequest("GET", r.url+"/v1/quotes", nil)
	} else {
		order := "o-" + strconv.Itoa(i)
		req, _ = http.NewRequest("POST", r.url+"/v1/orders", strings.NewReader(`{"order":"`+order+`"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-User-ID", "user-"+strconv.Itoa(i%b.cfg.users))
		req.Header.Set("X-Order", order)
		req.Header.Set("Idempotency-Key", strconv.Quote(order))
	}
	b.sent.Add(1)
	resp, err := client.Do(req)
	if err != nil {
		if !slices.Contains(*b.live.Load(), r) {
			b.cutOff.Add(1) // sent to a replica killed under it
			return
		}
		b.fail("%s %s: %v", req.Method, req.URL.Path, err)
		return
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		b.accepted.Add(1)
	case http.StatusTooManyRequests:
		b.rejected.Add(1)
	case http.StatusServiceUnavailable:
		b.unavailable.Add(1)
	case http.StatusAccepted:
		var a struct {
			Ticket string `json:"ticket"`
		}
		if err := json.Unmarshal(body, &a); err != nil || !queue.ValidTicket(a.Ticket) {
			b.fail("202 with body %q", body)
			return
		}
		b.deferred.Add(1)
		b.mu.Lock()
		b.tickets = append(b.tickets, a.Ticket)
		b.parkedAt = append(b.parkedAt, time.Now())
		b.mu.Unlock()
	default:
		b.fail("%s %s: status %d: %s", req.Method, req.URL.Path, resp.StatusCode, body)
	}
}

// killNATSLeader kills the node leading the orders stream and restarts it later.
func (b *clusterBench) killNATSLeader(ctx context.Context, start time.Time) {
	ictx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	leader := ""
	if s, err := b.js.Stream(ictx, queue.StreamName("orders")); err == nil {
		if info, err := s.Info(ictx); err == nil && info.Cluster != nil {
			leader = info.Cluster.Leader
		}
	}
	i := b.nats.Node(leader)
	if i < 0 {
		b.event("%5.1fs  NATS: the orders stream has no leader to kill (%q)", time.Since(start).Seconds(), leader)
		return
	}
	b.nats.Kill(i)
	b.event("%5.1fs  NATS node %s, the orders stream's leader, killed -9", time.Since(start).Seconds(), leader)
	select {
	case <-time.After(b.cfg.natsDownFor):
	case <-ctx.Done():
	}
	if err := b.nats.RestartNode(i); err != nil {
		b.event("%5.1fs  NATS node %s not restarted: %v", time.Since(start).Seconds(), leader, err)
		return
	}
	b.event("%5.1fs  NATS node %s restarted", time.Since(start).Seconds(), leader)
}

func (b *clusterBench) stopRedis(ctx context.Context, start time.Time) {
	b.redis.Stop()
	b.event("%5.1fs  Redis stopped", time.Since(start).Seconds())
	select {
	case <-time.After(b.cfg.redisDownFor):
	case <-ctx.Done():
	}
	if err := b.redis.Restart(); err != nil {
		b.event("%5.1fs  Redis not restarted: %v", time.Since(start).Seconds(), err)
		return
	}
	b.event("%5.1fs  Redis restarted (empty)", time.Since(start).Seconds())
}

// killDeliveringReplica kills the replica whose delivered counter moves (the one the
// queue is pinned to), or the first one when none delivers just now.
func (b *clusterBench) killDeliveringReplica(start time.Time) {
	live := *b.live.Load()
	const series = `sluice_queue_delivered_total{queue="orders"}`
	before := make([]float64, len(live))
	for i, r := range live {
		before[i] = metricSum(r.admin, series)
	}
	time.Sleep(300 * time.Millisecond)
	victim, why := live[0], "the first"
	for i, r := range live {
		if metricSum(r.admin, series) > before[i] {
			victim, why = r, "the delivering"
			break
		}
	}
	rest := slices.DeleteFunc(slices.Clone(live), func(r *benchReplica) bool { return r == victim })
	b.live.Store(&rest)
	victim.kill()
	b.event("%5.1fs  %s (%s replica) killed -9", time.Since(start).Seconds(), victim.name, why)
}

// metricsClient bounds a scrape: sluice answers /metrics within about 2s even while
// the queue's stream has no leader (its depth is then left out).
var metricsClient = &http.Client{Timeout: 3 * time.Second}

// metricSum sums the samples of the series starting with prefix on an admin listener
// (NaN when it cannot be read).
func metricSum(admin, prefix string) float64 {
	resp, err := metricsClient.Get(admin + "/metrics")
	if err != nil {
		return math.NaN()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		if i := strings.LastIndexByte(line, ' '); i > 0 {
			if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// drain waits until every deferred order has reached the downstream and the queue is
// empty on a live replica (nothing unacknowledged left to be redelivered).
func (b *clusterBench) drain(ctx context.Context, tickets []string) bool {
	deadline := time.Now().Add(b.cfg.drainTimeout)
	for b.ds.missing(tickets) > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(100 * time.Millisecond)
	}
	for {
		live := *b.live.Load()
		if metricSum(live[0].admin, `sluice_queue_depth{queue="orders"}`) == 0 {
			return true
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(200 * time.Millisecond)
	}
}

type clusterReport struct {
	Replicas    int           `json:"-"` // in the parameters of the JSON document
	Rate        int           `json:"-"`
	Duration    time.Duration `json:"-"`
	Sent        int64         `json:"sent"`
	Accepted    int64         `json:"accepted"`
	Rejected    int64         `json:"rejected"`
	Deferred    int64         `json:"deferred"`
	Unavailable int64         `json:"unavailable"`
	CutOff      int64         `json:"cut_off"`
	Errors      int64         `json:"errors"`
	FirstError  string        `json:"first_error,omitempty"`
	Delivered   int           `json:"delivered"`
	Lost        int           `json:"lost"`
	Duplicates  int           `json:"duplicates"`
	Unpromised  int           `json:"unpromised"`
	Drained     bool          `json:"drained"`
	DrainTime   time.Duration `json:"-"`
	Outflow     limiter.Rate  `json:"-"`
	Achieved    float64       `json:"achieved_outflow_per_second"` // deliveries per second while the queue held a backlog; 0: never backlogged
	MaxWindow   int           `json:"max_in_1s"`                   // most deliveries in one second
	Bound       int           `json:"bound_in_1s"`                 // ceil(rate × 1s) + 1
	Events      []string      `json:"events"`
}

// writeJSON writes the report and the parameters of the run as one JSON document.
func (r *clusterReport) writeJSON(w io.Writer, cfg clusterConfig) error {
	events := r.Events
	if events == nil {
		events = []string{}
	}
	rep := *r
	rep.Events = events
	return writeJSONDoc(w, struct {
		runInfo
		Duration         string         `json:"duration"`
		Rate             int            `json:"rate"`
		Workers          int            `json:"workers"`
		Replicas         int            `json:"replicas"`
		Users            int            `json:"users"`
		QuoteShare       float64        `json:"quote_share"`
		Outflow          string         `json:"outflow"`
		OutflowPerSecond float64        `json:"outflow_per_second"`
		KillNATSAt       string         `json:"kill_nats_at"`
		NATSDownFor      string         `json:"nats_down_for"`
		StopRedisAt      string         `json:"stop_redis_at"`
		RedisDownFor     string         `json:"redis_down_for"`
		KillReplicaAt    string         `json:"kill_replica_at"`
		DrainSeconds     float64        `json:"drain_seconds"`
		Report           *clusterReport `json:"report"`
	}{newRunInfo("cluster"), cfg.duration.String(), cfg.rate, cfg.workers, cfg.replicas, cfg.users, cfg.quoteShare,
		cfg.outflow.String(), cfg.outflow.PerSecondFloat(), cfg.killNATSAt.String(), cfg.natsDownFor.String(),
		cfg.stopRedisAt.String(), cfg.redisDownFor.String(), cfg.killReplicaAt.String(), r.DrainTime.Seconds(),
		&rep})
}

func (b *clusterBench) report(start, loadEnd time.Time, tickets []string, drained bool) *clusterReport {
	rep := &clusterReport{
		Replicas: b.cfg.replicas, Rate: b.cfg.rate, Duration: b.cfg.duration,
		Sent: b.sent.Load(), Accepted: b.accepted.Load(), Rejected: b.rejected.Load(),
		Deferred: b.deferred.Load(), Unavailable: b.unavailable.Load(), CutOff: b.cutOff.Load(),
		Errors: b.errs.Load(), Drained: drained, DrainTime: time.Since(loadEnd), Outflow: b.cfg.outflow,
	}
	if e := b.firstErr.Load(); e != nil {
		rep.FirstError = *e
	}
	rep.Delivered, rep.Lost, rep.Duplicates, rep.Unpromised = b.ds.tally(tickets)
	b.mu.Lock()
	rep.Events = slices.Clone(b.events)
	parked := slices.Clone(b.parkedAt)
	b.mu.Unlock()
	arrivals := b.ds.times()
	res := pacingStats(b.cfg.outflow, "", arrivals, time.Second, 0)
	rep.MaxWindow, rep.Bound = res.MaxWindow, res.Bound
	rep.Achieved = backloggedRate(parked, arrivals)
	return rep
}

// backloggedRate is the deliveries per second over the gaps between deliveries that
// began while orders were waiting (more deferred than delivered so far): the outflow
// the queue achieved when it had work, not diluted by times it ran empty.
func backloggedRate(parked, arrivals []time.Time) float64 {
	slices.SortFunc(parked, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(arrivals, func(a, b time.Time) int { return a.Compare(b) })
	var busy time.Duration
	n, p := 0, 0
	for i := 0; i+1 < len(arrivals); i++ {
		for p < len(parked) && !parked[p].After(arrivals[i]) {
			p++
		}
		if p > i+1 { // another order was waiting when delivery i arrived
			busy += arrivals[i+1].Sub(arrivals[i])
			n++
		}
	}
	if n < 10 || busy <= 0 { // too few to tell a rate
		return 0
	}
	return float64(n) / busy.Seconds()
}

func (r *clusterReport) write(w io.Writer) error {
	fmt.Fprintf(w, "Clustered shape: %d sluice replicas, 3 NATS nodes (queue stream R3), Redis; %d req/s for %s; outflow %s\n",
		r.Replicas, r.Rate, r.Duration, r.Outflow)
	for _, e := range r.Events {
		fmt.Fprintf(w, "  %s\n", e)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "METRIC\tVALUE\tMEANING")
	row := func(name string, v any, meaning string) { fmt.Fprintf(tw, "%s\t%v\t%s\n", name, v, meaning) }
	row("sent", r.Sent, "requests sent")
	row("accepted", r.Accepted, "within their limit, proxied at once (200)")
	row("rejected", r.Rejected, "over a reject limit (429)")
	row("deferred", r.Deferred, "over a defer limit, parked in the queue (202)")
	row("unavailable", r.Unavailable, "refused while NATS could not store them (503), never a 202")
	if r.CutOff > 0 {
		row("cut off", r.CutOff, "sent to a replica killed under them; no answer")
	}
	errNote := "anything else: transport errors, unexpected statuses"
	if r.FirstError != "" {
		errNote += "; first: " + r.FirstError
	}
	row("errors", r.Errors, errNote)
	row("delivered", r.Delivered, "deferred orders that reached the downstream")
	row("lost", r.Lost, "deferred orders never delivered (must be 0)")
	row("duplicates", r.Duplicates, "repeat deliveries of one Idempotency-Key, suppressed by the downstream")
	row("unpromised", r.Unpromised, "delivered although the client got no 202 (its answer lost to a fault)")
	if r.Achieved > 0 {
		row("outflow", fmt.Sprintf("%.1f/s", r.Achieved), fmt.Sprintf("achieved while orders waited, against %.1f/s configured", r.Outflow.PerSecondFloat()))
	} else {
		row("outflow", "n/a", fmt.Sprintf("orders never waited: the load deferred less than the %.1f/s configured", r.Outflow.PerSecondFloat()))
	}
	row("max/1s", r.MaxWindow, fmt.Sprintf("most deliveries in any second at the downstream; bound ceil(rate×1s)+1 = %d", r.Bound))
	drain := r.DrainTime.Round(10 * time.Millisecond).String()
	if !r.Drained {
		drain = "not drained after " + drain
	}
	row("drain", drain, "after the load ended, until the queue was empty")
	return tw.Flush()
}

// benchDownstream is the orders API: it counts deliveries per ticket (Sluice-Ticket;
// the Idempotency-Key is the client's own) and records when each request arrived.
type benchDownstream struct {
	mu       sync.Mutex
	count    map[string]int
	arrivals []time.Time
}

func newBenchDownstream() *benchDownstream { return &benchDownstream{count: map[string]int{}} }

func (d *benchDownstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	_, _ = io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Sluice-Ticket")
	d.mu.Lock()
	d.arrivals = append(d.arrivals, now)
	d.count[key]++
	d.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write([]byte(`{"accepted":true}`))
}

func (d *benchDownstream) unique() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.count)
}

func (d *benchDownstream) missing(tickets []string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, tk := range tickets {
		if d.count[tk] == 0 {
			n++
		}
	}
	return n
}

// tally returns the tickets delivered and lost, the repeat deliveries and the keys
// delivered that no client was given.
func (d *benchDownstream) tally(tickets []string) (delivered, lost, duplicates, unpromised int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	promised := make(map[string]bool, len(tickets))
	for _, tk := range tickets {
		promised[tk] = true
		if d.count[tk] > 0 {
			delivered++
		} else {
			lost++
		}
	}
	for k, n := range d.count {
		duplicates += n - 1
		if !promised[k] {
			unpromised++
		}
	}
	return delivered, lost, duplicates, unpromised
}

func (d *benchDownstream) times() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.arrivals)
}

// clusterProgress is the one line that tells how the run goes: rewritten in place on
// a terminal, a line per interval elsewhere (CI logs, pipes).
type clusterProgress struct {
	*progress.Line
	every time.Duration
}

func newClusterProgress(w io.Writer, every time.Duration) *clusterProgress {
	p := &clusterProgress{Line: progress.New(w), every: every}
	if p.every <= 0 {
		p.every = time.Second
		if p.Terminal() {
			p.every = 250 * time.Millisecond
		}
	}
	return p
}
