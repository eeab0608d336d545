package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/console"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/envoy"
	"github.com/sluicehq/sluice/ingress/h1"
	"github.com/sluicehq/sluice/ingress/proxyproto"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
)

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
	// frontFast serves the front door's listener with front as its fallback
	// (--fast-path); nil when net/http serves it alone.
	frontFast *h1.Server
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
	// Flags first, before anything is started.
	var upstream *url.URL
	var ids *ingress.ClientIdentity
	if mode.front || mode.rls {
		if upstream, ids, err = g.checkFront(); err != nil {
			return nil, err
		}
	} else if g.redis, err = openRedis(cfg.front.redis, log); err != nil {
		return nil, err
	}
	if !mode.rls {
		// check completes the NATS configuration (the queue key, the encryption key of
		// its file) in g.cfg, which the parts are made from.
		if err := g.cfg.nats.check(log); err != nil {
			return nil, err
		}
	}

	if err := g.listen(); err != nil {
		return nil, err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := g.watchRules(reg); err != nil {
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
	} else {
		if err := g.openQueues(reg); err != nil {
			return nil, err
		}
		if mode.front {
			if err := g.openFront(upstream, ids, reg); err != nil {
				return nil, err
			}
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

// checkFront checks the flags of the front door (serve, ingress) or of the Envoy
// services alone (rls) before anything is started: the upstream, the waits, the Envoy
// listeners, the client identity and the PROXY protocol peers. It makes the Redis
// client, which connects lazily: only the URL and the TLS files are checked.
func (g *gateway) checkFront() (upstream *url.URL, ids *ingress.ClientIdentity, err error) {
	cfg := g.cfg.front
	if g.mode.front {
		if cfg.upstream == "" {
			return nil, nil, errors.New("--upstream is required")
		}
		upstream, err = url.Parse(cfg.upstream)
		if err != nil || (upstream.Scheme != "http" && upstream.Scheme != "https") || upstream.Host == "" {
			return nil, nil, fmt.Errorf("--upstream %q: want an http:// or https:// URL", cfg.upstream)
		}
		if err := cfg.checkWaits(); err != nil {
			return nil, nil, err
		}
	}
	if err := g.cfg.envoy.check(g.mode); err != nil {
		return nil, nil, err
	}
	if ids, err = ingress.NewClientIdentity(strings.Split(cfg.trustedProxies, ","), cfg.ipv6Prefix,
		ingress.WithForwardedHeader(ingress.ForwardedHeader(cfg.forwarded))); err != nil {
		return nil, nil, fmt.Errorf("--trusted-proxies / --ipv6-prefix: %w", err)
	}
	if g.proxyProtocol, err = ingress.ParsePrefixes(strings.Split(cfg.proxyProtocol, ",")); err != nil {
		return nil, nil, fmt.Errorf("--proxy-protocol: %w", err)
	}
	if g.redis, err = openRedis(cfg.redis, g.log); err != nil {
		return nil, nil, err
	}
	return upstream, ids, nil
}

// watchRules loads the rules and watches them. Reloads declare first: a new set goes
// live once its queues are declared (see queues.prepare), on file changes and SIGHUP
// alike.
func (g *gateway) watchRules(reg *prometheus.Registry) error {
	var err error
	g.watcher, err = watch.New(strings.Split(g.cfg.rules, ","), watch.Options{Registerer: reg, Logger: g.log,
		MergeDomains: g.cfg.mergeDoms, OnReload: g.reloads.Observe,
		Prepare: func(s *rules.Set) error {
			if q := g.declaring.Load(); q != nil {
				return q.prepare(s)
			}
			return nil // before the queues exist: their first declaration takes the active set
		}})
	return err
}

// openQueues connects to NATS (starting the embedded server), makes the queues with
// their dispatchers when this process runs them, and declares the queues of the
// active rules once before serving.
func (g *gateway) openQueues(reg *prometheus.Registry) error {
	cfg := g.cfg
	natsCfg := cfg.nats
	natsCfg.maxBody = largestMaxBody(g.watcher.Set())
	var err error
	if g.nats, err = openNATS(natsCfg, g.log, true); err != nil {
		return &unusableError{err}
	}
	if g.nats.embedded != nil && cfg.nats.encryptionKey == "" {
		g.log.Warn("the data directory is not encrypted: parked requests, their headers (Authorization, Cookie…) and bodies are stored in clear in --data-dir; "+
			"give --encryption-key, SLUICE_ENCRYPTION_KEY or --encryption-key-file to encrypt it at rest", "data_dir", cfg.nats.dataDir)
	}
	var disp []dispatcher.Option
	if cfg.dispatch {
		disp = append(cfg.disp.options(), dispatcher.WithTracerProvider(cfg.tracing))
		if g.redis != nil {
			// Each flow key's pace lives in Redis, so a replica taking a queue over
			// keeps it (see dispatcher.WithFlowLimiter).
			store, err := g.redisLimiter(reg)
			if err != nil {
				return err
			}
			disp = append(disp, dispatcher.WithFlowLimiter(store))
		}
	}
	g.queues = newQueues(g.nats, disp, reg, g.log, g.watcher.Reload)
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
	return nil
}

// openFront makes the front door's server (frontDoor), which closes the deferrer's
// open waits at its shutdown, and the check endpoint's.
func (g *gateway) openFront(upstream *url.URL, ids *ingress.ClientIdentity, reg *prometheus.Registry) error {
	handler, err := g.frontDoor(upstream, ids, reg)
	if err != nil {
		return err
	}
	g.front = newHTTPServer(g.cfg.front.listen, handler, g.log)
	// Open waits and event streams answer what they have at once: Shutdown waits
	// for every handler.
	g.front.RegisterOnShutdown(g.deferrer.Close)
	if g.check != nil {
		g.check.RegisterOnShutdown(g.deferrer.Close)
	}
	return nil
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
	rest := mw.Wrap(proxy)
	mux.Handle("/", rest)
	return frontRoutes{mux: mux, rest: rest}, nil
}

// frontRoutes is the front door's ServeMux with its answer known in advance for
// most requests: a request whose path the mux would neither clean (a redirect) nor
// route to a ticket goes to rest, the handler of the mux's "/" pattern, without the
// mux's matching, which costs about half a microsecond a request.
type frontRoutes struct {
	mux  *http.ServeMux
	rest http.Handler
}

func (f frontRoutes) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if plainRoute(r) {
		f.rest.ServeHTTP(w, r)
		return
	}
	f.mux.ServeHTTP(w, r)
}

// plainRoute reports whether the front door's mux would hand r to its "/" pattern
// as it is: not CONNECT nor "*" (which the mux treats apart), a rooted path with no
// empty, "." or ".." segment (which it would clean and redirect; any segment
// beginning with "." is left to the mux), and a path outside /sluice/ (where the
// ticket routes are; r.URL.Path is the unescaped path, so an escaped spelling of
// them goes to the mux too).
func plainRoute(r *http.Request) bool {
	p := r.URL.EscapedPath()
	return r.Method != http.MethodConnect && r.RequestURI != "*" &&
		len(p) > 0 && p[0] == '/' && !strings.Contains(p, "//") && !strings.Contains(p, "/.") &&
		!strings.HasPrefix(r.URL.Path, "/sluice/")
}

// middleware builds the limiter and the middleware that decides on it: the front
// door's, which the Envoy services share (with their own flags). It adds the Redis
// dependency when limits live there. deferrer is nil where nothing can park.
func (g *gateway) middleware(ids *ingress.ClientIdentity, deferrer *deferral.Deferrer, reg *prometheus.Registry) (*ingress.Middleware, error) {
	cfg := g.cfg.front
	var store limiter.Limiter = limiter.NewMemory(limiter.WithMaxKeys(cfg.maxKeys))
	if g.redis != nil {
		rs, err := g.redisLimiter(reg)
		if err != nil {
			return nil, err
		}
		store = rs
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
	errs := g.serve()
	g.logStarted()

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
	g.shutdown(stopDispatch)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// serve starts serving on the addresses bound at the start (listen): the HTTP
// servers, and the Envoy gRPC server. The first of them to stop sends its error.
func (g *gateway) serve() <-chan error {
	var servers []*http.Server
	for _, hs := range []*http.Server{g.front, g.check, g.admin} {
		if hs != nil {
			servers = append(servers, hs)
		}
	}
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
		if hs == g.front && g.cfg.front.fastPath {
			g.frontFast = &h1.Server{Fallback: hs}
			go func() { errs <- g.frontFast.Serve(listeners[i]) }()
			continue
		}
		go func() { errs <- hs.Serve(listeners[i]) }()
	}
	if g.grpc != nil {
		go func() { errs <- g.grpc.Serve(g.grpcLn) }()
	}
	return errs
}

// logStarted logs the start-up line: the rules, where the queues live and every
// address served; then where the console is (logConsole).
func (g *gateway) logStarted() {
	attrs := []any{"rules", g.watcher.Set().Summary().String()}
	if g.nats != nil {
		attrs = append(attrs, "queues", g.nats.where)
	}
	if g.grpc != nil {
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
}

// shutdown stops gracefully within --shutdown-timeout: unready first, then the front
// door, the check endpoint, the gRPC server and the dispatchers (stopDispatch)
// together, the admin listener last.
func (g *gateway) shutdown(stopDispatch context.CancelFunc) {
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
	switch {
	case g.frontFast != nil:
		wg.Go(func() {
			if e := g.frontFast.Shutdown(shutdownCtx); e != nil {
				g.log.Warn("shutdown incomplete", "addr", g.front.Addr, "err", e)
			}
		})
	case g.front != nil:
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
