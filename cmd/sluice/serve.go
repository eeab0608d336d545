package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

const serveHelp = `Usage: sluice serve --rules FILE_OR_DIR[,…] --upstream URL [flags]

Runs the front door: every request is checked against the rules and then proxied to
the upstream, rejected with 429, or (defer rules) parked in a queue and answered 202;
and the dispatchers that drain the queues to their downstreams at their outflow rates.
Limits are kept in memory unless --redis is given, which shares them between replicas.
Queues live in an embedded NATS server in --data-dir unless --nats names a cluster. The rules reload
when their files change, and on SIGHUP. SIGINT or SIGTERM stops accepting connections and finishes the
requests under way within --shutdown-timeout.
`

// serveConfig is everything `sluice serve` is configured with.
type serveConfig struct {
	rules           string
	upstream        string
	listen          string
	adminListen     string
	adminToken      string
	redisURL        string
	trustedProxies  string
	ipv6Prefix      int
	maxBody         int64
	maxKeys         int
	shadow          bool
	shutdownTimeout time.Duration
	logFormat       string
	logLevel        string
	nats            natsConfig
	dispatch        bool
}

func (c *serveConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.rules, "rules", "", "rules `files or directories`, comma-separated (required)")
	fs.StringVar(&c.upstream, "upstream", "", "`URL` of the upstream that allowed requests go to (required)")
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "`address` of the front door")
	fs.StringVar(&c.adminListen, "admin-listen", "127.0.0.1:9090", "`address` of /metrics, /healthz, /readyz and the admin API; empty: none")
	fs.StringVar(&c.adminToken, "admin-token", "", "bearer `token` that the admin endpoints other than /healthz require")
	fs.StringVar(&c.redisURL, "redis", "", "keep limits in the Redis at this `URL` (redis://[:password@]host:port/db, rediss:// for TLS; redis://host:port?addr=host2:port2 for a cluster)")
	fs.StringVar(&c.trustedProxies, "trusted-proxies", "", "`CIDRs` of proxies whose Forwarded / X-Forwarded-For headers are believed, comma-separated")
	fs.IntVar(&c.ipv6Prefix, "ipv6-prefix", 64, "IPv6 clients are limited per `bits`-long prefix")
	fs.Int64Var(&c.maxBody, "max-body", ingress.DefaultMaxBody, "largest request body in `bytes`; larger ones get 413")
	fs.IntVar(&c.maxKeys, "max-keys", 1_000_000, "most `keys` the in-memory limiter tracks")
	fs.BoolVar(&c.shadow, "shadow", false, "shadow mode for every rule: decide, count and log, never enforce")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 30*time.Second, "how long to wait for requests under way at shutdown")
	fs.StringVar(&c.logFormat, "log-format", "text", "log `format`: text or json")
	fs.StringVar(&c.logLevel, "log-level", "info", "log `level`: debug, info, warn or error")
	c.nats.flags(fs)
	fs.BoolVar(&c.dispatch, "dispatch", true, "run the dispatchers of the queues in this process")
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var cfg serveConfig
	cfg.flags(fs)
	if _, code, done := parseFlags(fs, args, stdout, stderr, serveHelp); done {
		return code
	}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice serve: "+format+"\n", a...)
		return exitUsage
	}
	if fs.NArg() > 0 {
		return fail("unexpected argument %q", fs.Arg(0))
	}
	log, err := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	if err != nil {
		return fail("%v", err)
	}
	srv, err := newServer(cfg, log)
	if err != nil {
		var probs rules.Problems
		if errors.As(err, &probs) {
			fmt.Fprintf(stderr, "%v\n", err)
			return exitFailure
		}
		return fail("%v", err)
	}
	if err := srv.run(ctx); err != nil {
		log.Error("sluice serve stopped", "err", err)
		return exitFailure
	}
	return exitOK
}

func newLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format: %q is neither text nor json", format)
}

// server is a running `sluice serve`: the parts it is made of, for run to start and
// stop in order.
type server struct {
	cfg     serveConfig
	log     *slog.Logger
	watcher *rules.Watcher
	redis   redis.UniversalClient
	store   *limiter.Redis
	nats    *natsConn
	queues  *queues
	reloads chan *rules.Set
	front   *http.Server
	admin   *http.Server
}

func newServer(cfg serveConfig, log *slog.Logger) (_ *server, err error) {
	s := &server{cfg: cfg, log: log, reloads: make(chan *rules.Set, 1)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if cfg.rules == "" {
		return nil, errors.New("--rules is required")
	}
	if cfg.upstream == "" {
		return nil, errors.New("--upstream is required")
	}
	upstream, err := url.Parse(cfg.upstream)
	if err != nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
		return nil, fmt.Errorf("--upstream %q: want an http:// or https:// URL", cfg.upstream)
	}
	ids, err := ingress.NewClientIdentity(strings.Split(cfg.trustedProxies, ","), cfg.ipv6Prefix)
	if err != nil {
		return nil, fmt.Errorf("--trusted-proxies / --ipv6-prefix: %w", err)
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	s.watcher, err = rules.Watch(strings.Split(cfg.rules, ","), rules.WatchOptions{Registerer: reg, Logger: log,
		OnReload: func(r rules.ReloadResult) {
			if r.Err == nil {
				select { // the newest set is what counts; run declares it
				case <-s.reloads:
				default:
				}
				s.reloads <- r.Set
			}
		}})
	if err != nil {
		return nil, err
	}

	var store limiter.Limiter = limiter.NewMemory(limiter.WithMaxKeys(cfg.maxKeys))
	ready := map[string]func(context.Context) error{}
	if cfg.redisURL != "" {
		s.redis, err = openRedis(cfg.redisURL)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		s.store = limiter.NewRedis(s.redis, limiter.WithRedisRegisterer(reg), limiter.WithRedisLogger(log))
		store = s.store
		ready["redis"] = func(ctx context.Context) error { return s.redis.Ping(ctx).Err() }
	}

	if s.nats, err = openNATS(cfg.nats, log); err != nil {
		return nil, err
	}
	ready["nats"] = func(context.Context) error {
		if !s.nats.nc.IsConnected() {
			return errors.New("not connected to NATS")
		}
		return nil
	}
	if s.queues, err = newQueues(s.nats, cfg.dispatch, reg, log); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.queues.sync(ctx, s.watcher.Set()); err != nil {
		return nil, err
	}
	deferrer := ingress.NewQueueDeferrer(s.queues.store, log)

	mw := ingress.New(s.watcher, store,
		ingress.WithClientIdentity(ids), ingress.WithShadow(cfg.shadow), ingress.WithMaxBody(cfg.maxBody),
		ingress.WithLogger(log), ingress.WithRegisterer(reg), ingress.WithDeferrer(deferrer))
	proxy := ingress.NewProxy(upstream, ingress.WithProxyLogger(log), ingress.WithProxyRegisterer(reg),
		ingress.WithProxyClientIdentity(ids))
	front := http.NewServeMux()
	front.Handle("GET "+ingress.DeferredPath+"{ticket}", deferrer.StatusHandler())
	front.Handle("/", mw.Wrap(proxy))
	s.front = newHTTPServer(cfg.listen, front, log)
	if cfg.adminListen != "" {
		admin := &ingress.Admin{Gatherer: reg, Rules: s.watcher, Ready: ready, Token: cfg.adminToken}
		s.admin = newHTTPServer(cfg.adminListen, admin.Handler(), log)
	}
	return s, nil
}

// openRedis connects to the Redis (or Redis Cluster, with addr= parameters) at rawURL.
func openRedis(rawURL string) (redis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, err
	}
	if u.Query().Has("addr") {
		opts, err := redis.ParseClusterURL(rawURL)
		if err != nil {
			return nil, err
		}
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, err
	}
	return redis.NewClient(opts), nil
}

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
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
}

// run serves until ctx is done, then shuts down gracefully.
func (s *server) run(ctx context.Context) error {
	defer s.close()
	servers := []*http.Server{s.front}
	if s.admin != nil {
		servers = append(servers, s.admin)
	}
	listeners := make([]net.Listener, len(servers))
	for i, hs := range servers {
		ln, err := net.Listen("tcp", hs.Addr)
		if err != nil {
			for _, l := range listeners[:i] {
				l.Close()
			}
			return err
		}
		listeners[i] = ln
	}
	errs := make(chan error, len(servers))
	for i, hs := range servers {
		go func() { errs <- hs.Serve(listeners[i]) }()
	}
	s.log.Info("sluice serving", "listen", listeners[0].Addr().String(), "admin", s.cfg.adminListen,
		"upstream", s.cfg.upstream, "limiter", s.limiterName(), "queues", s.natsName(),
		"rules", s.watcher.Set().Summary().String())

	dispatchCtx, stopDispatch := context.WithCancel(context.Background())
	defer stopDispatch()
	s.queues.dispatch(dispatchCtx)

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	var err error
wait:
	for {
		select {
		case <-hup: // reload the rules now, as well as on file changes
			if e := s.watcher.Reload(); e != nil {
				s.log.Warn("rules reload on SIGHUP refused", "err", e)
			}
		case set := <-s.reloads:
			declareCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			if e := s.queues.sync(declareCtx, set); e != nil {
				s.log.Error("queues of the new rules not declared", "err", e)
			}
			cancel()
		case <-ctx.Done():
			break wait
		case err = <-errs:
			break wait
		}
	}
	s.log.Info("shutting down", "timeout", s.cfg.shutdownTimeout)
	shutdownCtx, cancel := context.WithTimeout(context.Background(), s.cfg.shutdownTimeout)
	defer cancel()
	var wg sync.WaitGroup
	for _, hs := range servers {
		wg.Go(func() {
			if e := hs.Shutdown(shutdownCtx); e != nil {
				s.log.Warn("shutdown incomplete", "addr", hs.Addr, "err", e)
			}
		})
	}
	wg.Wait()
	// The front door is closed: no request can park any more. Let the dispatchers
	// finish the deliveries under way.
	stopDispatch()
	s.queues.wait()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

func (s *server) limiterName() string {
	if s.store != nil {
		return "redis"
	}
	return "memory"
}

func (s *server) natsName() string {
	if s.cfg.nats.url != "" {
		return "nats " + s.nats.nc.ConnectedUrlRedacted()
	}
	return "embedded nats in " + s.cfg.nats.dataDir
}

func (s *server) close() {
	if s.watcher != nil {
		s.watcher.Close()
	}
	if s.store != nil {
		s.store.Close()
	}
	if s.redis != nil {
		s.redis.Close()
	}
	s.nats.close()
}
