package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
)

const pacingHelp = `Usage: sluice-bench pacing [flags]

Measures pacing accuracy at each outflow rate, side by side in one run:
  sluice pacer         pace.Pacer on the system clock (what dispatchers use)
  sluice transport     pace.NewTransport; times taken at a local HTTP server
  sluice dispatcher    parked orders drained by a dispatcher from an embedded NATS
                       server to a local HTTP server (times taken there); --dispatcher
  x/time/rate          rate.Limiter with burst 1, Wait per event
  time.Ticker          one tick per event
  deadline loop        next += 1/rate; sleep until next (catches up after a stall)
Each contender runs for --duration; halfway through, its caller stalls once for
--stall (a slow downstream, a GC pause), which separates pacers that catch up from
those that do not.

ACHIEVED is events per second from the first event to the last one before the stall
(the steady state), ERROR its deviation from the rate; MAX/WINDOW is the largest
number of events starting in any window of --window over the whole run (sliding,
starting at every event), BOUND is ceil(rate × window) + 1, the most the spec allows,
and OVER counts the windows above it. Run on an otherwise idle machine: every
contender sleeps on timers, and a busy machine wakes them late.

Flags:
`

type pacingConfig struct {
	rates      []limiter.Rate
	duration   time.Duration
	window     time.Duration
	stall      time.Duration
	sequential bool
	dispatcher bool
}

type pacingResult struct {
	Rate      string  `json:"rate"`
	Contender string  `json:"contender"`
	Events    int     `json:"events"`
	Achieved  float64 `json:"achieved_per_second"`
	ErrorPct  float64 `json:"error_percent"`
	MaxWindow int     `json:"max_in_window"`
	Bound     int     `json:"bound"`
	Over      int     `json:"windows_over_bound"`
	Note      string  `json:"note,omitempty"`
}

func runPacing(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("pacing", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg pacingConfig
	rates := fs.String("rates", "10,100,1000", "comma-separated outflow rates per second (or COUNT/PERIOD)")
	fs.DurationVar(&cfg.duration, "duration", 10*time.Second, "how long each contender runs at each rate")
	fs.DurationVar(&cfg.window, "window", 100*time.Millisecond, "window of the burst measurement")
	fs.DurationVar(&cfg.stall, "stall", 300*time.Millisecond, "one stall of the caller halfway through (0: none)")
	fs.BoolVar(&cfg.sequential, "sequential", false, "run the contenders one after the other instead of side by side")
	fs.BoolVar(&cfg.dispatcher, "dispatcher", true, "include the end-to-end dispatcher (embedded NATS, HTTP downstream)")
	out := addOutputFlags(fs, true)
	if code, done := parseModeFlags(fs, args, pacingHelp, stdout); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice-bench pacing: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	if cfg.duration <= 0 || cfg.window <= 0 || cfg.stall < 0 {
		fmt.Fprintln(stderr, "sluice-bench pacing: --duration and --window must be positive, --stall not negative")
		return exitUsage
	}
	for _, f := range strings.Split(*rates, ",") {
		f = strings.TrimSpace(f)
		if !strings.Contains(f, "/") {
			f += "/s"
		}
		r, err := limiter.ParseRate(f)
		if err != nil {
			fmt.Fprintf(stderr, "sluice-bench pacing: --rates: %v\n", err)
			return exitUsage
		}
		cfg.rates = append(cfg.rates, r)
	}

	var results []pacingResult
	for _, r := range cfg.rates {
		fmt.Fprintf(stderr, "pacing at %s for %s...\n", r, cfg.duration)
		res, err := pacingAtRate(ctx, cfg, r)
		if err != nil {
			fmt.Fprintf(stderr, "sluice-bench pacing: %v\n", err)
			return exitFailure
		}
		results = append(results, res...)
	}
	if out.svg != "" {
		if err := writeSVGFile(out.svg, pacingChart(cfg, results)); err != nil {
			fmt.Fprintf(stderr, "sluice-bench pacing: --svg: %v\n", err)
			return exitFailure
		}
	}
	if out.json {
		rates := make([]string, len(cfg.rates))
		for i, r := range cfg.rates {
			rates[i] = r.String()
		}
		if err := writeJSONDoc(stdout, struct {
			runInfo
			Rates      []string       `json:"rates"`
			Duration   string         `json:"duration"`
			Window     string         `json:"window"`
			Stall      string         `json:"stall"`
			Sequential bool           `json:"sequential"`
			Dispatcher bool           `json:"dispatcher"`
			Results    []pacingResult `json:"results"`
		}{newRunInfo("pacing"), rates, cfg.duration.String(), cfg.window.String(), cfg.stall.String(),
			cfg.sequential, cfg.dispatcher, results}); err != nil {
			fmt.Fprintf(stderr, "sluice-bench pacing: writing the results: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "RATE\tCONTENDER\tEVENTS\tACHIEVED/s\tERROR\tMAX/%s\tBOUND\tOVER\t NOTE\n", cfg.window)
	for _, res := range results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%.2f\t%+.2f%%\t%d\t%d\t%d\t %s\n", res.Rate, res.Contender, res.Events,
			res.Achieved, res.ErrorPct, res.MaxWindow, res.Bound, res.Over, res.Note)
	}
	if err := tw.Flush(); err != nil {
		return exitFailure
	}
	return exitOK
}

// pacingChart draws the events per second each contender achieved in its steady
// state, a group per rate, with its ratio over the configured rate.
func pacingChart(cfg pacingConfig, results []pacingResult) barChart {
	order := "side by side"
	if cfg.sequential {
		order = "one after another"
	}
	c := barChart{
		Title: "sluice-bench pacing: achieved outflow",
		Subtitle: fmt.Sprintf("%s per contender and rate, contenders %s; one stall of %s halfway; GOMAXPROCS %d; %s",
			cfg.duration, order, cfg.stall, runtime.GOMAXPROCS(0), runtime.Version()),
		Unit: "events/s",
		Note: "ratio: achieved events per second (before the stall) over the configured rate (1.00x is exact)",
	}
	for _, r := range results {
		ratio := 0.0
		if rt, err := limiter.ParseRate(r.Rate); err == nil && rt.PerSecondFloat() > 0 {
			ratio = r.Achieved / rt.PerSecondFloat()
		}
		c.Bars = append(c.Bars, bar{Group: "rate " + r.Rate, Label: r.Contender, Value: r.Achieved, Ratio: ratio,
			Sluice: strings.HasPrefix(r.Contender, "sluice ")})
	}
	return c
}

// pacingContender produces event times at rate r for d, stalling once at d/2.
type pacingContender struct {
	name string
	run  func(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error)
	note string
}

func pacingAtRate(ctx context.Context, cfg pacingConfig, r limiter.Rate) ([]pacingResult, error) {
	contenders := []pacingContender{
		{name: "sluice pacer", run: pacePacer},
		{name: "sluice transport", run: paceTransport, note: "times at the server"},
		{name: "x/time/rate", run: paceXRate},
		{name: "time.Ticker", run: paceTicker},
		{name: "deadline loop", run: paceDeadline},
	}
	if cfg.dispatcher {
		contenders = append(contenders, pacingContender{name: "sluice dispatcher", run: paceDispatcher, note: "times at the server; no stall (parked first)"})
	}
	out := make([]pacingResult, len(contenders))
	errs := make([]error, len(contenders))
	var wg sync.WaitGroup
	for i, c := range contenders {
		run := func() {
			times, err := c.run(ctx, r, cfg.duration, cfg.stall)
			if err != nil {
				errs[i] = fmt.Errorf("%s at %s: %w", c.name, r, err)
				return
			}
			out[i] = pacingStats(r, c.name, times, cfg.window, cfg.duration/2)
			out[i].Note = c.note
		}
		if cfg.sequential {
			run()
			continue
		}
		wg.Add(1)
		go func() { defer wg.Done(); run() }()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

func pacingStats(r limiter.Rate, name string, times []time.Time, window, steadyFor time.Duration) pacingResult {
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	res := pacingResult{Rate: r.String(), Contender: name, Events: len(times)}
	hi, lo := uint64(r.Count)*uint64(window), uint64(r.Period)
	res.Bound = int((hi+lo-1)/lo) + 1
	if len(times) < 2 {
		return res
	}
	steadyEnd := times[0].Add(steadyFor)
	steady := 0
	for steady+1 < len(times) && !times[steady+1].After(steadyEnd) {
		steady++
	}
	if steady > 0 {
		span := times[steady].Sub(times[0]).Seconds()
		res.Achieved = float64(steady) / span
		res.ErrorPct = 100 * (res.Achieved/r.PerSecondFloat() - 1)
	}
	j := 0
	for i := range times {
		for j < len(times) && times[j].Sub(times[i]) <= window {
			j++
		}
		n := j - i
		res.MaxWindow = max(res.MaxWindow, n)
		if n > res.Bound {
			res.Over++
		}
	}
	return res
}

// stallOnce blocks the caller for stall the first time it is called after half of d.
type stallOnce struct {
	at    time.Time
	stall time.Duration
	done  bool
}

func (s *stallOnce) maybe(now time.Time) {
	if !s.done && s.stall > 0 && now.After(s.at) {
		s.done = true
		time.Sleep(s.stall)
	}
}

func pacePacer(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error) {
	p, err := pace.New(r)
	if err != nil {
		return nil, err
	}
	end := time.Now().Add(d)
	st := &stallOnce{at: time.Now().Add(d / 2), stall: stall}
	var times []time.Time
	for {
		g, err := p.Grant(ctx)
		if err != nil {
			return nil, err
		}
		if g.After(end) {
			return times, nil
		}
		times = append(times, g)
		st.maybe(g)
	}
}

func paceXRate(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error) {
	lim := rate.NewLimiter(rate.Limit(r.PerSecondFloat()), 1)
	end := time.Now().Add(d)
	st := &stallOnce{at: time.Now().Add(d / 2), stall: stall}
	var times []time.Time
	for {
		if err := lim.Wait(ctx); err != nil {
			return nil, err
		}
		now := time.Now()
		if now.After(end) {
			return times, nil
		}
		times = append(times, now)
		st.maybe(now)
	}
}

func paceTicker(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error) {
	t := time.NewTicker(r.Interval())
	defer t.Stop()
	end := time.Now().Add(d)
	st := &stallOnce{at: time.Now().Add(d / 2), stall: stall}
	var times []time.Time
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-t.C:
			now := time.Now()
			if now.After(end) {
				return times, nil
			}
			times = append(times, now)
			st.maybe(now)
		}
	}
}

func paceDeadline(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error) {
	next := time.Now()
	end := next.Add(d)
	st := &stallOnce{at: time.Now().Add(d / 2), stall: stall}
	var times []time.Time
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if wait := time.Until(next); wait > 0 {
			time.Sleep(wait)
		}
		now := time.Now()
		if now.After(end) {
			return times, nil
		}
		times = append(times, now)
		next = next.Add(r.Interval())
		st.maybe(now)
	}
}

// arrivalServer is a local HTTP server recording when requests arrive.
type arrivalServer struct {
	srv   *http.Server
	ln    net.Listener
	mu    sync.Mutex
	times []time.Time
}

func newArrivalServer() (*arrivalServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	a := &arrivalServer{ln: ln}
	a.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		a.mu.Lock()
		a.times = append(a.times, now)
		a.mu.Unlock()
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	})}
	go func() { _ = a.srv.Serve(ln) }()
	return a, nil
}

func (a *arrivalServer) URL() string { return "http://" + a.ln.Addr().String() }

func (a *arrivalServer) arrivals() []time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]time.Time(nil), a.times...)
}

func (a *arrivalServer) close() { _ = a.srv.Close() }

func paceTransport(ctx context.Context, r limiter.Rate, d, stall time.Duration) ([]time.Time, error) {
	srv, err := newArrivalServer()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	base := &http.Transport{MaxIdleConnsPerHost: 4}
	defer base.CloseIdleConnections()
	tr, err := pace.NewTransport(base, r)
	if err != nil {
		return nil, err
	}
	client := &http.Client{Transport: tr}
	end := time.Now().Add(d)
	st := &stallOnce{at: time.Now().Add(d / 2), stall: stall}
	for time.Now().Before(end) {
		req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL(), nil)
		resp, err := client.Do(req)
		if err != nil {
			return nil, err
		}
		_ = resp.Body.Close()
		st.maybe(time.Now())
	}
	times := srv.arrivals()
	for len(times) > 0 && times[len(times)-1].After(end) {
		times = times[:len(times)-1]
	}
	return times, nil
}

// paceDispatcher parks rate × d orders in an embedded NATS server, then measures when a
// dispatcher delivers them to a local HTTP server.
func paceDispatcher(ctx context.Context, r limiter.Rate, d, _ time.Duration) ([]time.Time, error) {
	nc, stop, err := tempNATS()
	if err != nil {
		return nil, err
	}
	defer stop()
	srv, err := newArrivalServer()
	if err != nil {
		return nil, err
	}
	defer srv.close()
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(benchKey()))
	if err != nil {
		return nil, err
	}
	n := int(math.Ceil(r.PerSecondFloat()*d.Seconds())) + 1
	cfg := queueconfig.Config{Name: "bench", Outflow: r, Downstream: srv.URL(), MaxInFlight: 64, MaxDepth: int64(n) + 10}
	if _, err := store.Declare(ctx, cfg); err != nil {
		return nil, err
	}
	if err := parkMany(ctx, store, "bench", n, 16, 256); err != nil {
		return nil, err
	}
	disp, err := dispatcher.New(store)
	if err != nil {
		return nil, err
	}
	dctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = disp.Run(dctx, "bench") }()
	deadline := time.Now().Add(2*d + 30*time.Second)
	for len(srv.arrivals()) < n && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	<-done
	return srv.arrivals(), nil
}

// parkMany parks n orders of size bytes with the given concurrency.
func parkMany(ctx context.Context, store *queue.Store, q string, n, concurrency, size int) error {
	body := []byte(strings.Repeat("x", size))
	var next sync.Mutex
	i := 0
	var wg sync.WaitGroup
	errs := make(chan error, concurrency)
	for range concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				next.Lock()
				if i >= n {
					next.Unlock()
					return
				}
				i++
				next.Unlock()
				_, err := store.Park(ctx, &queue.Request{Queue: q, Method: "POST", Path: "/orders", Body: body,
					Header: http.Header{"Content-Type": {"application/json"}}, Client: "bench"})
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

const parkingHelp = `Usage: sluice-bench parking [flags]

Measures orders parked per second on one embedded NATS server (JetStream in a temporary
directory, every write synced to disk before it is acknowledged), side by side:
  jetstream publish    raw synchronous JetStream publishes (wait for each PubAck) of the
                       same body size to a work-queue stream
  sluice park          queue.Store.Park: the same publish plus the request headers and
                       metadata, acknowledged before it returns
  sluice ingress       the front door end to end: an HTTP POST over a defer rule's limit,
                       parked, answered 202 (HTTP client and server in this process;
                       --client picks the callers' HTTP client). The front door is
                       sluice serve's with its default flags: its handler (the ticket
                       routes, the middleware on the memory limiter, metrics, tracing
                       off, the deferrer's body memory, lookup limit and waits) on its
                       server, the fast path (ingress/h1) before net/http's with serve's
                       timeouts; --server net/http: net/http's alone (--fast-path=false)
  sluice park+idem     Park with an Idempotency-Key per order (the order is a synced
                       write shared with concurrent callers' — see queue's group
                       commit; the key's slot is written before it, at once with the
                       key's lookup, in the server's memory)
  sluice ingress+idem  the front door with an Idempotency-Key per order
  --ceiling adds three:
  publish of a parked order
                       raw synchronous publishes of the message Park writes (a parked
                       order's headers and body, to the queue's stream, each on a
                       ticket subject of its own): what the server costs for sluice's
                       message, with none of sluice's code around it
  and, on the same server as the front door:
  front door 202       the server answering each POST 202 (the front door's headers and
                       a body of its length) without parking: HTTP alone
  HTTP 202 of Park     a handler that reads the body, parks it with Park as "sluice
                       park" does and answers 202: HTTP and Park, without sluice's
                       rules, middleware or deferrer
with the same number of concurrent callers. The contenders take turns for --rounds
rounds: PER SECOND is the median of the rounds, VS RAW the median of each round's
ratio of sluice's rate to the raw publishes' (ORDERS counts every round).
--cpuprofile DIR profiles each measurement on its own (this process holds the callers,
the front door and the embedded server): go tool pprof DIR/sluice-park+idem-16-r*.pprof
gives one contender's time at 16 callers over every round.

Flags:
`

// parkingRaw is the reference contender: JetStream publishes with no sluice around.
const parkingRaw = "jetstream publish"

// parkingCeiling is the contender of --ceiling: the front door's server answering
// 202 without parking.
const parkingCeiling = "front door 202 (no park)"

// parkingBare is the other contender of --ceiling: the front door's server with a
// handler that parks with Park as "sluice park" does and answers 202 (no rules, no
// middleware, no deferrer).
const parkingBare = "HTTP 202 of Park alone"

// parkingShape is the publish contender of --ceiling: what the server costs for the
// message Park writes (the queue's stream, a parked order's headers and body), with
// none of sluice's code around it.
const parkingShape = "publish of a parked order"

type parkingResult struct {
	Contender   string  `json:"contender"`
	Concurrency int     `json:"concurrency"`
	Orders      int     `json:"orders"`
	PerSecond   float64 `json:"per_second"`
	VsRaw       float64 `json:"vs_raw,omitempty"`
}

func runParking(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("parking", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 3*time.Second, "how long each measurement runs")
	conc := fs.String("concurrency", "1,16", "comma-separated numbers of concurrent callers")
	size := fs.Int("size", 512, "body size in bytes")
	rounds := fs.Int("rounds", 3, "rounds over every contender, alternating; each figure is the median of the rounds")
	client := fs.String("client", "lean", "HTTP client of the front door's callers: lean (kept-alive connections of the tool's own, read on the caller's goroutine) or net/http")
	server := fs.String("server", serverFast, "the front door's server: fast (its fast path, ingress/h1, before net/http's server, as sluice serve runs it by default) or net/http (net/http's alone: sluice serve --fast-path=false)")
	ceiling := fs.Bool("ceiling", false, "measure too raw publishes of a parked order's message, the front door's server (as --server) answering 202 without parking, and a bare handler answering 202 once Park has parked (see above): what the server costs for sluice's message, what HTTP alone costs, and HTTP with Park")
	cpuProfiles := fs.String("cpuprofile", "", "write a CPU profile of this process (callers and the embedded NATS server) during each measurement to `DIR`/CONTENDER-CALLERS-rROUND.pprof")
	out := addOutputFlags(fs, true)
	if code, done := parseModeFlags(fs, args, parkingHelp, stdout); done {
		return code
	}
	if fs.NArg() > 0 || *duration <= 0 || *size < 0 || *rounds < 1 {
		fmt.Fprintln(stderr, "sluice-bench parking: bad arguments (see -h)")
		return exitUsage
	}
	var concs []int
	for _, f := range strings.Split(*conc, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(stderr, "sluice-bench parking: --concurrency: %q is not a positive number\n", f)
			return exitUsage
		}
		concs = append(concs, n)
	}
	if *client != "lean" && *client != "net/http" {
		fmt.Fprintf(stderr, "sluice-bench parking: --client: %q is neither lean nor net/http\n", *client)
		return exitUsage
	}
	if *server != serverFast && *server != serverNetHTTP {
		fmt.Fprintf(stderr, "sluice-bench parking: --server: %q is neither %s nor %s\n", *server, serverFast, serverNetHTTP)
		return exitUsage
	}
	if *cpuProfiles != "" {
		if err := os.MkdirAll(*cpuProfiles, 0o755); err != nil {
			fmt.Fprintf(stderr, "sluice-bench parking: --cpuprofile: %v\n", err)
			return exitFailure
		}
	}
	results, err := parking(ctx, parkingConfig{duration: *duration, rounds: *rounds, concs: concs, size: *size,
		goClient: *client == "net/http", server: *server, profiles: *cpuProfiles, ceiling: *ceiling}, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench parking: %v\n", err)
		return exitFailure
	}
	if out.svg != "" {
		if err := writeSVGFile(out.svg, parkingChart(*duration, *size, results)); err != nil {
			fmt.Fprintf(stderr, "sluice-bench parking: --svg: %v\n", err)
			return exitFailure
		}
	}
	if out.json {
		if err := writeJSONDoc(stdout, struct {
			runInfo
			Duration    string          `json:"duration"`
			Concurrency []int           `json:"concurrency"`
			Size        int             `json:"size"`
			Rounds      int             `json:"rounds"`
			Results     []parkingResult `json:"results"`
		}{newRunInfo("parking"), duration.String(), concs, *size, *rounds, results}); err != nil {
			fmt.Fprintf(stderr, "sluice-bench parking: writing the results: %v\n", err)
			return exitFailure
		}
		return exitOK
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "CONTENDER\tCALLERS\tORDERS\tPER SECOND\tVS RAW\t\n")
	for _, r := range results {
		vs := ""
		if r.VsRaw > 0 {
			vs = fmt.Sprintf("%.0f%%", 100*r.VsRaw)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%.0f\t%s\t\n", r.Contender, r.Concurrency, r.Orders, r.PerSecond, vs)
	}
	if err := tw.Flush(); err != nil {
		return exitFailure
	}
	return exitOK
}

// parkingChart draws orders per second, a group per caller count, with the ratio
// over the raw JetStream publishes'.
func parkingChart(d time.Duration, size int, results []parkingResult) barChart {
	c := barChart{
		Title: "sluice-bench parking: orders parked per second",
		Subtitle: fmt.Sprintf("%s each; %d-byte bodies; embedded NATS, file storage; GOMAXPROCS %d; %s",
			d, size, runtime.GOMAXPROCS(0), runtime.Version()),
		Unit: "orders/s",
		Note: "ratio: orders per second over raw JetStream publishes' with the same callers (1.00x)",
	}
	for _, r := range results {
		ratio := r.VsRaw
		if r.Contender == parkingRaw {
			ratio = 1
		}
		c.Bars = append(c.Bars, bar{Group: plural(r.Concurrency, "caller"), Label: r.Contender, Value: r.PerSecond,
			Ratio: ratio, Sluice: r.Contender != parkingRaw})
	}
	return c
}

// parkingRules defer every order: the limit of one per hour is spent at once (the
// front door's queue is the one Park fills).
const parkingRules = `domain: bench
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    algorithm: token_bucket
    on_limit: defer
    queue: bench
routes:
  - name: orders
    descriptors:
      - [{key: route, value: orders}]
queues:
  bench:
    outflow: 100/s
    downstream: http://127.0.0.1:1
    max_idempotency_keys: 10000000
`

// parkingConfig is what runParking's flags ask of parking.
type parkingConfig struct {
	duration time.Duration
	rounds   int
	concs    []int
	size     int
	goClient bool   // the callers on net/http's client, not the lean one
	server   string // serverFast or serverNetHTTP
	profiles string // the directory of the CPU profiles; "": none
	ceiling  bool   // measure the front door's server answering 202 without parking too
}

func parking(ctx context.Context, cfg parkingConfig, stderr io.Writer) ([]parkingResult, error) {
	d, nRounds, concs, size, goClient, profiles := cfg.duration, cfg.rounds, cfg.concs, cfg.size, cfg.goClient, cfg.profiles
	nc, stop, err := tempNATS()
	if err != nil {
		return nil, err
	}
	defer stop()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "RAW", Subjects: []string{"raw.>"}, Retention: jetstream.WorkQueuePolicy,
		Storage: jetstream.FileStorage, Discard: jetstream.DiscardNew, MaxMsgs: -1, Duplicates: 2 * time.Minute,
	}); err != nil {
		return nil, err
	}
	// The store as sluice serve opens it, its metrics and tracing (off) included.
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(benchKey()), queue.WithRegisterer(prometheus.NewRegistry()),
		queue.WithTracerProvider(noop.NewTracerProvider()))
	if err != nil {
		return nil, err
	}
	if _, err := store.Declare(ctx, queueconfig.Config{Name: "bench", Outflow: limiter.PerSecond(100), Downstream: "http://127.0.0.1:1", MaxDepth: -1,
		// Every keyed order has a key of its own, all from one client scope.
		MaxIdempotencyKeys: queueconfig.MaxIdempotencyKeysLimit}); err != nil {
		return nil, err
	}
	body := []byte(strings.Repeat("x", size))
	header := http.Header{"Content-Type": {"application/json"}, "User-Agent": {"sluice-bench"}}
	var seq sync.Mutex
	n := 0
	nextID := func() int { seq.Lock(); defer seq.Unlock(); n++; return n }

	// The whole front door: HTTP in, the rule over its limit, Park, 202 out.
	set, err := rules.Parse(rules.File{Name: "bench.yaml", Data: []byte(parkingRules)})
	if err != nil {
		return nil, err
	}
	handler, closeFront, err := parkingFrontDoor(set, store)
	if err != nil {
		return nil, err
	}
	defer closeFront()
	frontURL, stopFront, err := serveFront(handler, cfg.server)
	if err != nil {
		return nil, err
	}
	defer stopFront()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	defer client.CloseIdleConnections()
	if resp, err := client.Post(frontURL+"/v1/orders", "application/json", nil); err == nil {
		resp.Body.Close() // spends the limit: every later order is deferred
	}
	lean, err := newLeanPoster(frontURL+"/v1/orders", header, body, 256)
	if err != nil {
		return nil, err
	}
	defer lean.close()
	send := lean.post
	if goClient {
		send = func(ctx context.Context, key string) (int, error) {
			req, err := http.NewRequestWithContext(ctx, "POST", frontURL+"/v1/orders", bytes.NewReader(body))
			if err != nil {
				return 0, err
			}
			req.Header = header.Clone()
			if key != "" {
				req.Header.Set("Idempotency-Key", key)
			}
			resp, err := client.Do(req)
			if err != nil {
				return 0, err
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			return resp.StatusCode, nil
		}
	}

	// post sends one order through the front door (with an Idempotency-Key unless
	// key is empty) and wants 202.
	post := func(ctx context.Context, key string) error {
		status, err := send(ctx, key)
		if err == nil && status != http.StatusAccepted {
			err = fmt.Errorf("the front door answered %d", status)
		}
		return err
	}
	contenders := []struct {
		name string
		op   func(ctx context.Context) error
	}{
		{parkingRaw, func(ctx context.Context) error {
			id := nextID()
			msg := nats.NewMsg("raw." + strconv.Itoa(id))
			msg.Data = body
			msg.Header.Set(jetstream.MsgIDHeader, strconv.Itoa(id))
			_, err := js.PublishMsg(ctx, msg)
			return err
		}},
		{"sluice park", func(ctx context.Context) error {
			_, err := store.Park(ctx, &queue.Request{Queue: "bench", Method: "POST", Path: "/orders", Body: body, Header: header, Client: "bench"})
			return err
		}},
		{"sluice ingress (HTTP 202)", func(ctx context.Context) error {
			return post(ctx, "")
		}},
		{"sluice park+idem", func(ctx context.Context) error {
			_, err := store.Park(ctx, &queue.Request{Queue: "bench", Method: "POST", Path: "/orders", Body: body, Header: header,
				Client: "bench", IdempotencyKey: fmt.Sprintf(`"k-%d"`, nextID())})
			return err
		}},
		{"sluice ingress+idem (HTTP 202)", func(ctx context.Context) error {
			return post(ctx, fmt.Sprintf(`"h-%d"`, nextID()))
		}},
	}
	if cfg.ceiling {
		shape, err := parkedShape(ctx, js, store, body, header)
		if err != nil {
			return nil, err
		}
		contenders = append(contenders, struct {
			name string
			op   func(ctx context.Context) error
		}{parkingShape, func(ctx context.Context) error {
			id := "c" + strconv.Itoa(nextID())
			msg := &nats.Msg{Subject: queue.ReadySubject("bench", "", id), Header: maps.Clone(shape.Header), Data: shape.Data}
			msg.Header.Set(jetstream.MsgIDHeader, id)
			_, err := js.PublishMsg(ctx, msg)
			return err
		}})
		bare := func(w http.ResponseWriter, r *http.Request) {
			b, err := io.ReadAll(r.Body)
			if err == nil {
				_, err = store.Park(r.Context(), &queue.Request{Queue: "bench", Method: "POST", Path: "/orders", Body: b, Header: header, Client: "bench"})
			}
			if err != nil {
				w.WriteHeader(http.StatusServiceUnavailable)
				return
			}
			answerAccepted(w, r)
		}
		for _, c := range []struct {
			name string
			h    http.HandlerFunc
		}{{parkingCeiling, answerAccepted}, {parkingBare, bare}} {
			u, stop, err := serveFront(c.h, cfg.server)
			if err != nil {
				return nil, err
			}
			defer stop()
			poster, err := newLeanPoster(u+"/v1/orders", header, body, 256)
			if err != nil {
				return nil, err
			}
			defer poster.close()
			contenders = append(contenders, struct {
				name string
				op   func(ctx context.Context) error
			}{c.name, func(ctx context.Context) error {
				status, err := poster.post(ctx, "")
				if err == nil && status != http.StatusAccepted {
					err = fmt.Errorf("%s: the server answered %d", c.name, status)
				}
				return err
			}})
		}
	}
	// The contenders take turns for rounds rounds; each figure is the median of the
	// rounds, each ratio the median of the rounds' ratios (a disk that stalls during
	// one measurement moves one round's figures, not the result).
	var results []parkingResult
	for _, c := range concs {
		type round struct{ rate, vsRaw float64 }
		rounds := make([][]round, len(contenders))
		orders := make([]int, len(contenders))
		for r := range nRounds {
			var raw float64
			for i, ct := range contenders {
				fmt.Fprintf(stderr, "parking: [round %d/%d] %s with %d callers for %s...\n", r+1, nRounds, ct.name, c, d)
				stop := func() {}
				if profiles != "" {
					name := fmt.Sprintf("%s-%d-r%d.pprof", profileName(ct.name), c, r+1)
					if stop, err = startCPUProfile(filepath.Join(profiles, name)); err != nil {
						return nil, fmt.Errorf("--cpuprofile: %w", err)
					}
				}
				count, err := parkingMeasure(ctx, d, c, ct.op)
				stop()
				if err != nil {
					return nil, fmt.Errorf("%s: %w", ct.name, err)
				}
				rate := float64(count) / d.Seconds()
				if ct.name == parkingRaw {
					raw = rate
				}
				orders[i] += count
				rounds[i] = append(rounds[i], round{rate, rate / raw})
			}
		}
		for i, ct := range contenders {
			res := parkingResult{Contender: ct.name, Concurrency: c, Orders: orders[i],
				PerSecond: median(rounds[i], func(r round) float64 { return r.rate })}
			if ct.name != parkingRaw {
				res.VsRaw = median(rounds[i], func(r round) float64 { return r.vsRaw })
			}
			results = append(results, res)
		}
	}
	return results, nil
}

// profileName is a contender's name as a file name: "sluice park+idem" is
// "sluice-park+idem", "sluice ingress (HTTP 202)" "sluice-ingress".
func profileName(contender string) string {
	name, _, _ := strings.Cut(contender, " (")
	return strings.ReplaceAll(name, " ", "-")
}

func parkingMeasure(ctx context.Context, d time.Duration, conc int, op func(context.Context) error) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	end := time.Now().Add(d)
	counts := make([]int, conc)
	errs := make([]error, conc)
	var wg sync.WaitGroup
	for i := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if err := op(ctx); err != nil {
					errs[i] = err
					cancel()
					return
				}
				counts[i]++
			}
		}()
	}
	wg.Wait()
	total := 0
	for _, c := range counts {
		total += c
	}
	return total, errors.Join(errs...)
}

// tempNATS starts an embedded JetStream server (syncing every write, as sluice's does)
// in a temporary directory and connects to it; stop undoes all of it.
func tempNATS() (nc *nats.Conn, stop func(), err error) {
	dir, err := os.MkdirTemp("", "sluice-bench-nats-")
	if err != nil {
		return nil, nil, err
	}
	emb, err := embedded.Start(embedded.Config{DataDir: dir})
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	if nc, err = emb.Connect(); err != nil {
		emb.Shutdown()
		os.RemoveAll(dir)
		return nil, nil, err
	}
	return nc, func() {
		nc.Close()
		emb.Shutdown()
		os.RemoveAll(dir)
	}, nil
}

// benchKey returns a fresh signing key: the queues of a measurement live only as long
// as it does.
func benchKey() []byte {
	k := make([]byte, queue.MinSigningKey)
	_, _ = rand.Read(k) // crypto/rand never fails
	return k
}

// parkedShape parks one order in the queue bench and returns its message as Park
// stored it, without the metadata the server adds to a read.
func parkedShape(ctx context.Context, js jetstream.JetStream, store *queue.Store, body []byte, header http.Header) (*nats.Msg, error) {
	if _, err := store.Park(ctx, &queue.Request{Queue: "bench", Method: "POST", Path: "/orders", Body: body, Header: header, Client: "bench"}); err != nil {
		return nil, err
	}
	st, err := js.Stream(ctx, queue.StreamName("bench"))
	if err != nil {
		return nil, err
	}
	m, err := st.GetLastMsgForSubject(ctx, queue.ReadySubject("bench", "", "*"))
	if err != nil {
		return nil, err
	}
	for _, k := range []string{jetstream.StreamHeader, jetstream.SequenceHeader, jetstream.SubjectHeader, jetstream.TimeStampHeaer} {
		m.Header.Del(k)
	}
	return &nats.Msg{Header: m.Header, Data: m.Data}, nil
}
