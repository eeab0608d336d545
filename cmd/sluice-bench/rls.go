package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	envoyrunner "github.com/envoyproxy/ratelimit/src/service_cmd/runner"
	envoysettings "github.com/envoyproxy/ratelimit/src/settings"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/envoy"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/childproc"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/rules"
)

const rlsHelp = `Usage: sluice-bench rls [flags]

Measures envoy.service.ratelimit.v3 RateLimitService/ShouldRateLimit, the call that
Envoy's rate limit filter makes, in one run on this machine:

  sluice (memory)           sluice's service (package ingress/envoy) on the memory store
  sluice (redis)            the same on a Redis store
  envoyproxy/ratelimit      Envoy's own service (github.com/envoyproxy/ratelimit, built
                            into this tool from its Go module) on the same Redis; it has
                            no in-memory store, so the memory rows have no peer

Each service is a process of its own (this executable, started again in the
rls-server or envoy-ratelimit mode), both load the same Envoy-format rules file, and a
redis-server of their own on a free port is shared by the Redis contenders. The load
comes from this process: --callers concurrent callers, each on its own --keys
descriptor values (user=…) used round-robin, one descriptor per request, on up to
--conns connections shared round-robin. The limit (10^9 per hour) is never reached, so
every call is a full decision that reaches the store; any OVER_LIMIT answer is
reported as a warning, any error ends the run. For each caller count and header
setting the peer runs first.

--headers on|off|both (default both) says whether the services add response headers,
and both measures each service both ways (a process per setting), alternating: every
row says which in its HEADERS column, and a row's peer is the one with the same
setting. on: sluice's service as it is by default (RateLimit, RateLimit-Policy,
X-RateLimit-Limit and X-RateLimit-Remaining of the limit closest to running out) and
envoyproxy/ratelimit with LIMIT_RESPONSE_HEADERS_ENABLED=true (RateLimit-Limit,
RateLimit-Remaining and RateLimit-Reset, its names by default; off by default). off:
sluice's service with its headers turned off (sluice rls --rls-headers=false) and
envoyproxy/ratelimit as it is by default.

The callers share the machine with the services, so every microsecond of CPU they
spend per call is taken from the services: they do as little as a call needs, the
same for both services. Requests are encoded (go-control-plane's generated types)
before the clock starts, and answers are read only as far as their overall code.
--client lean (the default) sends them with a gRPC client of this tool made for this
one call: it writes each call's two HTTP/2 frames, prepared in advance (a header
block that after the first call is a few indices into the server's HPACK table, and
the message), in batches with the other callers' frames, and one goroutine per
connection reads the answers. --client grpc uses grpc-go instead (a codec passing
the encoded bytes through; fixed flow-control windows, as Envoy's, and no retries):
in a run with 64 callers, about twice the callers' CPU per call.

DECISIONS/S counts answered calls in the measured window (after a warm-up); P50 and
P99 are the latencies one caller sees; VS PEER is sluice's decisions per second
divided by envoyproxy/ratelimit's, P99 VS PEER sluice's p99 divided by its (below 1
is better). CPU/DEC is the CPU time (user and system, from /proc, to the clock
tick) the service process used per decision in the measured window and REDIS/DEC
redis-server's (from INFO cpu); CPU VS PEER is envoyproxy/ratelimit's CPU per
decision divided by sluice's, service and redis-server together (above 1 is
better). LOAD/DEC is this process's CPU time per decision (getrusage): the callers'
share of the machine. On a busy machine, decisions per second measure the scheduler
as much as the code; CPU per decision is the steadier figure.

Both Redis contenders wait --redis-timeout for Redis (envoyproxy/ratelimit's
REDIS_TIMEOUT; sluice's --redis-timeout, whose product default of 50ms would make a
loaded machine's slow answers decisions without Redis). Decisions sluice made
without Redis are reported as a warning.

envoyproxy/ratelimit runs with its defaults (REDIS_POOL_SIZE 10, no pipelining), stats
off and logging at warn, response headers as --headers says; --envoy-env passes more
of its settings. sluice runs as sluice rls does, with GOGC=400 (envoy.GCPercent)
unless GOGC is set.

Flags:
`

// rlsRules is the rules file both services load: Envoy's format, which sluice reads
// unchanged. The limit is never reached in a run.
const rlsRules = `domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`

const (
	rlsDomain = "bench"
	rlsLimit  = 1_000_000_000
)

type rlsConfig struct {
	duration, warmup time.Duration
	callers          []int
	keys, conns      int
	client           string // lean or grpc
	redisTimeout     time.Duration
	// redisCPU is redis-server's CPU time so far (nil without Redis).
	redisCPU func() (time.Duration, bool)
}

type rlsResult struct {
	Store   string `json:"store"`
	Service string `json:"service"`
	Sluice  bool   `json:"sluice"`
	// Headers says whether the service added response headers.
	Headers         bool    `json:"headers"`
	Callers         int     `json:"callers"`
	Decisions       int64   `json:"decisions"`
	OverLimit       int64   `json:"over_limit"`
	Seconds         float64 `json:"seconds"`
	DecisionsPerSec float64 `json:"decisions_per_second"`
	P50Ns           int64   `json:"p50_ns"`
	P99Ns           int64   `json:"p99_ns"`
	RatioVsPeer     float64 `json:"ratio_vs_peer,omitempty"`
	P99RatioVsPeer  float64 `json:"p99_ratio_vs_peer,omitempty"`
	// CPUNsPerDecision is the service process's CPU time per decision, and
	// RedisCPUNsPerDecision redis-server's; 0 where they cannot be read.
	CPUNsPerDecision      float64 `json:"cpu_ns_per_decision,omitempty"`
	RedisCPUNsPerDecision float64 `json:"redis_cpu_ns_per_decision,omitempty"`
	// ClientCPUNsPerDecision is this process's (the callers') CPU time per decision:
	// on a machine the callers share with the services, it bounds what a faster
	// service can gain in decisions per second.
	ClientCPUNsPerDecision float64 `json:"client_cpu_ns_per_decision,omitempty"`
	// CPURatioVsPeer is the peer's CPU time per decision (service and redis-server)
	// divided by sluice's: above 1, sluice needs less.
	CPURatioVsPeer float64 `json:"cpu_ratio_vs_peer,omitempty"`
}

// rlsTarget is one running service.
type rlsTarget struct {
	store, service, addr string
	sluice               bool
	headers              bool // it adds response headers
	pid                  int  // its process
}

// rlsHeaderSettings are the settings of response headers that --headers selects, in
// the order in which they are measured.
var rlsHeaderSettings = map[string][]bool{"on": {true}, "off": {false}, "both": {true, false}}

// onOff names a header setting as --headers and the table do.
func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

type envList []string

func (e *envList) String() string { return strings.Join(*e, " ") }

func (e *envList) Set(v string) error {
	k, _, ok := strings.Cut(v, "=")
	if !ok || k == "" || strings.ContainsAny(k, " \t") {
		return fmt.Errorf("%q is not KEY=VALUE", v)
	}
	*e = append(*e, v)
	return nil
}

func runRLS(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("rls", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg rlsConfig
	fs.DurationVar(&cfg.duration, "duration", 3*time.Second, "how long each measurement runs")
	fs.DurationVar(&cfg.warmup, "warmup", 0, "warm-up before each measurement (default a quarter of --duration, at most 1s)")
	callers := fs.String("callers", "1,16,64", "comma-separated counts of concurrent callers")
	fs.IntVar(&cfg.keys, "keys", 1000, "descriptor values per caller, used round-robin")
	fs.StringVar(&cfg.client, "client", "lean", "the callers' gRPC client: lean (encoded requests on HTTP/2 frames prepared in advance) or grpc (grpc-go, requests encoded in advance)")
	fs.IntVar(&cfg.conns, "conns", 4, "gRPC connections shared by the callers (at most one per caller)")
	withRedis := fs.Bool("redis", true, "also measure on Redis (starts a redis-server on a free port) against envoyproxy/ratelimit")
	var envoyEnv envList
	fs.Var(&envoyEnv, "envoy-env", "a setting of envoyproxy/ratelimit, `KEY=VALUE` (repeatable), e.g. REDIS_PIPELINE_WINDOW=150us")
	out := addOutputFlags(fs, true)
	headersFlag := fs.String("headers", "both", "response headers from both services: `on`, off, or both (each service measured both ways)")
	fs.DurationVar(&cfg.redisTimeout, "redis-timeout", time.Second, "how long each Redis contender waits for Redis")
	cpuProfiles := fs.String("cpuprofile", "", "write CPU profiles over the whole run of each sluice service process to `DIR`/sluice-STORE.pprof (sluice-STORE-headers-on.pprof and …-off with --headers both) and of the callers to DIR/callers.pprof")
	if code, done := parseModeFlags(fs, args, rlsHelp, stdout); done {
		return code
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["warmup"] {
		cfg.warmup = min(cfg.duration/4, time.Second)
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice-bench rls: "+format+"\n", a...)
		return exitUsage
	}
	switch {
	case fs.NArg() > 0:
		return usageErr("unexpected argument %q", fs.Arg(0))
	case cfg.duration <= 0 || cfg.warmup < 0:
		return usageErr("--duration must be positive and --warmup not negative")
	case cfg.keys < 1 || cfg.conns < 1:
		return usageErr("--keys and --conns must be positive")
	case cfg.redisTimeout <= 0:
		return usageErr("--redis-timeout must be positive")
	case cfg.client != "lean" && cfg.client != "grpc":
		return usageErr("--client must be lean or grpc")
	case rlsHeaderSettings[*headersFlag] == nil:
		return usageErr("--headers must be on, off or both")
	}
	headerSettings := rlsHeaderSettings[*headersFlag]
	for _, f := range strings.Split(*callers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 10_000 {
			return usageErr("--callers: %q is not a number from 1 to 10000", f)
		}
		cfg.callers = append(cfg.callers, n)
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice-bench rls: %v\n", err)
		return exitFailure
	}

	dir, err := os.MkdirTemp("", "sluice-bench-rls-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(rlsRules), 0o644); err != nil {
		return fail(err)
	}
	procs := &children{dir: dir}
	defer procs.stop()
	profileEnv := func(name string) []string {
		if *cpuProfiles == "" {
			return nil
		}
		return []string{cpuProfileEnv + "=" + filepath.Join(*cpuProfiles, name+".pprof")}
	}

	if *cpuProfiles != "" {
		stop, err := startCPUProfile(filepath.Join(*cpuProfiles, "callers.pprof"))
		if err != nil {
			return fail(fmt.Errorf("--cpuprofile: %w", err))
		}
		defer stop()
	}
	fmt.Fprintln(stderr, "sluice-bench rls: starting the services…")
	var targets []rlsTarget
	// procName names a service process (its log and profile): base, and its header
	// setting when both are measured.
	procName := func(base string, headers bool) string {
		if len(headerSettings) > 1 {
			return base + "-headers-" + onOff(headers)
		}
		return base
	}
	// startSluice starts sluice's service on store, with response headers or not;
	// storeArgs are rls-server's arguments after ADDR and RULES_FILE.
	startSluice := func(store string, headers bool, storeArgs ...string) error {
		name, addr := procName("sluice-"+store, headers), freeAddr()
		args := []string{"rls-server", "--headers=" + strconv.FormatBool(headers), "--redis-timeout=" + cfg.redisTimeout.String(), addr, rulesPath}
		pid, err := procs.start(ctx, name, profileEnv(name), addr, append(args, storeArgs...)...)
		if err != nil {
			return err
		}
		targets = append(targets, rlsTarget{store: store, service: "sluice", addr: addr, sluice: true, headers: headers, pid: pid})
		return nil
	}
	for _, h := range headerSettings {
		if err := startSluice("memory", h); err != nil {
			return fail(err)
		}
	}
	if *withRedis {
		srv, err := redistest.New()
		if err != nil {
			return fail(fmt.Errorf("starting redis-server (or pass --redis=false): %w", err))
		}
		defer srv.Close()
		rc := srv.Client()
		defer rc.Close()
		cfg.redisCPU = func() (time.Duration, bool) { return redisCPU(ctx, rc) }
		env := append([]string{
			"RUNTIME_ROOT=" + filepath.Join(dir, "envoy-runtime"), "RUNTIME_SUBDIRECTORY=ratelimit",
			"RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
			"USE_STATSD=false", "DISABLE_STATS=true", "LOG_LEVEL=warn",
			"BACKEND_TYPE=redis", "REDIS_SOCKET_TYPE=tcp", "REDIS_TYPE=SINGLE", "REDIS_URL=" + srv.Addr(),
			"REDIS_TIMEOUT=" + cfg.redisTimeout.String(),
		}, envoyEnv...)
		confDir := filepath.Join(dir, "envoy-runtime", "ratelimit", "config")
		if err := os.MkdirAll(confDir, 0o755); err != nil {
			return fail(err)
		}
		if err := os.WriteFile(filepath.Join(confDir, "bench.yaml"), []byte(rlsRules), 0o644); err != nil {
			return fail(err)
		}
		for _, h := range headerSettings {
			name, addr := procName("envoyproxy-ratelimit", h), freeAddr()
			host, port, _ := net.SplitHostPort(addr)
			// After --envoy-env: --headers decides.
			env := append(slices.Clip(env), "GRPC_HOST="+host, "GRPC_PORT="+port,
				"HOST=127.0.0.1", "PORT="+portOf(freeAddr()),
				"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+portOf(freeAddr()),
				"LIMIT_RESPONSE_HEADERS_ENABLED="+strconv.FormatBool(h))
			pid, err := procs.start(ctx, name, env, addr, "envoy-ratelimit")
			if err != nil {
				return fail(err)
			}
			targets = append(targets, rlsTarget{store: "redis", service: "envoyproxy/ratelimit", addr: addr, headers: h, pid: pid})
			if err := startSluice("redis", h, "redis://"+srv.Addr()+"/0"); err != nil {
				return fail(err)
			}
		}
	}

	results, err := measureRLS(ctx, cfg, targets, stderr)
	if err != nil {
		return fail(err)
	}
	procs.stop() // the services say how many decisions they made without Redis
	var fallbacks int64
	for _, h := range headerSettings {
		fallbacks += fallbacksIn(filepath.Join(dir, procName("sluice-redis", h)+".log"))
	}
	if n := fallbacks; n > 0 {
		fmt.Fprintf(stderr, "sluice-bench: warning: sluice (redis) decided %d calls without Redis (too slow: its failure mode decided in-process); the figures include them\n", n)
	}
	if out.svg != "" {
		if err := writeSVGFile(out.svg, rlsChart(cfg, *headersFlag, results)); err != nil {
			return fail(fmt.Errorf("--svg: %w", err))
		}
	}
	if out.json {
		err = writeJSONDoc(stdout, struct {
			runInfo
			EnvoyRatelimit string      `json:"envoyproxy_ratelimit"`
			Duration       string      `json:"duration"`
			Warmup         string      `json:"warmup"`
			Callers        []int       `json:"callers"`
			Keys           int         `json:"keys"`
			Conns          int         `json:"conns"`
			Redis          bool        `json:"redis"`
			Headers        string      `json:"headers"`
			RedisTimeout   string      `json:"redis_timeout"`
			Fallbacks      int64       `json:"fallbacks"`
			Results        []rlsResult `json:"results"`
		}{newRunInfo("rls"), moduleVersion("github.com/envoyproxy/ratelimit"),
			cfg.duration.String(), cfg.warmup.String(), cfg.callers, cfg.keys, cfg.conns, *withRedis, *headersFlag,
			cfg.redisTimeout.String(), fallbacks, results})
	} else {
		err = writeRLSTable(stdout, results)
	}
	if err != nil {
		return fail(fmt.Errorf("writing the results: %w", err))
	}
	return exitOK
}

// rlsChart draws decisions per second, a group per store and caller count, with
// sluice's ratio over envoyproxy/ratelimit's and the peer's own 1; the memory store
// has no peer, so its bars have no ratio.
func rlsChart(cfg rlsConfig, headers string, results []rlsResult) barChart {
	c := barChart{
		Title: "sluice-bench rls: ShouldRateLimit decisions per second",
		Subtitle: fmt.Sprintf("%s each after a %s warm-up; %d keys per caller; %d gRPC connections; response headers %s; envoyproxy/ratelimit %s; GOMAXPROCS %d",
			cfg.duration, cfg.warmup, cfg.keys, cfg.conns, headers, moduleVersion("github.com/envoyproxy/ratelimit"), runtime.GOMAXPROCS(0)),
		Unit: "decisions/s",
		Note: "ratio: decisions per second over envoyproxy/ratelimit's on the same Redis (1.00x); the memory store has no peer",
	}
	for _, r := range results {
		ratio := r.RatioVsPeer
		if !r.Sluice {
			ratio = 1
		}
		c.Bars = append(c.Bars, bar{Group: r.Store + ", " + plural(r.Callers, "caller") + ", headers " + onOff(r.Headers), Label: r.Service + " (" + r.Store + ")",
			Value: r.DecisionsPerSec, Ratio: ratio, Sluice: r.Sluice})
	}
	return c
}

// measureRLS measures every target with every caller count: per store, caller count
// and header setting (in the order of targets) the peer first, then sluice.
func measureRLS(ctx context.Context, cfg rlsConfig, targets []rlsTarget, stderr io.Writer) ([]rlsResult, error) {
	var stores []string
	var settings []bool
	for _, t := range targets {
		if !slices.Contains(stores, t.store) {
			stores = append(stores, t.store)
		}
		if !slices.Contains(settings, t.headers) {
			settings = append(settings, t.headers)
		}
	}
	p := newProgress(stderr, len(targets)*len(cfg.callers))
	defer p.done()
	var results []rlsResult
	run := 0
	measure := func(t rlsTarget, callers int) (rlsResult, error) {
		what := fmt.Sprintf("%s, %s, headers %s: %s", t.store, plural(callers, "caller"), onOff(t.headers), t.service)
		p.step(what)
		run++
		r, err := measureRLSTarget(ctx, cfg, t, callers, run)
		if err != nil {
			return r, fmt.Errorf("%s: %w", what, err)
		}
		return r, nil
	}
	for _, store := range stores {
		for _, callers := range cfg.callers {
			for _, headers := range settings {
				if err := measureRLSGroup(targets, store, headers, callers, measure, &results); err != nil {
					return nil, err
				}
			}
		}
	}
	for _, r := range results {
		if r.OverLimit > 0 {
			fmt.Fprintf(stderr, "sluice-bench: warning: %s (%s, headers %s) answered OVER_LIMIT to %d of %d calls; the figures include them\n", r.Service, r.Store, onOff(r.Headers), r.OverLimit, r.Decisions)
		}
	}
	return results, nil
}

// measureRLSGroup measures the targets of store with one header setting under
// callers callers, the peer first, and appends sluice's results, with their ratios
// to the peer's, then the peer's.
func measureRLSGroup(targets []rlsTarget, store string, headers bool, callers int, measure func(rlsTarget, int) (rlsResult, error), results *[]rlsResult) error {
	var peer *rlsResult
	for _, t := range targets {
		if t.store != store || t.headers != headers || t.sluice {
			continue
		}
		r, err := measure(t, callers)
		if err != nil {
			return err
		}
		peer = &r
	}
	for _, t := range targets {
		if t.store != store || t.headers != headers || !t.sluice {
			continue
		}
		r, err := measure(t, callers)
		if err != nil {
			return err
		}
		if peer != nil && peer.DecisionsPerSec > 0 && peer.P99Ns > 0 {
			r.RatioVsPeer = r.DecisionsPerSec / peer.DecisionsPerSec
			r.P99RatioVsPeer = float64(r.P99Ns) / float64(peer.P99Ns)
			if own := r.CPUNsPerDecision + r.RedisCPUNsPerDecision; r.CPUNsPerDecision > 0 && peer.CPUNsPerDecision > 0 && own > 0 {
				r.CPURatioVsPeer = (peer.CPUNsPerDecision + peer.RedisCPUNsPerDecision) / own
			}
		}
		*results = append(*results, r)
	}
	if peer != nil {
		*results = append(*results, *peer)
	}
	return nil
}

// measureRLSTarget runs callers concurrent callers against t for cfg.warmup, then
// records every call for cfg.duration. run makes the descriptor values of this
// measurement its own, so that no measurement finds another's counters.
func measureRLSTarget(ctx context.Context, cfg rlsConfig, t rlsTarget, callers, run int) (rlsResult, error) {
	newCaller, closeConns, err := rlsCallers(cfg.client, t.addr, min(callers, cfg.conns))
	if err != nil {
		return rlsResult{}, err
	}
	defer closeConns()
	runtime.GC() // the previous measurement's garbage is not this one's cost

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	const (
		warming = iota
		recording
		stopped
	)
	var phase atomic.Int32
	var answered atomic.Bool // a call has been recorded (read, not written, by each call after that)
	samples := make([][]time.Duration, callers)
	over := make([]int64, callers)
	var errOnce sync.Once
	var firstErr error
	var wg sync.WaitGroup
	for id := range callers {
		// The requests are encoded before the clock starts; each call sends one's
		// bytes as they are.
		reqs := make([]*rlsv3.RateLimitRequest, cfg.keys)
		for k := range reqs {
			reqs[k] = rlsRequest(fmt.Sprintf("r%d-c%d-k%d", run, id, k))
		}
		call, err := newCaller(id, reqs)
		if err != nil {
			return rlsResult{}, err
		}
		wg.Go(func() {
			lat := make([]time.Duration, 0, 1<<14)
			for i := 0; ; i++ {
				ph := phase.Load()
				if ph == stopped {
					break
				}
				start := time.Now()
				resp, err := call(ctx, i%len(reqs))
				elapsed := time.Since(start)
				code, known := overallCode(resp)
				if err == nil && !known {
					err = fmt.Errorf("an answer that is not a RateLimitResponse: %x", resp)
				}
				if err != nil {
					if phase.Load() != stopped { // after the end: calls cancelled
						errOnce.Do(func() { firstErr = err })
						phase.Store(stopped)
					}
					break
				}
				if ph == recording && phase.Load() == recording {
					lat = append(lat, elapsed)
					if !answered.Load() {
						answered.Store(true)
					}
					if code != rlsv3.RateLimitResponse_OK {
						over[id]++
					}
				}
			}
			samples[id] = lat
		})
	}
	sleep := func(d time.Duration) bool {
		tm := time.NewTimer(d)
		defer tm.Stop()
		select {
		case <-tm.C:
			return phase.Load() != stopped
		case <-ctx.Done():
			return false
		}
	}
	// The CPU times of the service and of redis-server over the measured window.
	cpu := func() (own, redis time.Duration, known, redisKnown bool) {
		own, known = childCPU(t.pid)
		if cfg.redisCPU != nil && t.store == "redis" {
			redis, redisKnown = cfg.redisCPU()
		}
		return own, redis, known, redisKnown
	}
	ok := sleep(cfg.warmup)
	phase.CompareAndSwap(warming, recording)
	t0 := time.Now()
	own0, redis0, ownKnown, redisKnown := cpu()
	client0, clientKnown := processCPU()
	ok = ok && sleep(cfg.duration)
	// A window that ends before a loaded machine answered any call in it (a short
	// --duration) lasts until one has been.
	for ok && !answered.Load() {
		ok = sleep(time.Millisecond)
	}
	phase.Store(stopped)
	elapsed := time.Since(t0)
	own1, redis1, ownKnown1, redisKnown1 := cpu()
	client1, _ := processCPU()
	// The calls under way finish rather than being cancelled: a cancelled call is
	// a decision the service makes without Redis, which would count as a fallback.
	// A service that does not answer within the Redis timeout and then some is cut
	// off.
	cut := time.AfterFunc(cfg.redisTimeout+5*time.Second, cancel)
	wg.Wait()
	cut.Stop()
	cancel()
	switch {
	case firstErr != nil:
		return rlsResult{}, firstErr
	case !ok:
		return rlsResult{}, context.Cause(ctx)
	}

	var all []time.Duration
	r := rlsResult{Store: t.store, Service: t.service, Sluice: t.sluice, Headers: t.headers, Callers: callers, Seconds: elapsed.Seconds()}
	for id := range samples {
		all = append(all, samples[id]...)
		r.OverLimit += over[id]
	}
	r.Decisions = int64(len(all))
	if len(all) == 0 {
		return r, errors.New("no call answered in the measured window")
	}
	slices.Sort(all)
	r.DecisionsPerSec = float64(r.Decisions) / elapsed.Seconds()
	r.P50Ns, r.P99Ns = int64(quantile(all, 0.50)), int64(quantile(all, 0.99))
	if ownKnown && ownKnown1 {
		r.CPUNsPerDecision = float64((own1 - own0).Nanoseconds()) / float64(r.Decisions)
	}
	if clientKnown {
		r.ClientCPUNsPerDecision = float64((client1 - client0).Nanoseconds()) / float64(r.Decisions)
	}
	if redisKnown && redisKnown1 {
		r.RedisCPUNsPerDecision = float64((redis1 - redis0).Nanoseconds()) / float64(r.Decisions)
	}
	return r, nil
}

// quantile returns the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// rlsMethod is the full name of ShouldRateLimit, as its generated client calls it.
const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// rlsCall makes a call with request k of its caller and returns the encoded
// response, valid until the next call.
type rlsCall func(ctx context.Context, k int) ([]byte, error)

// rlsCallers opens conns connections of client kind (lean or grpc) to addr; the
// callers it returns, given an id and their requests, share them round-robin.
func rlsCallers(client, addr string, conns int) (newCaller func(id int, reqs []*rlsv3.RateLimitRequest) (rlsCall, error), closeAll func(), err error) {
	var closers []func()
	closeAll = func() {
		for _, c := range closers {
			c()
		}
	}
	switch client {
	case "lean":
		cs := make([]*leanConn, conns)
		for i := range cs {
			if cs[i], err = dialLean(addr, rlsMethod); err != nil {
				closeAll()
				return nil, nil, err
			}
			closers = append(closers, cs[i].Close)
		}
		return func(id int, reqs []*rlsv3.RateLimitRequest) (rlsCall, error) {
			msgs := make([][]byte, len(reqs))
			for k, r := range reqs {
				b, err := proto.Marshal(r)
				if err != nil {
					return nil, err
				}
				// gRPC's length-prefixed message: not compressed, the length, the bytes.
				msgs[k] = append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
			}
			conn, call := cs[id%len(cs)], newLeanCall()
			return func(ctx context.Context, k int) ([]byte, error) { return conn.Call(ctx, call, msgs[k]) }, nil
		}, closeAll, nil
	case "grpc":
		cs := make([]*grpc.ClientConn, conns)
		for i := range cs {
			if cs[i], err = grpc.NewClient(addr, rlsDialOptions()...); err != nil {
				closeAll()
				return nil, nil, err
			}
			closers = append(closers, func() { cs[i].Close() })
		}
		return func(id int, reqs []*rlsv3.RateLimitRequest) (rlsCall, error) {
			msgs := make([]rawMessage, len(reqs))
			for k, r := range reqs {
				b, err := proto.Marshal(r)
				if err != nil {
					return nil, err
				}
				msgs[k] = rawMessage{data: mem.BufferSlice{mem.SliceBuffer(b)}}
			}
			conn := cs[id%len(cs)]
			var resp rawMessage
			return func(ctx context.Context, k int) ([]byte, error) {
				err := conn.Invoke(ctx, rlsMethod, &msgs[k], &resp, rawCall)
				return resp.buf, err
			}, nil
		}, closeAll, nil
	}
	return nil, nil, fmt.Errorf("--client %q: lean or grpc", client)
}

// rlsDialOptions are the options of the callers' connections, the same for every
// service: fixed flow-control windows (as Envoy's own, which sends no pings to
// estimate the bandwidth; grpc-go's default pings the server while a connection
// reads, which costs both sides on every burst) and no retries (a retrying call
// keeps its messages to replay them, which allocates on every call).
func rlsDialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStaticStreamWindowSize(1 << 20),
		grpc.WithStaticConnWindowSize(1 << 24),
		grpc.WithDisableRetry(),
	}
}

// rawCall makes a call send and receive rawMessages: what is measured is the service,
// not the callers' encoding of requests and decoding of responses.
var rawCall = grpc.ForceCodecV2(rawCodec{})

// rawMessage is a message as it travels: data, to send, is a request encoded once
// before the measurement; buf receives a response, reused from call to call.
type rawMessage struct {
	data mem.BufferSlice
	buf  []byte
}

// rawCodec sends a rawMessage's bytes as they are and copies a response's bytes
// into one (gRPC frees its buffers after Unmarshal). Its name is proto's, so that
// the calls carry the content type application/grpc+proto.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rawMessage)
	if !ok {
		return nil, fmt.Errorf("rawCodec: cannot marshal %T", v)
	}
	return m.data, nil // a mem.SliceBuffer: gRPC's Free leaves it alone
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rawMessage)
	if !ok {
		return fmt.Errorf("rawCodec: cannot unmarshal into %T", v)
	}
	m.buf = m.buf[:0]
	for _, b := range data {
		m.buf = append(m.buf, b.ReadOnlyData()...)
	}
	return nil
}

func (rawCodec) Name() string { return "proto" }

// overallCode reads field 1 of an encoded RateLimitResponse, overall_code, and
// skips the rest (statuses, headers): known is false when b is not a
// RateLimitResponse's encoding. Without the field, the code is proto3's default,
// UNKNOWN.
func overallCode(b []byte) (code rlsv3.RateLimitResponse_Code, known bool) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, false
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, false
			}
			code, b = rlsv3.RateLimitResponse_Code(v), b[n:]
			continue // the last occurrence wins, as in protobuf
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, false
		}
		b = b[n:]
	}
	return code, true
}

func rlsRequest(user string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: rlsDomain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: user}}},
	}}
}

func writeRLSTable(w io.Writer, results []rlsResult) error {
	rows := [][]string{{"STORE", "CALLERS", "SERVICE", "HEADERS", "DECISIONS/S", "P50", "P99", "VS PEER", "P99 VS PEER", "CPU/DEC", "REDIS/DEC", "LOAD/DEC", "CPU VS PEER"}}
	for _, r := range results {
		ratio, p99, cpuRatio, cpu, redisCPU, load := "", "", "", "", "", ""
		if r.RatioVsPeer > 0 {
			ratio, p99 = fmt.Sprintf("%.2fx", r.RatioVsPeer), fmt.Sprintf("%.2fx", r.P99RatioVsPeer)
		}
		if r.CPURatioVsPeer > 0 {
			cpuRatio = fmt.Sprintf("%.2fx", r.CPURatioVsPeer)
		}
		if r.CPUNsPerDecision > 0 {
			cpu = latency(r.CPUNsPerDecision)
		}
		if r.RedisCPUNsPerDecision > 0 {
			redisCPU = latency(r.RedisCPUNsPerDecision)
		}
		if r.ClientCPUNsPerDecision > 0 {
			load = latency(r.ClientCPUNsPerDecision)
		}
		rows = append(rows, []string{r.Store, strconv.Itoa(r.Callers), r.Service, onOff(r.Headers), count(int(r.DecisionsPerSec)),
			latency(float64(r.P50Ns)), latency(float64(r.P99Ns)), ratio, p99, cpu, redisCPU, load, cpuRatio})
	}
	return writeColumns(w, rows, []bool{true, false, true, true, false, false, false, false, false, false, false, false, false})
}

// moduleVersion is the version of module path built into this executable.
func moduleVersion(path string) string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == path {
				if m.Replace != nil {
					return m.Replace.Version
				}
				return m.Version
			}
		}
	}
	return "unknown"
}

func portOf(addr string) string {
	_, port, _ := net.SplitHostPort(addr)
	return port
}

// children are the service processes of the rls mode: this executable in one of
// its server modes, killed with the run (and by the kernel if the run dies first).
type children struct {
	dir   string
	procs []*exec.Cmd
}

// start runs this executable with args and env, its output in a log file, and waits
// until a ShouldRateLimit call to addr is answered with the benchmark's limit: the
// service is up and has loaded the rules. It returns the process id.
func (c *children) start(ctx context.Context, name string, env []string, addr string, args ...string) (int, error) {
	self, err := os.Executable()
	if err != nil {
		return 0, err
	}
	logPath := filepath.Join(c.dir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return 0, err
	}
	defer logFile.Close()
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(append(os.Environ(), childEnv+"=1"), env...)
	cmd.SysProcAttr = childproc.Attr()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c.procs = append(c.procs, cmd)

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(30 * time.Second)
	for {
		callCtx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := client.ShouldRateLimit(callCtx, rlsRequest("probe"))
		cancel()
		if err == nil {
			if len(resp.Statuses) == 1 && resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() == rlsLimit {
				return cmd.Process.Pid, nil
			}
			err = fmt.Errorf("answered %v without the benchmark's limit: the rules are not loaded", resp)
		}
		select {
		case <-exited:
			return 0, fmt.Errorf("%s exited: %s", name, tail(logPath))
		default:
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return 0, fmt.Errorf("%s on %s never answered: %w\n%s", name, addr, err, tail(logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop asks every child to end (SIGTERM: a sluice service then writes its CPU
// profile), and kills those still running after a few seconds.
func (c *children) stop() {
	for _, p := range c.procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range c.procs {
		for time.Now().Before(deadline) {
			if p.Process.Signal(syscall.Signal(0)) != nil {
				break // gone
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = p.Process.Kill()
	}
}

// cpuProfileEnv names the file where an rls-server child writes its CPU profile.
const cpuProfileEnv = "SLUICE_BENCH_CPUPROFILE"

// startCPUProfile profiles this process into the file at path until stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// tail is the end of a child's log, for an error message.
func tail(path string) string {
	b, _ := os.ReadFile(path)
	b = bytes.TrimSpace(b)
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// runRLSServer is sluice's side of the rls mode, a process of its own: the rate
// limit service of package ingress/envoy on the memory store, or on Redis when a URL
// is given, as `sluice rls` builds it.
func runRLSServer(ctx context.Context, args []string, _, stderr io.Writer) int {
	fs := flag.NewFlagSet("rls-server", flag.ContinueOnError)
	fs.SetOutput(stderr)
	headers := fs.Bool("headers", true, "fill response_headers_to_add")
	redisTimeout := fs.Duration("redis-timeout", 50*time.Millisecond, "how long a decision waits for Redis (sluice's --redis-timeout)")
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	args = fs.Args()
	if len(args) != 2 && len(args) != 3 {
		fmt.Fprintln(stderr, "usage: sluice-bench rls-server [--headers=false] [--redis-timeout=D] ADDR RULES_FILE [REDIS_URL]")
		return exitUsage
	}
	data, err := os.ReadFile(args[1])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	set, err := rules.Parse(rules.File{Name: args[1], Data: data})
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	var store limiter.Limiter = limiter.NewMemory()
	if len(args) == 3 {
		opts, err := redis.ParseURL(args[2])
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitUsage
		}
		opts.ContextTimeoutEnabled = true // as sluice's --redis client
		client := redis.NewClient(opts)
		defer client.Close()
		r, err := redisstore.New(client, redisstore.WithLogger(log), redisstore.WithTimeout(*redisTimeout))
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitFailure
		}
		defer r.Close()
		defer func() { fmt.Fprintf(stderr, "%s %d\n", fallbacksLine, r.Fallbacks()) }()
		store = r
	}
	ln, err := net.Listen("tcp", args[0])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	if path := os.Getenv(cpuProfileEnv); path != "" {
		stop, err := startCPUProfile(path)
		if err != nil {
			fmt.Fprintln(stderr, err)
			return exitFailure
		}
		defer stop()
	}
	if _, given := os.LookupEnv("GOGC"); !given {
		debug.SetGCPercent(envoy.GCPercent) // as sluice rls
	}
	rls, err := envoy.NewRateLimitService(ingress.StaticRules{S: set}, store, envoy.WithLogger(log), envoy.WithResponseHeaders(*headers))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	srv := envoy.NewServer(rls, nil)
	go func() {
		<-ctx.Done()
		srv.Stop()
	}()
	if err := srv.Serve(ln); err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	return exitOK
}

// fallbacksLine starts the line where an rls-server on Redis reports, as it ends, how
// many decisions it made without Redis.
const fallbacksLine = "sluice-bench: decisions without redis:"

// fallbacksIn reads that count from an rls-server's log (0 when absent).
func fallbacksIn(logPath string) int64 {
	b, _ := os.ReadFile(logPath)
	var n int64
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, fallbacksLine+" "); ok {
			n, _ = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		}
	}
	return n
}

// runEnvoyRatelimit is the peer of the rls mode, a process of its own:
// envoyproxy/ratelimit's service as its own main runs it, configured by its
// environment variables.
func runEnvoyRatelimit(_ context.Context, args []string, _, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintln(stderr, "usage: sluice-bench envoy-ratelimit (configured by envoyproxy/ratelimit's environment variables)")
		return exitUsage
	}
	r := envoyrunner.NewRunner(envoysettings.NewSettings())
	r.Run() // returns when the server stops; its errors exit the process
	return exitOK
}

// redisCPU is the CPU time (user and system) redis-server has used so far, from
// INFO cpu (to the microsecond).
func redisCPU(ctx context.Context, c *redis.Client) (time.Duration, bool) {
	info, err := c.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, false
	}
	var total float64
	found := 0
	for _, l := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		s, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, false
		}
		total += s
		found++
	}
	return time.Duration(total * float64(time.Second)), found == 2
}
