package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"

	"github.com/sluicehq/sluice/limiter/redistest"
)

const httpHelp = `Usage: sluice-bench http [flags]

Measures, in one run on this machine, the upstream alone, a plain Go reverse proxy
(httputil.ReverseProxy) and 'sluice serve' in front of the same upstream, with the
memory limiter and with Redis. Every server is a process of its own; the load comes
from this process (vegeta as a library):

  closed loop: --workers connections sending as fast as they can, as wrk -c does:
               the most requests per second each target passes;
  open loop:   --rate requests per second at fixed intervals, whatever the responses:
               latency quantiles at a load every target sustains.

sluice checks every request against a per-client-IP token bucket that never runs out,
so each request pays for a real decision and is proxied.
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
	rate := fs.Int("rate", 2000, "requests per second of the open-loop measurement")
	sluicePath := fs.String("sluice", "", "sluice binary to run (default: build ./cmd/sluice)")
	withRedis := fs.Bool("redis", true, "also measure sluice with a Redis limiter (starts a redis-server on a free port)")
	if code, done := parseModeFlags(fs, args, httpHelp, stdout); done {
		return code
	}
	fail := func(err error) int {
		fmt.Fprintf(stderr, "sluice-bench http: %v\n", err)
		return exitFailure
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

	var procs []*exec.Cmd
	defer func() {
		for _, p := range procs {
			_ = p.Process.Kill()
			_ = p.Wait()
		}
	}()
	spawn := func(health string, name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stderr = io.Discard
		cmd.Env = append(os.Environ(), childEnv+"=1")
		if err := cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, cmd)
		return waitHealthy(ctx, health)
	}

	upstreamAddr, proxyAddr := freeAddr(), freeAddr()
	if err := spawn("http://"+upstreamAddr+"/", self, "upstream", upstreamAddr); err != nil {
		return fail(fmt.Errorf("upstream: %w", err))
	}
	if err := spawn("http://"+proxyAddr+"/", self, "plain-proxy", proxyAddr, "http://"+upstreamAddr); err != nil {
		return fail(fmt.Errorf("plain proxy: %w", err))
	}
	targets := []struct{ name, url string }{
		{"upstream alone", "http://" + upstreamAddr + "/"},
		{"httputil.ReverseProxy", "http://" + proxyAddr + "/"},
	}
	startSluice := func(name string, extra ...string) error {
		listen, admin := freeAddr(), freeAddr()
		args := append([]string{"serve", "--rules", rulesPath, "--upstream", "http://" + upstreamAddr,
			"--listen", listen, "--admin-listen", admin, "--log-level", "error",
			"--data-dir", filepath.Join(dir, "data-"+listen)}, extra...)
		if err := spawn("http://"+admin+"/healthz", *sluicePath, args...); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		targets = append(targets, struct{ name, url string }{name, "http://" + listen + "/"})
		return nil
	}
	if err := startSluice("sluice serve (memory)"); err != nil {
		return fail(err)
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

	type row struct {
		name      string
		maxRPS    float64
		latencies vegeta.LatencyMetrics
		errors    float64
	}
	var rows []row
	for i, tg := range targets {
		fmt.Fprintf(stderr, "[%d/%d] %s: closed loop, %d workers, %v…\n", i+1, len(targets), tg.name, *workers, *duration)
		closed := attack(tg.url, vegeta.Rate{}, *workers, *duration)
		fmt.Fprintf(stderr, "[%d/%d] %s: open loop, %d/s, %v…\n", i+1, len(targets), tg.name, *rate, *duration)
		open := attack(tg.url, vegeta.Rate{Freq: *rate, Per: time.Second}, *workers, *duration)
		rows = append(rows, row{tg.name, closed.Throughput, open.Latencies, 1 - min(closed.Success, open.Success)})
		if ctx.Err() != nil {
			return fail(ctx.Err())
		}
	}

	fmt.Fprintf(stdout, "HTTP through the front door: %d workers closed loop; latency open loop at %d/s; %v each\n\n", *workers, *rate, *duration)
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\treq/s\tvs proxy\tp50\tp99\tp99.9\tp50 added vs proxy\terrors\t")
	proxy := rows[1]
	for _, r := range rows {
		added := "-"
		if r.name != rows[0].name {
			added = (r.latencies.P50 - proxy.latencies.P50).Round(time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%.0f%%\t%v\t%v\t%v\t%s\t%.2f%%\t\n", r.name, r.maxRPS, 100*r.maxRPS/proxy.maxRPS,
			r.latencies.P50.Round(time.Microsecond), r.latencies.P99.Round(time.Microsecond),
			r.latencies.Quantile(0.999).Round(time.Microsecond), added, 100*r.errors)
	}
	if err := tw.Flush(); err != nil {
		return fail(err)
	}
	return exitOK
}

// attack sends GET url at rate (closed loop with `workers` connections when rate is
// zero) for d and returns vegeta's metrics.
func attack(u string, rate vegeta.Rate, workers uint64, d time.Duration) vegeta.Metrics {
	a := vegeta.NewAttacker(vegeta.Workers(workers), vegeta.MaxWorkers(workers),
		vegeta.Connections(int(workers)), vegeta.KeepAlive(true), vegeta.Timeout(10*time.Second))
	tr := vegeta.NewStaticTargeter(vegeta.Target{Method: "GET", URL: u})
	var m vegeta.Metrics
	for res := range a.Attack(tr, rate, d, "bench") {
		m.Add(res)
	}
	m.Close()
	return m
}

// buildSluice builds the sluice binary to out, in the sluice module this tool is built
// against (the repository root, through go.mod's replace): sluice's own go.mod and
// go.sum pick its dependencies, not this module's.
func buildSluice(ctx context.Context, out string) error {
	const hint = "run from within the repository, or pass --sluice"
	dir, err := exec.CommandContext(ctx, "go", "list", "-m", "-f", "{{.Dir}}", "github.com/sluicehq/sluice").Output()
	if err != nil || strings.TrimSpace(string(dir)) == "" {
		return fmt.Errorf("finding the sluice module (%s): %v", hint, err)
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", out, "./cmd/sluice")
	cmd.Dir = strings.TrimSpace(string(dir))
	if msg, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/sluice in %s (%s): %v\n%s", cmd.Dir, hint, err, msg)
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
	deadline := time.Now().Add(20 * time.Second)
	for {
		resp, err := http.Get(u)
		if err == nil {
			resp.Body.Close()
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s never answered: %w", u, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
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

// serveUntilDone serves srv until ctx ends, then shuts it down (the requests under way
// get a few seconds) and returns exitOK; a server that cannot listen or fails returns
// exitFailure.
func serveUntilDone(ctx context.Context, srv *http.Server, stderr io.Writer) int {
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	select {
	case err := <-errc:
		fmt.Fprintln(stderr, err)
		return exitFailure
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
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
