// Command sluice-bench measures sluice side by side with the libraries its users would
// otherwise pick, in one process and one run, so the figures compare like with like.
//
//	go run -C cmd/sluice-bench . limiter [--duration 2s] [--redis URL | --redis ''] [--json] [--svg FILE]
//
// Every measuring mode prints a table, or with --json one JSON document: the mode,
// the Go version, GOMAXPROCS, the parameters of the run and its results, in
// snake_case fields. The comparison modes (limiter, http, parking, pacing, rls) also
// draw their comparison as an SVG bar chart with --svg FILE.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

const (
	exitOK      = 0
	exitFailure = 1
	exitUsage   = 2
)

// modes is the dispatch table of the tool's modes.
var modes = []struct {
	name, summary string
	run           func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}{
	{"limiter", "decisions per second: the memory store vs x/time/rate, the Redis store vs redis_rate", runLimiter},
	{"http", "requests per second and latency: upstream, plain reverse proxy, sluice serve", runHTTP},
	{"parking", "orders parked per second through the ingress vs raw JetStream publishes", runParking},
	{"pacing", "pacing accuracy at fixed outflow rates vs x/time/rate, a ticker and a deadline loop", runPacing},
	{"rls", "ShouldRateLimit decisions per second and p99: sluice's rate limit service (memory, Redis) vs envoyproxy/ratelimit", runRLS},
	{"cluster", "the clustered shape (3 NATS nodes, Redis, sluice replicas) under load and faults: a delivery report", runCluster},
	// The servers that the http mode runs as processes of their own; upstream is also
	// handy for load runs (the quick start uses sluice demo-upstream).
	{"upstream", "a small HTTP server answering {\"ok\":true}: sluice-bench upstream ADDR", runUpstream},
	{"plain-proxy", "a plain httputil.ReverseProxy: sluice-bench plain-proxy ADDR UPSTREAM_URL", runPlainProxy},
	{"no-content", "net/http answering 204 and nothing else, a Go server's ceiling: sluice-bench no-content ADDR", runNoContent},
	{"floor-proxy", "net/http with one fixed round trip to the upstream per request, the floor under any Go proxy: sluice-bench floor-proxy ADDR UPSTREAM_URL", runFloorProxy},
	{"fast-no-content", "the front door's fast path (ingress/h1) answering 204 and nothing else, its ceiling: sluice-bench fast-no-content ADDR", runFastNoContent},
	{"pool-proxy", "sluice's proxy (ingress.Proxy) without rules or limiter: sluice-bench pool-proxy ADDR UPSTREAM_URL", runPoolProxy},
	// The services that the rls mode runs as processes of their own.
	{"rls-server", "sluice's rate limit service alone: sluice-bench rls-server [--headers=false] ADDR RULES_FILE [REDIS_URL]", runRLSServer},
	{"envoy-ratelimit", "envoyproxy/ratelimit's service, configured by its environment variables", runEnvoyRatelimit},
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return exitOK
	}
	for _, m := range modes {
		if m.name == args[0] {
			return m.run(ctx, args[1:], stdout, stderr)
		}
	}
	fmt.Fprintf(stderr, "sluice-bench: unknown mode %q\n\n", args[0])
	usage(stderr)
	return exitUsage
}

func usage(w io.Writer) {
	fmt.Fprint(w, "sluice-bench measures sluice side by side with well-known peers.\n\nUsage:\n  sluice-bench <mode> [flags]\n\nModes:\n")
	for _, m := range modes {
		fmt.Fprintf(w, "  %-15s %s\n", m.name, m.summary)
	}
	fmt.Fprint(w, "\nRun 'sluice-bench <mode> -h' for its flags.\n")
}

// parseModeFlags parses a mode's flags. done is true when the mode should return code
// at once: -h printed the help and the flags to stdout (status 0), or a bad flag was
// reported on the flag set's output (status 2).
func parseModeFlags(fs *flag.FlagSet, args []string, help string, stdout io.Writer) (code int, done bool) {
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), help)
		if !strings.HasSuffix(help, "Flags:\n") {
			fmt.Fprint(fs.Output(), "\nFlags:\n")
		}
		fs.PrintDefaults()
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return exitOK, true
	case err != nil:
		return exitUsage, true
	}
	return exitOK, false
}
