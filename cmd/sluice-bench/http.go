package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/h1"
	"github.com/sluicehq/sluice/limiter/redistest"
)

const httpHelp = `Usage: sluice-bench http [flags]

Measures, in one run on this machine, the upstream alone, a plain Go reverse proxy
(httputil.ReverseProxy), nginx with limit_req (when nginx is on PATH or in /usr/sbin),
sluice's proxy alone (ingress.Proxy on its connection pool, no rules, no limiter) and
'sluice serve' in front of the same upstream, with the memory limiter and with Redis.
The ceilings are measured beside them: a bare Go net/http server answering 204, the
most any Go front door on net/http could pass here, and the front door's own fast path
(ingress/h1, which sluice serve and sluice's proxy alone run in front of net/http)
answering 204, its ceiling; net/http making one round trip to
the upstream per request with the least work there is (a fixed request, the answer read
by its Content-Length, no headers relayed: no real proxy, the floor under any proxy on
net/http); and nginx answering 204 itself ("return 204").
Every server is a process of its own. The load:

  closed loop: --workers connections sending as fast as they can: the most requests
               per second each target passes. wrk sends them when it is on PATH and
               --duration is whole seconds (--closed-loop auto), else this process
               (vegeta as a library). The generator shares the machine's cores with
               the targets, and a Go one spends more CPU per request than wrk does,
               which caps every ratio between targets: prefer wrk.
  open loop:   --rate requests per second, on a schedule the answers do not change
               (no coordinated omission), from this process: a thread of its own
               sleeps to each slot with the platform's finest sleep (on Linux
               nanosleep with 1 ns timer slack, not Go's timers, which round waits
               below 1 ms up to 1 ms and would send bursts) and sends every slot due
               when it wakes, on an idle keep-alive connection, with one write. A
               latency runs from that write to the last byte of the answer, so the
               sleeper's own lateness is in no sample: latency quantiles at a load
               every target sustains. --rate 0 measures no latencies.

sluice checks every request against a per-client-IP token bucket that never runs out,
so each request pays for a real decision and is proxied; nginx runs the same shape
(limit_req per client address on every request, a keep-alive pool to the upstream)
from a configuration this tool writes in a temporary prefix, as the current user.
The targets take turns for --rounds rounds and each figure is the median; req/s is
also given as a ratio to httputil.ReverseProxy and to nginx. CPU/req is the CPU time
(user and system, from /proc: Linux only) the target's processes spent per request of
the closed loop: on a shared machine it tells the cost of each target more steadily
than req/s, which also measures how busy the machine was. --variant NAME=PATH adds
another sluice binary (or a script that sets its environment and execs one) as a
target of its own, "sluice serve (NAME)", so that two builds or settings are compared
in the same rounds rather than across runs. --syscalls adds the system calls and
context switches of each target's processes per request of the closed loop, counted
by perf stat (Linux, perf on PATH, tracepoints readable); counting slows the targets
a little, so compare those req/s with each other, not with a run without.
`

const benchRules = `domain: bench
descriptors:
  - key: client_ip
    rate_limit: {unit: second, requests_per_unit: 1000000000, name: per_ip}
    algorithm: token_bucket
routes:
  - name: everything
    descriptors:
      - [{key: client_ip, from: client_ip}]
`

// childEnv marks the processes the http mode starts from its own executable, so that a
// test binary standing in for sluice-bench knows to run the mode, not the tests.
const childEnv = "SLUICE_BENCH_CHILD"

func runHTTP(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("http", flag.ContinueOnError)
	fs.SetOutput(stderr)
	duration := fs.Duration("duration", 5*time.Second, "length of each measurement")
	workers := fs.Uint64("workers", 64, "concurrent connections of the closed-loop measurement")
	rate := fs.Int("rate", 2000, "requests per second of the open-loop measurement (0: no open loop, no latencies)")
	sluicePath := fs.String("sluice", "", "sluice binary to run (default: build ./cmd/sluice)")
	withRedis := fs.Bool("redis", true, "also measure sluice with a Redis limiter (starts a redis-server on a free port)")
	rounds := fs.Int("rounds", 3, "rounds over every target, alternating; each figure is the median of the rounds")
	var variants variantFlag
	fs.Var(&variants, "variant", "also measure `NAME=PATH`, another sluice binary (or a script that execs one) with the memory limiter, beside the others (repeatable): builds side by side in one run")
	countSyscalls := fs.Bool("syscalls", false, "count each target's system calls and context switches per request of the closed loop with perf stat")
	closedGen := fs.String("closed-loop", "auto", "closed-loop load generator: wrk, go (vegeta in this process) or auto (wrk when on PATH and --duration is whole seconds)")
	out := addOutputFlags(fs, true)
	if code, done := parseModeFlags(fs, args, httpHelp, stdout); done {
		return code
	}
	if *rounds < 1 {
		fmt.Fprintln(stderr, "sluice-bench http: --rounds must be at least 1")
		return exitUsage
	}
	if *rate < 0 {
		fmt.Fprintln(stderr, "sluice-bench http: --rate must not be negative")
		return exitUsage
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice-bench http: %v\n", err)
		return exitFailure
	}
	wrkPath, gen, err := closedLoopGenerator(*closedGen, *duration)
	if err != nil {
		fmt.Fprintf(stderr, "sluice-bench http: %v\n", err)
		return exitUsage
	}
	if gen == genGo && *closedGen == "auto" {
		fmt.Fprintf(stderr, "closed loop from this process (vegeta): %s\n", whyNotWrk(*duration))
	}
	closedLoop := func(u string) (closedLoopResult, error) {
		if gen == genWrk {
			return wrkClosedLoop(ctx, wrkPath, u, min(runtime.NumCPU(), int(*workers)), int(*workers), *duration)
		}
		return attack(u, *workers, *duration), nil
	}
	dir, err := os.MkdirTemp("", "sluice-bench-http-")
	if err != nil {
		return fail(err)
	}
	defer os.RemoveAll(dir)
	if *sluicePath == "" {
		fmt.Fprintln(stderr, "building sluice…")
		*sluicePath = filepath.Join(dir, "sluice")
		if err := buildSluice(ctx, *sluicePath); err != nil {
			return fail(err)
		}
	}
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(benchRules), 0o644); err != nil {
		return fail(err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail(err)
	}

	type proc struct {
		cmd  *exec.Cmd
		term bool // stop with SIGTERM, so that nginx's master ends its workers too
	}
	var procs []proc
	defer func() {
		for _, p := range procs {
			stopProcess(p.cmd, p.term)
		}
	}()
	spawnWith := func(term bool, health string, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stderr = io.Discard
		cmd.Env = append(os.Environ(), childEnv+"=1")
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, proc{cmd, term})
		return waitHealthy(ctx, health)
	}
	spawn := func(health string, name string, args ...string) error { return spawnWith(false, health, name, args...) }

	type target struct {
		name, url string
		pid       int // the server's process (nginx: its master, whose workers count too)
	}
	var targets []target
	lastPID := func() int { return procs[len(procs)-1].cmd.Process.Pid }
	// child starts one of this tool's own servers (a mode of its executable) on a
	// free address, as the target name.
	child := func(name string, args ...string) (addr string, err error) {
		addr = freeAddr()
		if err := spawn("http://"+addr+"/", self, append(args[:1:1], append([]string{addr}, args[1:]...)...)...); err != nil {
			return "", fmt.Errorf("%s: %w", name, err)
		}
		targets = append(targets, target{name, "http://" + addr + "/", lastPID()})
		return addr, nil
	}
	upstreamAddr, err := child(targetUpstream, "upstream")
	if err != nil {
		return fail(err)
	}
	upstreamURL := "http://" + upstreamAddr
	for _, c := range [][]string{
		{targetGo204, "no-content"},
		{targetFast204, "fast-no-content"},
		{targetReverseProxy, "plain-proxy", upstreamURL},
		{targetFloor, "floor-proxy", upstreamURL},
		{targetPool, "pool-proxy", upstreamURL},
	} {
		if _, err := child(c[0], c[1:]...); err != nil {
			return fail(err)
		}
	}
	if nginx, err := nginxPath(); err != nil {
		fmt.Fprintln(stderr, "nginx is not on PATH nor in /usr/sbin: no nginx rows (install nginx to compare with it)")
	} else {
		addr, addr204 := freeAddr(), freeAddr()
		prefix := filepath.Join(dir, "nginx")
		conf, err := writeNginxConf(prefix, addr, upstreamAddr, addr204)
		if err != nil {
			return fail(err)
		}
		if err := spawnWith(true, "http://"+addr+"/", nginx, "-p", prefix, "-c", conf, "-e", filepath.Join(prefix, "error.log")); err != nil {
			return fail(fmt.Errorf("nginx (its log: %s): %w", filepath.Join(prefix, "error.log"), err))
		}
		targets = append(targets, target{targetNginx204, "http://" + addr204 + "/", lastPID()},
			target{targetNginx, "http://" + addr + "/", lastPID()})
	}
	startSluiceBin := func(bin, name string, extra ...string) error {
		listen, admin := freeAddr(), freeAddr()
		args := append([]string{"serve", "--rules", rulesPath, "--upstream", "http://" + upstreamAddr,
			"--listen", listen, "--admin-listen", admin, "--log-level", "error",
			"--data-dir", filepath.Join(dir, "data-"+listen)}, extra...)
		if err := spawn("http://"+admin+"/healthz", bin, args...); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		targets = append(targets, target{name, "http://" + listen + "/", lastPID()})
		return nil
	}
	startSluice := func(name string, extra ...string) error { return startSluiceBin(*sluicePath, name, extra...) }
	if err := startSluice("sluice serve (memory)"); err != nil {
		return fail(err)
	}
	for _, v := range variants {
		if err := startSluiceBin(v.path, "sluice serve ("+v.name+")"); err != nil {
			return fail(err)
		}
	}
	if *withRedis {
		srv, err := redistest.New()
		if err != nil {
			return fail(fmt.Errorf("starting redis-server (or pass --redis=false): %w", err))
		}
		defer srv.Close()
		if err := startSluice("sluice serve (redis)", "--redis", "redis://"+srv.Addr()+"/0"); err != nil {
			return fail(err)
		}
	}

	// Rounds alternate the targets, so that a machine busy for a while slows every
	// target alike; each figure is the median of the rounds.
	type sample struct {
		maxRPS    float64
		cpuPerReq time.Duration // 0: unknown
		p50, p99  time.Duration
		p999      time.Duration
		errors    float64
		syscalls  float64 // per request; 0 without --syscalls
		switches  float64
	}
	samples := make([][]sample, len(targets))
	for round := range *rounds {
		for i, tg := range targets {
			fmt.Fprintf(stderr, "[round %d/%d] [%d/%d] %s: closed loop, %d workers, %v…\n", round+1, *rounds, i+1, len(targets), tg.name, *workers, *duration)
			var stopPerf func() (kernelCounts, error)
			if *countSyscalls {
				if stopPerf, err = startPerfStat(ctx, dir, tg.pid); err != nil {
					return fail(fmt.Errorf("--syscalls: %w", err))
				}
			}
			cpu0, cpuOK := cpuTime(tg.pid)
			closed, err := closedLoop(tg.url)
			if err != nil {
				return fail(fmt.Errorf("%s: %w", tg.name, err))
			}
			cpu1, _ := cpuTime(tg.pid)
			var kc kernelCounts
			if stopPerf != nil {
				if kc, err = stopPerf(); err != nil {
					return fail(fmt.Errorf("--syscalls: %s: %w", tg.name, err))
				}
			}
			var perReq time.Duration
			if cpuOK && closed.Requests > 0 {
				perReq = (cpu1 - cpu0) / time.Duration(closed.Requests)
			}
			var open openLoopResult
			if *rate > 0 {
				fmt.Fprintf(stderr, "[round %d/%d] [%d/%d] %s: open loop, %d/s, %v…\n", round+1, *rounds, i+1, len(targets), tg.name, *rate, *duration)
				if open, err = openLoop(ctx, tg.url, *rate, int(*workers), *duration); err != nil {
					return fail(fmt.Errorf("%s: %w", tg.name, err))
				}
			}
			if open.Late > 0 {
				fmt.Fprintf(stderr, "[round %d/%d] [%d/%d] %s: %d of %d requests found every connection busy and went out late\n",
					round+1, *rounds, i+1, len(targets), tg.name, open.Late, open.Sent)
			}
			errRatio := 0.0
			if closed.Requests > 0 {
				errRatio = float64(closed.Failed) / float64(closed.Requests)
			}
			if open.Sent > 0 {
				errRatio = max(errRatio, float64(open.Failed)/float64(open.Sent))
			}
			var sys, cs float64
			if closed.Requests > 0 {
				sys, cs = float64(kc.Syscalls)/float64(closed.Requests), float64(kc.Switches)/float64(closed.Requests)
			}
			samples[i] = append(samples[i], sample{closed.PerSecond, perReq, open.quantile(0.5), open.quantile(0.99), open.quantile(0.999), errRatio, sys, cs})
			fmt.Fprintf(stderr, "[round %d/%d] [%d/%d] %s: %.0f req/s, CPU/req %v, p50 %v\n", round+1, *rounds, i+1, len(targets), tg.name,
				closed.PerSecond, perReq.Round(100*time.Nanosecond), open.quantile(0.5).Round(time.Microsecond))
		}
	}
	rows := make([]httpResult, len(targets))
	byName := map[string]httpResult{}
	for i, tg := range targets {
		s := samples[i]
		r := httpResult{Target: tg.name,
			RequestsPerSec: median(s, func(s sample) float64 { return s.maxRPS }),
			cpuPerReq:      median(s, func(s sample) time.Duration { return s.cpuPerReq }),
			p50:            median(s, func(s sample) time.Duration { return s.p50 }),
			p99:            median(s, func(s sample) time.Duration { return s.p99 }),
			p999:           median(s, func(s sample) time.Duration { return s.p999 }),
			SyscallsPerReq: median(s, func(s sample) float64 { return s.syscalls }),
			SwitchesPerReq: median(s, func(s sample) float64 { return s.switches }),
		}
		for _, x := range s {
			r.ErrorRatio = max(r.ErrorRatio, x.errors)
		}
		rows[i], byName[tg.name] = r, r
	}
	// ratio is r's requests per second over target to's; 0 when to did not run.
	ratio := func(r httpResult, to string) float64 {
		ref, ok := byName[to]
		if !ok || ref.RequestsPerSec == 0 {
			return 0
		}
		return r.RequestsPerSec / ref.RequestsPerSec
	}
	for i := range rows {
		r := &rows[i]
		r.VsReverseProxy, r.VsNginx, r.VsPool = ratio(*r, targetReverseProxy), ratio(*r, targetNginx), ratio(*r, targetPool)
		r.CPUNsPerRequest = r.cpuPerReq.Nanoseconds()
		r.P50Ns, r.P99Ns, r.P999Ns = r.p50.Nanoseconds(), r.p99.Nanoseconds(), r.p999.Nanoseconds()
		if r.Target != targetUpstream {
			r.P50AddedNs = (r.p50 - byName[targetUpstream].p50).Nanoseconds()
		}
	}

	if out.svg != "" {
		c := barChart{
			Title: "sluice-bench http: requests per second through the front door",
			Subtitle: fmt.Sprintf("closed loop (%s), %d connections, %s per target and round; median of %s; GOMAXPROCS %d; %s",
				gen, *workers, *duration, plural(*rounds, "round"), runtime.GOMAXPROCS(0), runtime.Version()),
			Unit: "req/s",
			Note: "ratio: requests per second over httputil.ReverseProxy's (1.00x)",
		}
		for _, r := range rows {
			c.Bars = append(c.Bars, bar{Label: r.Target, Value: r.RequestsPerSec, Ratio: r.VsReverseProxy,
				Sluice: strings.HasPrefix(r.Target, "sluice ")})
		}
		if err := writeSVGFile(out.svg, c); err != nil {
			return fail(fmt.Errorf("--svg: %w", err))
		}
	}
	if out.json {
		if err := writeJSONDoc(stdout, struct {
			runInfo
			Duration string       `json:"duration"`
			Workers  uint64       `json:"workers"`
			Rate     int          `json:"rate"`
			Rounds   int          `json:"rounds"`
			Redis    bool         `json:"redis"`
			Closed   string       `json:"closed_loop_generator"`
			Results  []httpResult `json:"results"`
		}{newRunInfo("http"), duration.String(), *workers, *rate, *rounds, *withRedis, string(gen), rows}); err != nil {
			return fail(fmt.Errorf("writing the results: %w", err))
		}
		return exitOK
	}
	latencies := "no latencies (--rate 0)"
	if *rate > 0 {
		latencies = fmt.Sprintf("latency open loop at %d/s", *rate)
	}
	fmt.Fprintf(stdout, "HTTP through the front door: %d connections closed loop (%s); %s; %v each; median of %d rounds\n\n",
		*workers, gen, latencies, *duration, *rounds)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	kernel := ""
	if *countSyscalls {
		kernel = "syscalls/req\tswitches/req\t"
	}
	fmt.Fprintln(tw, "target\treq/s\tvs ReverseProxy\tvs nginx\tvs sluice's proxy\tCPU/req\t"+kernel+"p50\tp99\tp99.9\tp50 added vs upstream\terrors\t")
	times := func(ratio float64) string {
		if ratio == 0 {
			return "-"
		}
		return fmt.Sprintf("%.2fx", ratio)
	}
	for _, r := range rows {
		lat := func(d time.Duration) string {
			if *rate == 0 {
				return "-"
			}
			return d.Round(time.Microsecond).String()
		}
		added := "-"
		if r.Target != targetUpstream {
			added = lat(time.Duration(r.P50AddedNs))
		}
		cpu := "-"
		if r.cpuPerReq > 0 {
			cpu = r.cpuPerReq.Round(100 * time.Nanosecond).String()
		}
		if *countSyscalls {
			cpu += fmt.Sprintf("\t%.2f\t%.2f", r.SyscallsPerReq, r.SwitchesPerReq)
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f%%\t\n", r.Target, r.RequestsPerSec, times(r.VsReverseProxy), times(r.VsNginx),
			times(r.VsPool), cpu, lat(r.p50), lat(r.p99), lat(r.p999), added, 100*r.ErrorRatio)
	}
	if err := tw.Flush(); err != nil {
		return fail(err)
	}
	return exitOK
}

// variantFlag is the http mode's repeatable --variant NAME=PATH.
type variantFlag []struct{ name, path string }

func (f *variantFlag) String() string { return "" }

func (f *variantFlag) Set(s string) error {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return fmt.Errorf("%q is not NAME=PATH", s)
	}
	*f = append(*f, struct{ name, path string }{name, path})
	return nil
}

// httpResult is one target's figures, each the median of the rounds.
type httpResult struct {
	Target          string  `json:"target"`
	RequestsPerSec  float64 `json:"requests_per_second"` // closed loop
	VsReverseProxy  float64 `json:"vs_reverse_proxy,omitempty"`
	VsNginx         float64 `json:"vs_nginx,omitempty"`
	VsPool          float64 `json:"vs_pool,omitempty"`            // over sluice's proxy alone
	CPUNsPerRequest int64   `json:"cpu_ns_per_request,omitempty"` // 0: unknown
	P50Ns           int64   `json:"p50_ns"`                       // open loop
	P99Ns           int64   `json:"p99_ns"`
	P999Ns          int64   `json:"p999_ns"`
	P50AddedNs      int64   `json:"p50_added_vs_upstream_ns"`       // 0 for the upstream itself
	ErrorRatio      float64 `json:"error_ratio"`                    // the worst of the rounds, 0 to 1
	SyscallsPerReq  float64 `json:"syscalls_per_request,omitempty"` // --syscalls, closed loop
	SwitchesPerReq  float64 `json:"context_switches_per_request,omitempty"`

	cpuPerReq, p50, p99, p999 time.Duration
}

// cpuTime returns the CPU time, user and system, that process pid and its running
// children (nginx's workers) have used so far, read from /proc (Linux); ok is false
// where it cannot be read. CPU per request tells the cost of each target even when the
// machine is shared, where requests per second mostly tell how busy it was.
func cpuTime(pid int) (total time.Duration, ok bool) {
	const tick = 10 * time.Millisecond // USER_HZ is 100 on every Linux architecture Go supports
	read := func(pid string) (time.Duration, bool) {
		stat, err := os.ReadFile("/proc/" + pid + "/stat")
		if err != nil {
			return 0, false
		}
		// The fields after the command name, which is in parentheses and may hold
		// spaces: state is the first, utime the 12th, stime the 13th.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 13 {
			return 0, false
		}
		u, err1 := strconv.ParseInt(f[11], 10, 64)
		s, err2 := strconv.ParseInt(f[12], 10, 64)
		return time.Duration(u+s) * tick, err1 == nil && err2 == nil
	}
	p := strconv.Itoa(pid)
	if total, ok = read(p); !ok {
		return 0, false
	}
	children, _ := os.ReadFile("/proc/" + p + "/task/" + p + "/children")
	for _, c := range strings.Fields(string(children)) {
		if d, ok := read(c); ok {
			total += d
		}
	}
	return total, true
}

// stopProcess ends cmd: at once, or with SIGTERM (killed if still running after 10 s).
func stopProcess(cmd *exec.Cmd, term bool) {
	if !term || cmd.Process.Signal(syscall.SIGTERM) != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		return
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// The reference targets of the http mode's table.
const (
	targetUpstream     = "upstream alone"
	targetGo204        = "net/http answering 204"
	targetFast204      = "fast path answering 204"
	targetNginx204     = "nginx answering 204"
	targetReverseProxy = "httputil.ReverseProxy"
	targetNginx        = "nginx limit_req"
	targetPool         = "sluice's proxy alone"
	targetFloor        = "net/http, one round trip"
)

// median returns the median of f over s (the mean of the middle two for an even
// count); s is not empty.
func median[S any, T float64 | time.Duration](s []S, f func(S) T) T {
	v := make([]T, len(s))
	for i, x := range s {
		v[i] = f(x)
	}
	slices.Sort(v)
	if len(v)%2 == 1 {
		return v[len(v)/2]
	}
	return (v[len(v)/2-1] + v[len(v)/2]) / 2
}

// nginxConf is the nginx contender's configuration: what sluice does on every request
// (a per-client-IP limit that never runs out, forwarding headers, a keep-alive pool to
// the upstream), in a prefix of its own so that nginx runs without root and touches
// nothing outside it; and a second server that answers 204 itself, nginx's ceiling on
// this machine. Run with -p PREFIX -e PREFIX/error.log.
const nginxConf = `daemon off;
worker_processes auto;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log error;
events { worker_connections 4096; }
http {
    access_log off;
    client_body_temp_path %[1]s/tmp/body;
    proxy_temp_path %[1]s/tmp/proxy;
    fastcgi_temp_path %[1]s/tmp/fastcgi;
    uwsgi_temp_path %[1]s/tmp/uwsgi;
    scgi_temp_path %[1]s/tmp/scgi;
    limit_req_zone $binary_remote_addr zone=bench:10m rate=1000000r/s;
    upstream backend {
        server %[3]s;
        keepalive 512;
    }
    server {
        listen %[2]s;
        location / {
            limit_req zone=bench burst=1000000 nodelay;
            proxy_pass http://backend;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header X-Forwarded-Host $host;
            proxy_set_header X-Forwarded-Proto $scheme;
        }
    }
    server {
        listen %[4]s;
        location / { return 204; }
    }
}
`

// nginxPath finds nginx on PATH, or in /usr/sbin, where Debian installs it and which is
// not on a user's PATH.
func nginxPath() (string, error) {
	p, err := exec.LookPath("nginx")
	if err != nil {
		if p, err := exec.LookPath("/usr/sbin/nginx"); err == nil {
			return p, nil
		}
	}
	return p, err
}

// writeNginxConf writes the nginx contender's configuration under prefix and returns
// its path: the proxy on listen, the 204 answer on listen204.
func writeNginxConf(prefix, listen, upstream, listen204 string) (string, error) {
	if err := os.MkdirAll(filepath.Join(prefix, "tmp"), 0o755); err != nil {
		return "", err
	}
	conf := filepath.Join(prefix, "nginx.conf")
	return conf, os.WriteFile(conf, []byte(fmt.Sprintf(nginxConf, prefix, listen, upstream, listen204)), 0o644)
}

// closedLoopGen names a closed-loop load generator.
type closedLoopGen string

const (
	genWrk closedLoopGen = "wrk"
	genGo  closedLoopGen = "go"
)

// closedLoopGenerator resolves the --closed-loop flag: wrk (and its path), go, or
// auto, which is wrk when it is on PATH and d is whole seconds (wrk's unit), else go.
func closedLoopGenerator(flag string, d time.Duration) (wrkPath string, gen closedLoopGen, err error) {
	switch flag {
	case "go":
		return "", genGo, nil
	case "wrk", "auto":
		if whyNotWrk(d) == "" {
			path, _ := exec.LookPath("wrk")
			return path, genWrk, nil
		}
		if flag == "auto" {
			return "", genGo, nil
		}
		return "", "", fmt.Errorf("--closed-loop wrk: %s", whyNotWrk(d))
	}
	return "", "", fmt.Errorf("--closed-loop %q: want wrk, go or auto", flag)
}

// whyNotWrk tells why wrk cannot run a closed loop of d, or "" when it can.
func whyNotWrk(d time.Duration) string {
	if _, err := exec.LookPath("wrk"); err != nil {
		return "wrk is not on PATH (install wrk: it spends less of the shared CPU per request)"
	}
	if d < time.Second || d%time.Second != 0 {
		return fmt.Sprintf("wrk takes whole seconds, not --duration %v", d)
	}
	return ""
}

// attack is the Go closed loop: GET u as fast as `workers` connections go, for d.
func attack(u string, workers uint64, d time.Duration) closedLoopResult {
	a := vegeta.NewAttacker(vegeta.Workers(workers), vegeta.MaxWorkers(workers),
		vegeta.Connections(int(workers)), vegeta.KeepAlive(true), vegeta.Timeout(10*time.Second))
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: "GET", URL: u})
	var m vegeta.Metrics
	for res := range a.Attack(tr, vegeta.Rate{}, d, "bench") {
		m.Add(res)
	}
	m.Close()
	ok := int64(math.Round(m.Success * float64(m.Requests)))
	return closedLoopResult{Requests: int64(m.Requests), PerSecond: m.Throughput, Failed: int64(m.Requests) - ok}
}

// buildSluice builds the sluice binary to out, in the sluice module this tool is built
// against (the repository root, through go.mod's replace): sluice's own go.mod and
// go.sum pick its dependencies, not this module's.
func buildSluice(ctx context.Context, out string) error {
	const hint = "run from within the repository, or pass --sluice"
	dir, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/sluicehq/sluice").Output()
	if err != nil || strings.TrimSpace(string(dir)) == "" {
		return fmt.Errorf("finding the sluice module (%s): %w", hint, err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/sluice")
	cmd.Dir = strings.TrimSpace(string(dir))
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/sluice in %s (%s): %w\n%s", cmd.Dir, hint, err, msg)
	}
	return nil
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "127.0.0.1:0"
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHealthy(ctx context.Context, u string) error {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for {
		// Each try is bounded too: a process that accepts but never answers (stopped,
		// or wrapped in a tool that holds it) must not hold the run past SIGTERM.
		err := getOnce(ctx, u, time.Second)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s never answered: %w", u, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// getOnce GETs u, waiting at most timeout for the answer's header.
func getOnce(ctx context.Context, u string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// runUpstream is the benchmark's upstream, a process of its own: a small fixed answer.
// It serves until ctx ends (SIGINT or SIGTERM), then exits 0.
func runUpstream(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintln(stderr, "usage: sluice-bench upstream ADDR")
		return exitUsage
	}
	body := []byte(`{"ok":true}`)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		_, _ = w.Write(body)
	})
	return serveUntilDone(ctx, &http.Server{Addr: args[0], Handler: h, ReadHeaderTimeout: 10 * time.Second}, stderr)
}

// runNoContent is the ceiling of a Go server on this machine: net/http answering
// every request 204 with nothing else to do.
func runNoContent(ctx context.Context, args []string, _, stderr io.Writer) int {
	return noContent(ctx, "no-content", serveUntilDone, args, stderr)
}

// runFastNoContent is the front door's fast path (ingress/h1, as sluice serve runs
// it) answering 204 and nothing else: the ceiling of any front door on it.
func runFastNoContent(ctx context.Context, args []string, _, stderr io.Writer) int {
	return noContent(ctx, "fast-no-content", serveFastUntilDone, args, stderr)
}

func noContent(ctx context.Context, mode string, serve func(context.Context, *http.Server, io.Writer) int, args []string, stderr io.Writer) int {
	if len(args) != 1 {
		fmt.Fprintf(stderr, "usage: sluice-bench %s ADDR\n", mode)
		return exitUsage
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	return serve(ctx, &http.Server{Addr: args[0], Handler: h, ReadHeaderTimeout: 10 * time.Second}, stderr)
}

// serveUntilDone serves srv until ctx ends, then shuts it down (the requests under way
// get a few seconds) and returns exitOK; a server that cannot listen or fails returns
// exitFailure.
func serveUntilDone(ctx context.Context, srv *http.Server, stderr io.Writer) int {
	return serveOn(ctx, srv.ListenAndServe, srv.Shutdown, srv, stderr)
}

// serveFastUntilDone is serveUntilDone with the front door's fast path (ingress/h1)
// in front of srv, as sluice serve runs it.
func serveFastUntilDone(ctx context.Context, srv *http.Server, stderr io.Writer) int {
	ln, err := net.Listen("tcp", srv.Addr)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitFailure
	}
	defer ln.Close()
	fast := &h1.Server{Fallback: srv}
	return serveOn(ctx, func() error { return fast.Serve(ln) }, fast.Shutdown, srv, stderr)
}

// serveOn runs serve until ctx ends, then shutdown (srv.Close when it does not finish
// in time).
func serveOn(ctx context.Context, serve func() error, shutdown func(context.Context) error, srv *http.Server, stderr io.Writer) int {
	errc := make(chan error, 1)
	go func() { errc <- serve() }()
	select {
	case err := <-errc:
		fmt.Fprintln(stderr, err)
		return exitFailure
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := shutdown(shutdownCtx); err != nil {
		srv.Close()
	}
	<-errc // http.ErrServerClosed
	return exitOK
}

// runPlainProxy is the reference: httputil.ReverseProxy with a transport that keeps
// as many idle connections as the load needs, as sluice's proxy does.
func runPlainProxy(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: sluice-bench plain-proxy ADDR UPSTREAM_URL")
		return exitUsage
	}
	up, err := url.Parse(args[1])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns, transport.MaxIdleConnsPerHost = 1024, 512
	proxy := &httputil.ReverseProxy{
		Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(up); pr.SetXForwarded() },
		Transport: transport,
	}
	return serveUntilDone(ctx, &http.Server{Addr: args[0], Handler: proxy, ReadHeaderTimeout: 10 * time.Second}, stderr)
}

// runPoolProxy is sluice's proxy alone: ingress.Proxy (on its connection pool, with
// its metrics) behind the front door's server (its fast path, ingress/h1, before an
// http.Server with the front door's timeouts and header limit, as cmd/sluice's
// newHTTPServer), without the middleware: no rules, no limiter. The difference to
// 'sluice serve' is what deciding costs.
func runPoolProxy(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: sluice-bench pool-proxy ADDR UPSTREAM_URL")
		return exitUsage
	}
	up, err := url.Parse(args[1])
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	p, err := ingress.NewProxy(up, ingress.WithProxyRegisterer(prometheus.NewRegistry()),
		ingress.WithProxyLogger(slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelError}))))
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitUsage
	}
	defer p.CloseIdleConnections()
	srv := frontServer(p)
	srv.Addr = args[0]
	return serveFastUntilDone(ctx, srv, stderr)
}

// runFloorProxy is the least a Go front door on net/http's server can do for each
// proxied request, the floor under any design of sluice's proxy on this machine: the
// same fixed request written on a kept connection to the upstream in one write ("GET /",
// whatever the client asked), the answer read up to the end its Content-Length gives
// with no header parsed but that one, and its body written back with a fixed
// Content-Type. It is no proxy to run (every client gets the upstream's answer to GET
// /, framing is trusted, errors close the client's connection); it measures what
// net/http and one round trip to the upstream cost before any proxying is done.
func runFloorProxy(ctx context.Context, args []string, _, stderr io.Writer) int {
	if len(args) != 2 {
		fmt.Fprintln(stderr, "usage: sluice-bench floor-proxy ADDR UPSTREAM_URL")
		return exitUsage
	}
	up, err := url.Parse(args[1])
	if err != nil || up.Host == "" {
		fmt.Fprintf(stderr, "floor-proxy: upstream %q is not an http URL\n", args[1])
		return exitUsage
	}
	type upConn struct {
		net.Conn
		br   *bufio.Reader
		body []byte
	}
	var (
		mu   sync.Mutex
		idle []*upConn
	)
	request := []byte("GET / HTTP/1.1\r\nHost: " + up.Host + "\r\n\r\n")
	contentType := []string{"application/json"}
	roundTrip := func(c *upConn) (n int, err error) {
		if _, err := c.Write(request); err != nil {
			return 0, err
		}
		n = -1
		for {
			line, err := c.br.ReadSlice('\n')
			if err != nil {
				return 0, err
			}
			if len(line) <= 2 { // the blank line
				break
			}
			if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
				n, err = strconv.Atoi(string(bytes.TrimSpace(v)))
				if err != nil {
					return 0, err
				}
			}
		}
		if n < 0 || n > 1<<20 {
			return 0, fmt.Errorf("no usable Content-Length: %d", n)
		}
		if cap(c.body) < n {
			c.body = make([]byte, n)
		}
		_, err = io.ReadFull(c.br, c.body[:n])
		return n, err
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		var c *upConn
		if len(idle) > 0 {
			c, idle = idle[len(idle)-1], idle[:len(idle)-1]
		}
		mu.Unlock()
		if c == nil {
			nc, err := net.Dial("tcp", up.Host)
			if err != nil {
				panic(http.ErrAbortHandler)
			}
			c = &upConn{Conn: nc, br: bufio.NewReader(nc)}
		}
		n, err := roundTrip(c)
		if err != nil {
			c.Close()
			panic(http.ErrAbortHandler)
		}
		w.Header()["Content-Type"] = contentType
		_, _ = w.Write(c.body[:n])
		mu.Lock()
		idle = append(idle, c)
		mu.Unlock()
	})
	return serveUntilDone(ctx, &http.Server{Addr: args[0], Handler: h, ReadHeaderTimeout: 10 * time.Second}, stderr)
}
