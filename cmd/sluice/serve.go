package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// sluice serve, sluice ingress and sluice dispatch are one program built from the same
// parts, so that the halves behave exactly like the whole:
//
//	part        serve   ingress   dispatch
//	rules        yes      yes       yes      (queues are declared from them; reloads)
//	front door   yes      yes        -       (limiter, proxy, defer, ticket status)
//	NATS         yes      yes       yes      (embedded in --data-dir, or --nats)
//	dispatchers  yes¹      -        yes
//	admin        yes      yes       yes      (/metrics, /healthz, /readyz, rules)
//
// ¹ unless --dispatch=false, which makes serve the same as ingress.

// gatewayMode is one of the long-running commands.
type gatewayMode struct {
	name    string
	help    string
	front   bool // runs the front door
	rls     bool // decides for Envoy alone: limiter and rules, no front door, no queues
	disp    bool // can run dispatchers
	optOut  bool // has --dispatch to turn them off (serve)
	admin   string
	started string // verb of the start-up log line
}

var (
	serveMode = gatewayMode{name: "serve", help: serveHelp, front: true, disp: true, optOut: true,
		admin: "127.0.0.1:9090", started: "serving"}
	ingressMode = gatewayMode{name: "ingress", help: ingressHelp, front: true,
		admin: "127.0.0.1:9090", started: "serving"}
	// dispatch has an admin address of its own, so that it runs beside an ingress on
	// one machine without flags.
	dispatchMode = gatewayMode{name: "dispatch", help: dispatchHelp, disp: true,
		admin: "127.0.0.1:9091", started: "dispatching"}
)

const serveHelp = `Usage: sluice serve --rules FILE_OR_DIR[,…] --upstream URL [flags]

Runs the front door: every request is checked against the rules and then proxied to
the upstream, rejected with 429, or (defer rules) parked in a queue and answered 202;
and the dispatchers that drain the queues to their downstreams at their outflow rates.
Limits are kept in memory unless --redis is given, which shares them between replicas.
Queues live in an embedded NATS server in --data-dir unless --nats names a server or
cluster. The rules reload when their files change, and on SIGHUP. SIGINT or SIGTERM
stops accepting connections and finishes the requests and deliveries under way within
--shutdown-timeout.

sluice ingress and sluice dispatch run the two halves in separate processes.
`

const ingressHelp = `Usage: sluice ingress --rules FILE_OR_DIR[,…] --upstream URL [flags]

Runs the front door alone: sluice serve without dispatchers (serve --dispatch=false).
Deferred requests are parked in the queues, to be delivered by sluice dispatch
processes sharing the same NATS: --nats URL, or the embedded server started here with
--nats-listen ADDR and --nats-listen-token for the dispatchers to connect to (with
--nats nats://ADDR and --nats-token).
`

const dispatchHelp = `Usage: sluice dispatch --rules FILE_OR_DIR[,…] [--nats URL | --data-dir DIR --nats-listen ADDR] [flags]

Runs the dispatchers alone: the queues of the rules are declared and drained to their
downstreams at their outflow rates, which are global across every dispatcher of a
queue (one of them delivers at a time; another takes over when it dies). The queues
follow rules reloads. SIGINT or SIGTERM stops taking messages and lets the deliveries
under way finish within --shutdown-timeout.
`

// gatewayConfig is everything the three commands are configured with; each registers
// the flag groups of its parts.
type gatewayConfig struct {
	rules       string
	mergeDoms   bool
	front       frontConfig
	admin       adminConfig
	process     processConfig
	nats        natsConfig
	disp        dispatchConfig
	dispatch    bool
	printConfig bool
	envoy       envoyConfig
	// tracing receives the spans of the front door, the parks and the deliveries:
	// from the OTEL_* environment (see newTracing), not a flag.
	tracing trace.TracerProvider
}

// frontConfig configures the front door.
type frontConfig struct {
	upstream       string
	listen         string
	redis          redisConfig
	trustedProxies string
	proxyProtocol  string
	forwarded      forwardedHeaderFlag
	ipv6Prefix     int
	maxBody        sizeFlag
	maxUpHeader    sizeFlag
	upReuseAfter   time.Duration
	upMaxHold      time.Duration
	deferMemory    sizeFlag
	ticketLookups  rateFlag
	maxWait        time.Duration
	waitsPerClient int
	waits          int
	maxKeys        int
	shadow         bool
	fastPath       bool
}

func (c *frontConfig) flags(fs *pflag.FlagSet, front bool) {
	if front {
		fs.StringVar(&c.upstream, "upstream", "", "`URL` of the upstream that allowed requests go to (required)")
		fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` of the front door")
		fs.BoolVar(&c.fastPath, "fast-path", true, "serve the common plaintext HTTP/1.1 requests on sluice's own fast path (ingress/h1) and every other connection on Go's net/http server; false: net/http for all")
		fs.StringVar(&c.proxyProtocol, "proxy-protocol", "", "`CIDRs` of load balancers whose connections to the front door may start with a PROXY protocol header (v1 or v2, HAProxy's send-proxy / send-proxy-v2) naming the client, comma-separated")
	}
	c.redis.flags(fs)
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", "`CIDRs` of proxies whose forwarding header (--forwarded-header) is believed, comma-separated")
	fs.Var(&c.forwarded, "forwarded-header", "the `header` the trusted proxies append the client to: x-forwarded-for or forwarded (RFC 7239); the other is ignored")
	fs.IntVar(&c.ipv6Prefix, "ipv6-prefix", 64, "IPv6 clients are limited per `bits`-long prefix")
	c.maxBody = ingress.DefaultMaxBody
	fs.Var(&c.maxBody, "max-body", "largest request body, in bytes or with a unit (10MiB); larger ones get 413; 0: no limit")
	c.deferMemory = deferral.DefaultBodyMemory
	if front {
		c.maxUpHeader = ingress.DefaultMaxUpstreamHeader
		fs.Var(&c.maxUpHeader, "max-upstream-header", "largest response head the upstream may send (status line, header fields, informational responses before them; a trailer section), in bytes or with a unit (1MiB), in total and per line; larger ones get 502 and the connection is closed")
		fs.DurationVar(&c.upReuseAfter, "upstream-reuse-after", 0, "how long a kept-alive upstream connection idles, watched, before it carries another request: bytes a broken upstream sends that long after a response then close the connection instead of reaching another client; costs about the request rate times this many connections; 0: reuse at once")
		fs.DurationVar(&c.upMaxHold, "upstream-max-hold", ingress.DefaultProxyMaxHold, "longest a request may wait in the front door (a stalled or stopped process) and still be sent to the upstream; past it 503 with Retry-After, never sent, since its client has most likely retried")
		fs.Var(&c.deferMemory, "defer-memory", "most bytes of deferred request bodies held in memory at once, plain or with a unit (64MiB); past it 503 with Retry-After")
		// A client following its tickets' Retry-After asks about each once a second at
		// most: this lets one address follow a hundred tickets at once.
		c.ticketLookups = rateFlag(limiter.PerSecond(100))
		fs.Var(&c.ticketLookups, "ticket-lookups", "ticket status and cancel requests each client may make (100/s, bursts of twice the count); past it 429 with Retry-After; 0: no limit")
		fs.DurationVar(&c.maxWait, "max-wait-preference", time.Minute, "longest 'Prefer: wait' a ticket status request is held for until the order is final (longer ones are cut to it); 0: no waits and no event streams")
		fs.IntVar(&c.waitsPerClient, "max-waits-per-client", deferral.DefaultWaitsPerClient, "ticket waits and event streams each client (its address, an IPv6 address's prefix) may have open at once; past it a wait is answered at once and a stream is 429")
		fs.IntVar(&c.waits, "max-waits", deferral.DefaultWaits, "ticket waits and event streams open at once over every client")
	}
	fs.IntVar(&c.maxKeys, "max-keys", 1_000_000, "most `keys` the in-memory limiter tracks")
	fs.BoolVar(&c.shadow, "shadow", false, "shadow mode for every rule: decide, count and log, never enforce")
}

// checkWaits refuses wait flags that mean nothing.
func (c *frontConfig) checkWaits() error {
	switch {
	case c.maxWait < 0:
		return fmt.Errorf("--max-wait-preference %v: want a duration of 0 or more", c.maxWait)
	case c.waitsPerClient < 1:
		return fmt.Errorf("--max-waits-per-client %d: want 1 or more", c.waitsPerClient)
	case c.waits < 1:
		return fmt.Errorf("--max-waits %d: want 1 or more", c.waits)
	}
	return nil
}

// forwardedHeaderFlag is --forwarded-header: which header the trusted proxies write
// (ingress.ForwardedHeader), x-forwarded-for (the zero value, the default) or
// forwarded. Believing the other one would let a client behind those proxies name
// its own address.
type forwardedHeaderFlag ingress.ForwardedHeader

func (f *forwardedHeaderFlag) Set(v string) error {
	h, err := ingress.ParseForwardedHeader(v)
	if err != nil {
		return errors.New("want x-forwarded-for or forwarded, the header the trusted proxies append the client to")
	}
	*f = forwardedHeaderFlag(h)
	return nil
}

func (f *forwardedHeaderFlag) String() string { return ingress.ForwardedHeader(*f).String() }

// Type names the kind of value for want and --print-config.
func (f *forwardedHeaderFlag) Type() string { return "header" }

// adminConfig configures the operations listener.
type adminConfig struct {
	listen string
	token  string
	// reportEvery: how often the replica publishes its counters for the console
	// (console.WithInterval).
	reportEvery time.Duration
}

func (c *adminConfig) flags(fs *pflag.FlagSet, listen string) {
	fs.StringVar(&c.listen, "admin-listen", listen, "`address` of /metrics, /healthz, /readyz and the admin API; empty: none")
	fs.StringVar(&c.token, "admin-token", "", "bearer `token` that the admin endpoints other than /healthz require")
}

// processConfig is what every long-running command has: logs and shutdown.
type processConfig struct {
	shutdownTimeout time.Duration
	logFormat       string
	logLevel        string
}

func (c *processConfig) flags(fs *pflag.FlagSet) {
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long to wait for requests and deliveries under way at shutdown")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
}

func (m gatewayMode) flags(fs *pflag.FlagSet, c *gatewayConfig) {
	fs.StringVar(&c.rules, "rules", "", "rules `files or directories`, comma-separated (required)")
	fs.BoolVar(&c.mergeDoms, "merge-domains", false, mergeDomainsUsage)
	if m.front || m.rls {
		c.front.flags(fs, m.front)
		c.envoy.flags(fs, m.front)
	} else if m.disp {
		// dispatch: Redis keeps the pace of the queues' flow keys (flow_by) only.
		c.front.redis.flags(fs)
	}
	c.admin.flags(fs, m.admin)
	// Long-running commands only (dlq and queue share the admin flags).
	fs.DurationVar(&c.admin.reportEvery, "console-report-interval", console.ReportInterval, "how often this replica publishes its counters to NATS for the console's cluster view, and the console reads every replica's; the console's history takes a point every two intervals and keeps 360 (an hour at the default); 1s to 10s")
	c.process.flags(fs)
	if !m.rls {
		c.nats.flags(fs, true)
	}
	c.dispatch = m.disp
	if m.disp {
		c.disp.flags(fs)
	}
	if m.optOut {
		fs.BoolVar(&c.dispatch, "dispatch", true, "run the dispatchers of the queues in this process (false: the same as sluice ingress)")
	}
	configFlags(fs, &c.printConfig)
}

// gatewayCommand is serve, ingress, rls or dispatch.
func gatewayCommand(mode gatewayMode, short string, stdout, stderr io.Writer) *cobra.Command {
	var cfg gatewayConfig
	c := withEnv(&cobra.Command{
		Use:   mode.name,
		Short: short,
		Long:  mode.help,
		Args:  noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			return status(runGateway(c.Context(), mode, c.Flags(), &cfg, stdout, stderr))
		},
	})
	mode.flags(c.Flags(), &cfg)
	completeFlagValues(c)
	return c
}

// completeFlagValues tells shell completion the values of the flags that take one of a
// few words, and that the file flags take files.
func completeFlagValues(c *cobra.Command) {
	words := map[string][]cobra.Completion{
		"log-format":       {"text", "json"},
		"forwarded-header": {"x-forwarded-for", "forwarded"},
		"log-level":        {"debug", "info", "warn", "error"},
		"algorithm":        limiter.AlgorithmNames(),
	}
	c.Flags().VisitAll(func(f *pflag.Flag) {
		if w, ok := words[f.Name]; ok {
			_ = c.RegisterFlagCompletionFunc(f.Name, func(_ *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
				var out []cobra.Completion
				for _, v := range w {
					if strings.HasPrefix(v, prefix) {
						out = append(out, v)
					}
				}
				return out, cobra.ShellCompDirectiveNoFileComp
			})
		}
	})
	for _, name := range []string{"config", "rules", "trace"} {
		if c.Flags().Lookup(name) != nil {
			_ = c.MarkFlagFilename(name, "yaml", "yml")
		}
	}
}

// runGateway runs serve, ingress, rls or dispatch, whose flags cobra parsed into fs
// (and cfg).
func runGateway(ctx context.Context, mode gatewayMode, fs *pflag.FlagSet, cfg *gatewayConfig, stdout, stderr io.Writer) int {
	src, ok := loadFlags(fs, stderr)
	if !ok {
		return exitUsage
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice %s: "+format+"\n", append([]any{mode.name}, a...)...)
		return exitUsage
	}
	cfg.resolveDefaults(fs, src)
	if cfg.printConfig {
		if err := printConfig(stdout, fs, src); err != nil {
			fmt.Fprintf(stderr, "sluice %s: --print-config: %v\n", mode.name, err)
			return exitFailure
		}
		return exitOK
	}
	if fs.Lookup("defer-memory") != nil && cfg.front.deferMemory <= 0 {
		return fail("--defer-memory must be more than 0")
	}
	if fs.Lookup("max-upstream-header") != nil && cfg.front.maxUpHeader <= 0 {
		return fail("--max-upstream-header must be more than 0")
	}
	if cfg.front.upReuseAfter < 0 {
		return fail("--upstream-reuse-after must not be negative")
	}
	if fs.Lookup("upstream-max-hold") != nil && cfg.front.upMaxHold <= 0 {
		return fail("--upstream-max-hold must be more than 0")
	}
	log, err := newLogger(stderr, cfg.process.logFormat, cfg.process.logLevel)
	if err != nil {
		return fail("%v", err)
	}
	tr, err := newTracing(ctx, os.Getenv, log)
	if err != nil {
		return fail("%v", err)
	}
	defer tr.close(log)
	cfg.tracing = tr.provider
	g, err := newGateway(mode, *cfg, log)
	if err != nil {
		var probs rules.Problems
		var unusable *unusableError
		switch {
		case errors.As(err, &probs):
			fmt.Fprintf(stderr, "%v\n", err)
			return exitFailure
		case errors.As(err, &unusable):
			// Well-formed, but what it names (NATS, the data directory…) failed.
			fmt.Fprintf(stderr, "sluice %s: %v\n", mode.name, err)
			return exitFailure
		}
		return fail("%v", err)
	}
	if err := g.run(ctx); err != nil {
		log.Error("sluice "+mode.name+" stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

// ackWaitMargin is what the default --ack-wait adds to --delivery-timeout: room for a
// dispatcher that is slow, not dead, to finish before another one delivers again.
const ackWaitMargin = 30 * time.Second

// resolveDefaults works out the defaults that depend on other flags or on where the
// queues live, so that the command runs with, and --print-config shows, the values in
// force rather than 0 for "decided later":
//
//   - --ack-wait 0 is --delivery-timeout + 30s;
//   - --replicas auto is 1 on the embedded server; with --nats it stays auto until
//     connected (3 on a cluster, 1 on a single server; see natsConn.replicaCount).
func (c *gatewayConfig) resolveDefaults(fs *pflag.FlagSet, src *flagSources) {
	if fs.Lookup("ack-wait") != nil && c.disp.ackWait == 0 {
		c.disp.ackWait = c.disp.deliveryTimeout + ackWaitMargin
		src.derive("ack-wait", "delivery-timeout + 30s")
	}
	if fs.Lookup("replicas") != nil && c.nats.replicas == 0 {
		if c.nats.url == "" {
			c.nats.replicas = 1
			src.derive("replicas", "the embedded server: one copy")
		} else {
			src.derive("replicas", "3 on a NATS cluster, 1 on a single server, once connected")
		}
	}
}

// unusableError marks a start-up failure of something the flags name correctly (the
// data directory in use, the embedded NATS server failing to start; an unreachable
// --nats is waited for instead): exit status 1, not 2.
type unusableError struct{ err error }

func (e *unusableError) Error() string { return e.err.Error() }
func (e *unusableError) Unwrap() error { return e.err }

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		// slog's own error names none of the levels.
		return nil, fmt.Errorf("invalid value %q for --log-level: want debug, info, warn or error", level)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("invalid value %q for --log-format: want text or json", format)
}
