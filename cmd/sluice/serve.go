package main

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/envoy"
	"github.com/sluicehq/sluice/ingress/proxyproto"
	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
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
}

func (c *frontConfig) flags(fs *pflag.FlagSet, front bool) {
	if front {
		fs.StringVar(&c.upstream, "upstream", "", "`URL` of the upstream that allowed requests go to (required)")
		fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` of the front door")
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

// redisConfig says where the limits live when they are shared: the Redis URL, and
// its credentials and TLS material.
type redisConfig struct {
	url      string
	password string
	ca       string
	cert     string
	key      string
	timeout  time.Duration
}

func (c *redisConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.url, "redis", "", "keep limits in the Redis at this `URL` (redis://[user[:password]@]host:port/db, rediss:// for TLS; redis://host:port?addr=host2:port2 for a cluster)")
	fs.StringVar(&c.password, "redis-password", "", "Redis `password`, instead of one in the --redis URL (best from SLUICE_REDIS_PASSWORD or the config file, not the command line)")
	fs.StringVar(&c.ca, "redis-ca", "", "`file` of CA certificates that the Redis servers' TLS certificates are checked against, instead of the system's (rediss:// URLs)")
	fs.StringVar(&c.cert, "redis-cert", "", "client certificate `file` for Redis TLS (with --redis-key; rediss:// URLs)")
	fs.StringVar(&c.key, "redis-key", "", "client key `file` for Redis TLS")
	fs.DurationVar(&c.timeout, "redis-timeout", 50*time.Millisecond, "how long a decision waits for Redis before it follows the limit's failure_mode")
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
		"algorithm":        algorithmList(),
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

// gateway is a running serve, ingress or dispatch: the parts it is made of, for run
// to start and stop in order.
type gateway struct {
	mode    gatewayMode
	cfg     gatewayConfig
	log     *slog.Logger
	watcher *watch.Watcher
	redis   redis.UniversalClient
	store   *redisstore.Store
	nats    *natsConn
	queues  *queues // nil in rls
	// declaring is queues once reloads may declare through it (Prepare).
	declaring atomic.Pointer[queues]
	front     *http.Server // nil in dispatch and rls
	// proxyProtocol are the peers whose front-door connections carry a PROXY header.
	proxyProtocol ingress.Prefixes
	limiter       limiter.Limiter
	grpc          *envoy.Server // nil without --grpc-listen
	grpcLn        net.Listener
	check         *http.Server // nil without --check-listen
	admin         *http.Server // nil without --admin-listen
	adminAPI      *ingress.Admin
	deps          *ingress.Dependencies
	deferrer      *deferral.Deferrer // nil without a front door
	reloads       console.Reloads    // the rules reloads, for the console's rules page
	cluster       *console.Cluster   // publishes this replica's counters, reads the others'; nil: neither
	// Without --admin-token, the console token's file in the data directory, and the
	// one-time sign-in code to print once listening ("" unless the file is new).
	consoleFile, consoleCode string
	// lns are the bound addresses of front, check and admin, by the flag that names
	// each (see listen).
	lns map[string]net.Listener
}

func newGateway(mode gatewayMode, cfg gatewayConfig, log *slog.Logger) (_ *gateway, err error) {
	g := &gateway{mode: mode, cfg: cfg, log: log}
	defer func() {
		if err != nil {
			g.close()
		}
	}()
	if cfg.rules == "" {
		return nil, errors.New("--rules is required")
	}
	var upstream *url.URL
	var ids *ingress.ClientIdentity
	if mode.front || mode.rls {
		// Flags first, before anything is started.
		if mode.front {
			if cfg.front.upstream == "" {
				return nil, errors.New("--upstream is required")
			}
			upstream, err = url.Parse(cfg.front.upstream)
			if err != nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
				return nil, fmt.Errorf("--upstream %q: want an http:// or https:// URL", cfg.front.upstream)
			}
			if err := cfg.front.checkWaits(); err != nil {
				return nil, err
			}
		}
		if err := cfg.envoy.check(mode); err != nil {
			return nil, err
		}
		if ids, err = ingress.NewClientIdentity(strings.Split(cfg.front.trustedProxies, ","), cfg.front.ipv6Prefix,
			ingress.WithForwardedHeader(ingress.ForwardedHeader(cfg.front.forwarded))); err != nil {
			return nil, fmt.Errorf("--trusted-proxies / --ipv6-prefix: %w", err)
		}
		if g.proxyProtocol, err = ingress.ParsePrefixes(strings.Split(cfg.front.proxyProtocol, ",")); err != nil {
			return nil, fmt.Errorf("--proxy-protocol: %w", err)
		}
		// The client connects lazily: this checks the URL and the TLS files only.
		if g.redis, err = openRedis(cfg.front.redis, log); err != nil {
			return nil, err
		}
	}
	if !mode.rls {
		if err := cfg.nats.check(log); err != nil {
			return nil, err
		}
	}

	if err := g.listen(); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	// Reloads declare first: a new set goes live once its queues are declared (see
	// queues.prepare), on file changes and SIGHUP alike.
	g.watcher, err = watch.New(strings.Split(cfg.rules, ","), watch.Options{Registerer: reg, Logger: log,
		MergeDomains: cfg.mergeDoms, OnReload: g.reloads.Observe,
		Prepare: func(s *rules.Set) error {
			if q := g.declaring.Load(); q != nil {
				return q.prepare(s)
			}
			return nil // before the queues exist: their first declaration takes the active set
		}})
	if err != nil {
		return nil, err
	}

	if mode.front {
		setMemoryLimit(int64(cfg.front.deferMemory), g.watcher.Set(), cfg.dispatch, log)
	}
	if mode.rls {
		setRLSGCPercent(log)
	}
	// Redis and NATS are every replica's: their trouble shows in /sluice/v1/status and
	// the metrics, never in /readyz, which would take every replica out at once.
	if g.deps, err = ingress.NewDependencies(ingress.WithCheckTimeout(dependencyTimeout), ingress.WithDependencyLogger(log),
		ingress.WithSecrets(cfg.secrets()...)); err != nil {
		return nil, err
	}
	reg.MustRegister(g.deps)
	if mode.rls {
		if _, err := g.middleware(ids, nil, reg); err != nil {
			return nil, err
		}
		if err := g.newCluster(reg); err != nil {
			return nil, err
		}
		if err := g.openAdmin(reg); err != nil {
			return nil, err
		}
		return g, nil
	}
	natsCfg := cfg.nats
	natsCfg.maxBody = largestMaxBody(g.watcher.Set())
	if g.nats, err = openNATS(natsCfg, log, true); err != nil {
		return nil, &unusableError{err}
	}
	if g.nats.embedded != nil && cfg.nats.encryptionKey == "" {
		log.Warn("the data directory is not encrypted: parked requests, their headers (Authorization, Cookie…) and bodies are stored in clear in --data-dir; "+
			"give --encryption-key, SLUICE_ENCRYPTION_KEY or --encryption-key-file to encrypt it at rest", "data_dir", cfg.nats.dataDir)
	}
	var disp []dispatcher.Option
	if cfg.dispatch {
		disp = append(cfg.disp.options(), dispatcher.WithTracerProvider(cfg.tracing))
	}
	g.queues = newQueues(g.nats, disp, reg, log, g.watcher.Reload)
	g.queues.tracing = cfg.tracing
	g.declaring.Store(g.queues)
	// A first attempt before serving, so that a reachable NATS (the embedded one
	// always) has the queues declared when the front door opens. What fails for want
	// of NATS is retried in the background by run; the process never exits for it.
	// The active set is read once reloads go through the queues, so none is missed.
	ctx, cancel := context.WithTimeout(context.Background(), declareTimeout)
	defer cancel()
	g.queues.declare(ctx, g.watcher.Set())
	g.deps.Add("nats", g.queues.health)

	if mode.front {
		handler, err := g.frontDoor(upstream, ids, reg)
		if err != nil {
			return nil, err
		}
		g.front = newHTTPServer(cfg.front.listen, handler, log)
		// Open waits and event streams answer what they have at once: Shutdown waits
		// for every handler.
		g.front.RegisterOnShutdown(g.deferrer.Close)
		if g.check != nil {
			g.check.RegisterOnShutdown(g.deferrer.Close)
		}
	}
	if err := g.newCluster(reg); err != nil {
		return nil, err
	}
	if err := g.openAdmin(reg); err != nil {
		return nil, err
	}
	return g, nil
}

// listen binds the addresses of the HTTP listeners that the flags name (--listen,
// --check-listen, --admin-listen), before anything else is opened: an address in use
// fails the start at once, with its flag, rather than after NATS and the rules are up.
func (g *gateway) listen() error {
	g.lns = map[string]net.Listener{}
	addrs := []struct{ flag, addr string }{{"check-listen", g.cfg.envoy.checkListen}, {"admin-listen", g.cfg.admin.listen}}
	if g.mode.front {
		addrs = append(addrs, struct{ flag, addr string }{"listen", g.cfg.front.listen})
	}
	for _, a := range addrs {
		if a.addr == "" && a.flag != "listen" { // an empty --listen is any port, as net.Listen has it
			continue
		}
		ln, err := net.Listen("tcp", a.addr)
		if err != nil {
			return &unusableError{listenError(a.flag, a.addr, err)}
		}
		g.lns[a.flag] = ln
	}
	return nil
}

// listenError is the error of listening on addr, the value of --flag: an address in
// use says what to do about it.
func listenError(flag, addr string, err error) error {
	if errors.Is(err, syscall.EADDRINUSE) {
		return fmt.Errorf("--%s %s: the address is in use by another process: stop it, or give --%s another address", flag, addr, flag)
	}
	return fmt.Errorf("--%s %s: %w", flag, addr, err)
}

// newCluster makes the console's cluster view: with queues, this replica publishes its
// counters to the NATS bucket every replica reads; without them (sluice rls) the view
// is this process's, kept for the console when there is one.
func (g *gateway) newCluster(reg *prometheus.Registry) error {
	if g.queues == nil && (g.cfg.admin.listen == "" || g.cfg.admin.token == "") {
		return nil
	}
	host, _ := os.Hostname()
	opts := []console.ClusterOption{console.WithClusterLogger(g.log), console.WithHost(host), console.WithInterval(g.cfg.admin.reportEvery)}
	var store interface{ Load() *queue.Store }
	if g.queues != nil {
		store = &g.queues.store
		opts = append(opts, console.WithReportsBucket(g.queues.reportsBucket))
	}
	c, err := console.NewCluster(console.NewReplicaID(), console.LocalReport(reg, store), opts...)
	if err != nil {
		return fmt.Errorf("--console-report-interval: %w", err)
	}
	g.cluster = c
	return nil
}

// openAdmin builds the admin listener, when one is asked for, with the operator
// console under /console/ when there is an admin token to sign in with.
func (g *gateway) openAdmin(reg *prometheus.Registry) error {
	if g.cfg.admin.listen == "" {
		return nil
	}
	g.adminAPI = &ingress.Admin{Gatherer: reg, Rules: g.watcher, Dependencies: g.deps, Token: g.cfg.admin.token}
	opts := []console.Option{console.WithGatherer(reg), console.WithRules(g.watcher), console.WithReloads(&g.reloads),
		console.WithLogger(g.log)}
	if g.cluster != nil {
		opts = append(opts, console.WithCluster(g.cluster))
	}
	if g.cfg.admin.token != "" {
		// One allowance of wrong tokens per address for the API and the console's sign-in.
		g.adminAPI.Guard = ingress.NewTokenGuard(g.cfg.admin.token, nil)
		opts = append(opts, console.WithTokenGuard(g.adminAPI.Guard))
	}
	if g.queues != nil {
		// Unlike NATS trouble, which passes, a server too old for sluice stays until an
		// operator upgrades it: no replica on it can park anything.
		g.adminAPI.Ready = map[string]func(context.Context) error{"nats-version": g.queues.serverVersion}
		g.adminAPI.Queues = &queueapi.API{Store: &g.queues.store, Log: g.log}
		opts = append(opts, console.WithQueueStore(&g.queues.store))
	}
	token, created := g.cfg.admin.token, false
	if token == "" && g.nats != nil && g.nats.embedded != nil {
		// A data directory of this process's own: the console gets a token of its own
		// there (see consoleTokenFile).
		var err error
		if token, created, err = loadConsoleToken(g.cfg.nats.dataDir); err != nil {
			return err
		}
		g.consoleFile = filepath.Join(g.cfg.nats.dataDir, consoleTokenFile)
	}
	if token == "" {
		g.adminAPI.Extra = map[string]http.Handler{"GET " + console.Prefix: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			ingress.WriteProblem(w, http.StatusNotFound, "The console needs an admin token to sign in with: start sluice with --admin-token (or SLUICE_ADMIN_TOKEN).")
		})}
		g.admin = newHTTPServer(g.cfg.admin.listen, g.adminAPI.Handler(), g.log)
		return nil
	}
	c, err := console.New(token, g.adminAPI.Handler(), opts...)
	if err != nil {
		return err
	}
	if created {
		g.consoleCode = c.NewSignInCode()
	}
	g.admin = newHTTPServer(g.cfg.admin.listen, c.Handler(), g.log)
	return nil
}

// logConsole says, once listening, where the console is and how to sign in when its
// token is the one kept in the data directory: the first start prints a one-time
// sign-in URL (Jupyter's way, without putting the token itself in the log), every
// later one the token's file.
func (g *gateway) logConsole() {
	switch {
	case g.consoleFile == "" || g.admin == nil:
	case g.consoleCode != "":
		g.log.Info("console: sign in once at this URL (within "+strings.TrimSuffix(console.SignInCodeTTL.String(), "0m0s")+"; later with the token in the file)",
			"url", consoleURL(g.admin.Addr)+"#code="+g.consoleCode, "file", g.consoleFile)
		g.consoleCode = ""
	default:
		g.log.Info("console: sign in with the token in the file", "url", consoleURL(g.admin.Addr), "file", g.consoleFile)
	}
}

// frontDoor builds the front door's handler: ticket status, and every other request
// through the limiter to the proxy or the queues. It adds the Redis dependency when
// limits live there.
func (g *gateway) frontDoor(upstream *url.URL, ids *ingress.ClientIdentity, reg *prometheus.Registry) (http.Handler, error) {
	cfg := g.cfg.front
	deferrer := deferral.New(g.queues, deferral.WithLogger(g.log), deferral.WithBodyMemory(int64(cfg.deferMemory)),
		deferral.WithLookupLimit(ids, limiter.Rate(cfg.ticketLookups)),
		deferral.WithWaits(deferral.WaitLimits{Max: cfg.maxWait, PerClient: cfg.waitsPerClient, Total: cfg.waits, IDs: ids}))
	g.deferrer = deferrer
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_ticket_waits",
		Help: "Ticket status requests held open now: Prefer: wait and event streams (--max-waits)."},
		func() float64 { return float64(deferrer.OpenWaits()) }))
	mw, err := g.middleware(ids, deferrer, reg)
	if err != nil {
		return nil, err
	}
	proxy, err := ingress.NewProxy(upstream, ingress.WithProxyLogger(g.log), ingress.WithProxyRegisterer(reg),
		ingress.WithProxyClientIdentity(ids), ingress.WithProxyMaxHeaderBytes(int64(cfg.maxUpHeader)),
		ingress.WithProxyReuseAfter(cfg.upReuseAfter), ingress.WithProxyMaxHold(cfg.upMaxHold))
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+deferral.Path+"{ticket}", deferrer.StatusHandler())
	mux.Handle("DELETE "+deferral.Path+"{ticket}", deferrer.CancelHandler())
	mux.Handle("/", mw.Wrap(proxy))
	return mux, nil
}

// middleware builds the limiter and the middleware that decides on it: the front
// door's, which the Envoy services share (with their own flags). It adds the Redis
// dependency when limits live there. deferrer is nil where nothing can park.
func (g *gateway) middleware(ids *ingress.ClientIdentity, deferrer *deferral.Deferrer, reg *prometheus.Registry) (*ingress.Middleware, error) {
	cfg := g.cfg.front
	var store limiter.Limiter = limiter.NewMemory(limiter.WithMaxKeys(cfg.maxKeys))
	if g.redis != nil {
		var err error
		g.store, err = redisstore.New(g.redis, redisstore.WithRegisterer(reg), redisstore.WithLogger(g.log),
			redisstore.WithTimeout(g.cfg.front.redis.timeout))
		if err != nil {
			return nil, fmt.Errorf("redis limiter (--redis-timeout and the metrics registry): %w", err)
		}
		store = g.store
		g.deps.Add("redis", g.redisHealth)
	}
	g.limiter = store
	opts := []ingress.Option{ingress.WithClientIdentity(ids), ingress.WithShadow(cfg.shadow), ingress.WithMaxBody(int64(cfg.maxBody)),
		ingress.WithLogger(g.log), ingress.WithRegisterer(reg), ingress.WithTracerProvider(g.cfg.tracing)}
	if deferrer != nil {
		opts = append(opts, ingress.WithDeferrer(deferrer), ingress.WithIdempotencyScopeKey(subKey(g.nats.key, "idempotency scope")))
	}
	mw, err := ingress.New(g.watcher, store, opts...)
	if err != nil {
		return nil, err
	}
	if err := g.envoyServers(mw, deferrer, reg); err != nil {
		return nil, err
	}
	return mw, nil
}

// subKey derives the key of one purpose from the queue key, so that no two uses of
// the secret can be played against each other.
func subKey(key []byte, purpose string) []byte {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("sluice " + purpose))
	return mac.Sum(nil)
}

// dependencyTimeout bounds each check of a dependency (Redis, NATS) in
// /sluice/v1/status and the sluice_dependency_up gauge.
const dependencyTimeout = 2 * time.Second

// redisHealth is the Redis check of /sluice/v1/status: whether Redis answers, whether
// the limiter still decides without it, and the failure modes of the rules' limits,
// which decide meanwhile.
func (g *gateway) redisHealth(ctx context.Context) ingress.DependencyReport {
	modes := map[limiter.FailureMode]int{}
	if set := g.watcher.Set(); set != nil {
		for _, r := range set.Rules() {
			for _, l := range r.Limits {
				modes[cmp.Or(l.FailureMode, limiter.FailLocal)]++
			}
		}
	}
	detail := map[string]any{"limiter_fallback": g.store.Down(), "fallback_decisions": g.store.Fallbacks(), "failure_modes": modes}
	if err := g.store.Ping(ctx); err != nil {
		return ingress.DependencyReport{State: ingress.DependencyDown, Err: err, Detail: detail}
	}
	if g.store.Down() {
		return ingress.DependencyReport{State: ingress.DependencyDegraded, Detail: detail,
			Err: errors.New("redis answers; the limiter decides without it until its next probe")}
	}
	return ingress.DependencyReport{State: ingress.DependencyUp, Detail: detail}
}

// secrets returns the passwords the flags hold, which a status must never show.
func (c gatewayConfig) secrets() []string {
	out := []string{c.front.redis.password}
	for _, raw := range append(strings.Split(c.nats.url, ","), c.front.redis.url) {
		if u, err := url.Parse(strings.TrimSpace(raw)); err == nil && u.User != nil {
			p, _ := u.User.Password()
			out = append(out, p)
		}
	}
	return out
}

// openRedis returns a client of the Redis (or Redis Cluster, with addr= parameters)
// that c describes, or nil without --redis. It only checks the configuration: the
// client connects when first used. Every error names the flag at fault.
func openRedis(c redisConfig, log *slog.Logger) (redis.UniversalClient, error) {
	if c.url == "" {
		for _, f := range []struct{ name, value string }{{"redis-password", c.password}, {"redis-ca", c.ca}, {"redis-cert", c.cert}, {"redis-key", c.key}} {
			if f.value != "" {
				log.Warn("--" + f.name + " has no effect without --redis: limits are kept in memory")
			}
		}
		return nil, nil
	}
	u, err := url.Parse(c.url)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	tlsConf, err := loadTLS("redis", c.ca, c.cert, c.key)
	if err != nil {
		return nil, err
	}
	// configure completes what the URL gave: the password of --redis-password, the
	// CA and client certificate of the TLS that rediss:// turned on.
	configure := func(password *string, t **tls.Config) error {
		if c.password != "" {
			if *password != "" {
				return errors.New("--redis-password: the --redis URL has a password too; give it in one place")
			}
			*password = c.password
		}
		if tlsConf != nil {
			if *t == nil {
				return fmt.Errorf("--redis-ca, --redis-cert and --redis-key need a rediss:// URL; --redis is %s://", u.Scheme)
			}
			(*t).RootCAs = tlsConf.RootCAs
			(*t).GetClientCertificate = tlsConf.GetClientCertificate
		}
		return nil
	}
	if u.Query().Has("addr") {
		opts, err := redis.ParseClusterURL(c.url)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		if err := configure(&opts.Password, &opts.TLSConfig); err != nil {
			return nil, err
		}
		// Calls end at their context's deadline, not after the read timeout and its
		// retries: a hung Redis must not hold a check or a decision past its bound.
		opts.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(c.url)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	if err := configure(&opts.Password, &opts.TLSConfig); err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
}

// loadTLS checks the TLS files of the flags --PREFIX-ca, --PREFIX-cert and
// --PREFIX-key, and returns a configuration with their CA pool and a client
// certificate that is read again for every new connection (so that a renewed
// certificate is used without a restart); nil when none is given.
func loadTLS(prefix, ca, cert, key string) (*tls.Config, error) {
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--%s-ca: %w", prefix, err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%s-ca: no PEM certificate in %s", prefix, ca)
		}
	}
	switch {
	case cert != "" && key == "":
		return nil, fmt.Errorf("--%s-cert needs --%s-key", prefix, prefix)
	case key != "" && cert == "":
		return nil, fmt.Errorf("--%s-key needs --%s-cert", prefix, prefix)
	case cert != "":
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return nil, fmt.Errorf("--%s-cert / --%s-key: %w", prefix, prefix, err)
		}
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(cert, key)
			return &c, err
		}
	}
	return conf, nil
}

// check checks the NATS flags before anything connects: the credentials and TLS
// files must be readable and well-formed (nats.go reads them again at each
// connection). Without --nats they have no use: the embedded server is reached in
// process. check then warns and clears them; and the other way round for the flags
// of the embedded server. It reads --encryption-key-file. Then the queue key
// (checkQueueKey).
func (c *natsConfig) check(log *slog.Logger) error {
	if err := c.checkConn(log); err != nil {
		return err
	}
	return c.checkQueueKey()
}

func (c *natsConfig) checkConn(log *slog.Logger) error {
	type flagValue struct {
		name  string
		value *string
	}
	unused := func(flags []flagValue, why string) {
		for _, f := range flags {
			if *f.value != "" {
				log.Warn("--" + f.name + " has no effect " + why)
				*f.value = ""
			}
		}
	}
	if c.url != "" {
		unused([]flagValue{{"nats-listen", &c.listen}, {"nats-listen-token", &c.listenToken}, {"nats-listen-cert", &c.listenCert},
			{"nats-listen-key", &c.listenKey}, {"nats-listen-ca", &c.listenCA}, {"encryption-key", &c.encryptionKey},
			{"encryption-key-file", &c.encryptionKeyFile}}, "with --nats: it configures the embedded NATS server")
		if c.creds != "" {
			if _, err := os.ReadFile(c.creds); err != nil {
				return fmt.Errorf("--nats-creds: %w", err)
			}
			if c.token != "" {
				return errors.New("--nats-token and --nats-creds: give one of them")
			}
		}
		_, err := loadTLS("nats", c.ca, c.cert, c.key)
		return err
	}
	unused([]flagValue{{"nats-creds", &c.creds}, {"nats-token", &c.token}, {"nats-ca", &c.ca}, {"nats-cert", &c.cert}, {"nats-key", &c.key}},
		"without --nats: sluice reaches its embedded NATS server in process")
	if err := c.readEncryptionKey(log); err != nil {
		return err
	}
	if c.listen == "" {
		unused([]flagValue{{"nats-listen-token", &c.listenToken}, {"nats-listen-cert", &c.listenCert},
			{"nats-listen-key", &c.listenKey}, {"nats-listen-ca", &c.listenCA}}, "without --nats-listen")
		return nil
	}
	if c.listenToken != "" {
		if err := checkSecret("nats-listen-token", c.listenToken); err != nil {
			return err
		}
	}
	switch {
	case c.listenCert != "" && c.listenKey == "":
		return errors.New("--nats-listen-cert needs --nats-listen-key")
	case c.listenKey != "" && c.listenCert == "":
		return errors.New("--nats-listen-key needs --nats-listen-cert")
	case c.listenCA != "" && c.listenCert == "":
		return errors.New("--nats-listen-ca needs --nats-listen-cert and --nats-listen-key: client certificates are checked in TLS")
	case c.listenToken == "" && c.listenCA == "":
		// Whoever reaches an open listener reads, forges and erases parked orders.
		return errors.New("--nats-listen needs --nats-listen-token (or SLUICE_NATS_LISTEN_TOKEN), or TLS client certificates " +
			"(--nats-listen-cert, --nats-listen-key and --nats-listen-ca): NATS clients must authenticate")
	}
	_, err := c.listenTLS()
	return err
}

// listenTLS is the TLS of --nats-listen: the server certificate, and with
// --nats-listen-ca verified client certificates; nil without --nats-listen-cert.
func (c *natsConfig) listenTLS() (*tls.Config, error) {
	if c.listen == "" || c.listenCert == "" {
		return nil, nil
	}
	conf, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: c.listenCert, KeyFile: c.listenKey, CaFile: c.listenCA, Verify: c.listenCA != ""})
	if err != nil {
		return nil, fmt.Errorf("--nats-listen-cert / --nats-listen-key / --nats-listen-ca: %w", err)
	}
	return conf, nil
}

// readEncryptionKey takes --encryption-key, or reads it from --encryption-key-file
// (without the trailing newline), and checks it.
func (c *natsConfig) readEncryptionKey(log *slog.Logger) error {
	if c.encryptionKeyFile != "" {
		if c.encryptionKey != "" {
			return errors.New("--encryption-key and --encryption-key-file: give one of them")
		}
		b, err := os.ReadFile(c.encryptionKeyFile)
		if err != nil {
			return fmt.Errorf("--encryption-key-file: %w", err)
		}
		if fi, err := os.Stat(c.encryptionKeyFile); err == nil && fi.Mode().Perm()&0o077 != 0 {
			log.Warn("--encryption-key-file can be read by other users than its owner", "file", c.encryptionKeyFile, "mode", fi.Mode().Perm().String())
		}
		c.encryptionKey = strings.TrimRight(string(b), "\r\n")
		if err := checkSecret("encryption-key-file", c.encryptionKey); err != nil {
			return err
		}
		return nil
	}
	if c.encryptionKey != "" {
		return checkSecret("encryption-key", c.encryptionKey)
	}
	return nil
}

// checkSecret refuses a token or key that is short enough to guess, or that has
// spaces or control characters (most likely a copy-and-paste accident).
func checkSecret(flag, v string) error {
	if len(v) < minSecretLen {
		return fmt.Errorf("--%s: at least %d characters, not %d (for example: openssl rand -hex 32)", flag, minSecretLen, len(v))
	}
	if strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }) >= 0 {
		return fmt.Errorf("--%s: spaces and control characters are not allowed", flag)
	}
	return nil
}

// maxHeaderBytes caps the request headers the front door reads.
const maxHeaderBytes = 64 << 10

// newHTTPServer sets every timeout, so a slow or idle client cannot hold a connection
// (or a goroutine) forever.
func newHTTPServer(addr string, h http.Handler, log *slog.Logger) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           h,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       60 * time.Second,
		WriteTimeout:      90 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    maxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// run serves until ctx is done, then shuts down gracefully.
func (g *gateway) run(ctx context.Context) error {
	defer g.close()
	var servers []*http.Server
	for _, hs := range []*http.Server{g.front, g.check, g.admin} {
		if hs != nil {
			servers = append(servers, hs)
		}
	}
	// Every address was bound at the start (listen).
	listeners := make([]net.Listener, len(servers))
	for i, hs := range servers {
		flag := map[*http.Server]string{g.front: "listen", g.check: "check-listen", g.admin: "admin-listen"}[hs]
		ln := g.lns[flag]
		hs.Addr = ln.Addr().String() // the real port when it was 0
		if hs == g.front && len(g.proxyProtocol) > 0 {
			ln = proxyproto.Listen(ln, g.proxyProtocol.Contains, hs.ReadHeaderTimeout)
		}
		listeners[i] = ln
	}
	errs := make(chan error, len(servers)+1)
	for i, hs := range servers {
		go func() { errs <- hs.Serve(listeners[i]) }()
	}
	attrs := []any{"rules", g.watcher.Set().Summary().String()}
	if g.nats != nil {
		attrs = append(attrs, "queues", g.nats.where)
	}
	if g.grpc != nil {
		go func() { errs <- g.grpc.Serve(g.grpcLn) }()
		attrs = append(attrs, "grpc", g.grpcLn.Addr().String())
	}
	if g.check != nil {
		attrs = append(attrs, "check", g.check.Addr)
	}
	if g.mode.rls {
		attrs = append(attrs, "limiter", g.limiterName())
	}
	if g.front != nil {
		attrs = append(attrs, "listen", g.front.Addr, "upstream", g.cfg.front.upstream, "limiter", g.limiterName())
	}
	if g.admin != nil {
		attrs = append(attrs, "admin", g.admin.Addr)
	}
	attrs = append(attrs, "dispatch", g.cfg.dispatch)
	g.log.Info("sluice "+g.mode.started, attrs...)
	g.logConsole()
	if g.front == nil && !g.mode.rls && len(g.watcher.Set().Queues()) == 0 {
		// Only worth a warning where dispatching is all the process does.
		g.log.Warn("the rules declare no queues: nothing to dispatch until a reload adds some")
	}

	dispatchCtx, stopDispatch := context.WithCancel(context.Background())
	defer stopDispatch()
	if g.queues != nil {
		g.queues.run(dispatchCtx)
	}
	if g.cluster != nil {
		clusterDone := make(chan struct{})
		go func() {
			defer close(clusterDone)
			g.cluster.Run(dispatchCtx)
		}()
		defer func() { stopDispatch(); <-clusterDone }()
	}

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var err error
wait:
	for {
		select {
		case <-hup: // reload the rules now, as well as on file changes
			if e := g.watcher.Reload(); e != nil {
				g.log.Warn("rules reload on SIGHUP refused", "err", e)
			}
		case <-ctx.Done():
			break wait
		case err = <-errs:
			break wait
		}
	}
	g.log.Info("shutting down", "timeout", g.cfg.process.shutdownTimeout)
	if g.adminAPI != nil {
		// Unready first, so that load balancers stop sending; the admin listener is
		// the last to close, so /readyz says so while the rest drains.
		g.adminAPI.Drain()
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), g.cfg.process.shutdownTimeout)
	defer cancel()
	shutdown := func(hs *http.Server) {
		if e := hs.Shutdown(shutdownCtx); e != nil {
			g.log.Warn("shutdown incomplete", "addr", hs.Addr, "err", e)
		}
	}
	// The front door and the dispatchers (and the declaring of queues) stop together:
	// a request parked while the front door drains stays in its queue for the next
	// dispatcher, so neither has to wait for the other. Both get the same deadline.
	stopDispatch()
	var wg sync.WaitGroup
	if g.front != nil {
		wg.Go(func() { shutdown(g.front) })
	}
	if g.check != nil {
		wg.Go(func() { shutdown(g.check) })
	}
	if g.grpc != nil {
		wg.Go(func() { g.grpc.Shutdown(shutdownCtx) })
	}
	wg.Go(func() {
		if g.queues != nil && !g.queues.wait(shutdownCtx) {
			// What was cut off is redelivered after the ack wait, with the same
			// Idempotency-Key.
			g.log.Warn("deliveries still under way at the shutdown deadline; they will be redelivered")
		}
	})
	wg.Wait()
	if g.admin != nil {
		shutdown(g.admin)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (g *gateway) limiterName() string {
	if g.store != nil {
		return "redis"
	}
	return "memory"
}

func (g *gateway) close() {
	if g.grpcLn != nil {
		g.grpcLn.Close() // when the server never served
	}
	for _, ln := range g.lns {
		ln.Close() // the same
	}
	if g.watcher != nil {
		g.watcher.Close()
	}
	if g.deferrer != nil {
		g.deferrer.Close() // before NATS: it deletes its watch there
	}
	if g.store != nil {
		g.store.Close()
	}
	if g.redis != nil {
		g.redis.Close()
	}
	g.nats.close()
}
