package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
)

// natsConfig says where the queues live: an embedded server (the default) or a NATS
// cluster. Every command that touches the queues (serve, ingress, dispatch, dlq) takes
// these flags, so that they all find the same JetStream.
type natsConfig struct {
	url      string
	dataDir  string
	listen   string
	creds    string
	ca       string
	cert     string
	key      string
	replicas int
}

// flags registers the NATS flags; server adds --nats-listen, which only a long-running
// command's embedded server has use for.
func (c *natsConfig) flags(fs *flag.FlagSet, server bool) {
	fs.StringVar(&c.url, "nats", "", "`URL`s of a NATS server or cluster with JetStream (comma-separated); empty: run an embedded server")
	fs.StringVar(&c.dataDir, "data-dir", "sluice-data", "`directory` of the embedded NATS server's JetStream files (one process at a time)")
	if server {
		fs.StringVar(&c.listen, "nats-listen", "", "`address` where the embedded NATS server accepts clients (for sluice dispatch, ingress and dlq elsewhere); empty: in-process only")
	}
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials `file` (JWT and nkey)")
	fs.StringVar(&c.ca, "nats-ca", "", "`file` of CA certificates that the NATS servers' TLS certificates are checked against")
	fs.StringVar(&c.cert, "nats-cert", "", "client certificate `file` for NATS TLS (with --nats-key)")
	fs.StringVar(&c.key, "nats-key", "", "client key `file` for NATS TLS")
	fs.IntVar(&c.replicas, "replicas", 0, "stream `replicas` of the queues: 0 means 3 on a NATS cluster, 1 on a single server or the embedded one")
}

// natsConn is an open connection to the queues' NATS, and the embedded server when
// there is one.
type natsConn struct {
	nc       *nats.Conn
	embedded *queue.Embedded
	unlock   func() // releases --data-dir
	replicas int
	where    string // for logs: "embedded nats in DIR" or the server URL
}

func openNATS(cfg natsConfig, log *slog.Logger) (*natsConn, error) {
	opts := []nats.Option{
		nats.Name("sluice"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // never buffer publishes: a 202 needs a real ack
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted()) }),
	}
	if cfg.creds != "" {
		opts = append(opts, nats.UserCredentials(cfg.creds))
	}
	if cfg.ca != "" {
		opts = append(opts, nats.RootCAs(cfg.ca))
	}
	if cfg.cert != "" || cfg.key != "" {
		opts = append(opts, nats.ClientCert(cfg.cert, cfg.key))
	}
	if cfg.url != "" {
		nc, err := nats.Connect(cfg.url, opts...)
		if err != nil {
			return nil, fmt.Errorf("--nats: %w", err)
		}
		// A replica count the server cannot hold makes every declaration fail, so the
		// default follows what we are connected to: R3 on a cluster (a single server
		// reports no cluster name), R1 on a lone server such as another sluice's
		// embedded one.
		replicas := cfg.replicas
		if replicas == 0 {
			replicas = 1
			if nc.ConnectedClusterName() != "" {
				replicas = 3
			}
		}
		return &natsConn{nc: nc, replicas: replicas, where: "nats " + nc.ConnectedUrlRedacted()}, nil
	}
	// nats-server does not guard its store directory: two processes on one directory
	// would corrupt each other's files. The lock is released by the kernel when the
	// process dies, so a restart after kill -9 finds it free.
	unlock, err := lockDataDir(cfg.dataDir)
	if err != nil {
		return nil, err
	}
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: cfg.dataDir, Listen: cfg.listen})
	if err != nil {
		unlock()
		return nil, fmt.Errorf("embedded NATS in --data-dir %s: %w", cfg.dataDir, err)
	}
	nc, err := emb.Connect(opts...)
	if err != nil {
		emb.Shutdown()
		unlock()
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	where := "embedded nats in " + cfg.dataDir
	if u := emb.ClientURL(); u != "" {
		where += " listening on " + u
	}
	return &natsConn{nc: nc, embedded: emb, unlock: unlock, replicas: cmpOr(cfg.replicas, 1), where: where}, nil
}

func cmpOr(v, fallback int) int {
	if v != 0 {
		return v
	}
	return fallback
}

// ready is the NATS readiness check of /readyz.
func (c *natsConn) ready(context.Context) error {
	if !c.nc.IsConnected() {
		return errors.New("not connected to NATS")
	}
	return nil
}

// close drains the connection (pending acknowledgements go out), stops the embedded
// server and releases the data directory.
func (c *natsConn) close() {
	if c == nil {
		return
	}
	if err := c.nc.Drain(); err != nil {
		c.nc.Close()
	}
	for c.nc.IsDraining() {
		time.Sleep(10 * time.Millisecond)
	}
	if c.embedded != nil {
		c.embedded.Shutdown()
	}
	if c.unlock != nil {
		c.unlock()
	}
}

// dispatchConfig tunes the dispatchers of serve and dispatch.
type dispatchConfig struct {
	deliveryTimeout time.Duration
	ackWait         time.Duration
	pinnedTTL       time.Duration
}

func (c *dispatchConfig) flags(fs *flag.FlagSet) {
	fs.DurationVar(&c.deliveryTimeout, "delivery-timeout", 30*time.Second, "how long one delivery attempt may take; longer is a failed attempt")
	fs.DurationVar(&c.ackWait, "ack-wait", 0, "how long a message taken by a dispatcher that went silent (crashed) waits before another one delivers it; 0: delivery timeout + 30s")
	fs.DurationVar(&c.pinnedTTL, "failover-after", 10*time.Second, "how long a queue stays with a dispatcher that stopped asking for messages before another replica takes it over")
}

func (c dispatchConfig) options() []dispatcher.Option {
	opts := []dispatcher.Option{dispatcher.WithDeliveryTimeout(c.deliveryTimeout), dispatcher.WithPinnedTTL(c.pinnedTTL)}
	if c.ackWait > 0 {
		opts = append(opts, dispatcher.WithAckWait(c.ackWait))
	}
	return opts
}

// queues keeps the declared queues in step with the rules, and, when it has a
// dispatcher, drains each one.
type queues struct {
	store    *queue.Store
	replicas int
	disp     *dispatcher.Dispatcher // nil: park only
	log      *slog.Logger

	mu      sync.Mutex
	ctx     context.Context // dispatchers run until it ends
	running map[string]bool
	wg      sync.WaitGroup
}

// newQueues opens the queue store on c and, unless disp is nil, a dispatcher with
// those options.
func newQueues(c *natsConn, disp []dispatcher.Option, reg prometheus.Registerer, log *slog.Logger) (*queues, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var limit int64 // a cluster's account limit, if any, is read by Open
	if c.embedded != nil {
		limit = c.embedded.MaxStore()
	}
	store, err := queue.Open(ctx, c.nc, queue.WithReplicas(c.replicas), queue.WithRegisterer(reg), queue.WithLogger(log),
		queue.WithStoreLimit(limit))
	if err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	q := &queues{store: store, replicas: c.replicas, log: log}
	if disp != nil {
		opts := append([]dispatcher.Option{dispatcher.WithRegisterer(reg), dispatcher.WithLogger(log)}, disp...)
		if q.disp, err = dispatcher.New(store, opts...); err != nil {
			return nil, fmt.Errorf("dispatcher: %w", err)
		}
	}
	return q, nil
}

// sync declares every queue of set (creating or updating its stream) and starts a
// dispatcher for each new one. It returns every declaration error at once.
func (q *queues) sync(ctx context.Context, set *rules.Set) error {
	var errs []error
	for _, rq := range set.Queues() {
		cfg := rq.Config
		cfg.Replicas = q.replicas // where the queues live decides, not the rules file
		if _, err := q.store.Declare(ctx, cfg); err != nil {
			errs = append(errs, fmt.Errorf("queue %s: %w", rq.Name, err))
			continue
		}
		q.startDispatching(rq.Name)
	}
	return errors.Join(errs...)
}

func (q *queues) startDispatching(name string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.disp == nil || q.ctx == nil || q.running[name] {
		return
	}
	q.running[name] = true
	q.log.Info("dispatching", "queue", name)
	q.wg.Go(func() {
		if err := q.disp.Run(q.ctx, name); err != nil {
			q.log.Error("dispatcher stopped", "queue", name, "err", err)
		}
	})
}

// dispatch starts the dispatchers of the declared queues, and of queues declared
// later, until ctx ends. Without a dispatcher it does nothing.
func (q *queues) dispatch(ctx context.Context) {
	q.mu.Lock()
	q.ctx, q.running = ctx, map[string]bool{}
	q.mu.Unlock()
	for _, dq := range q.store.Queues() {
		q.startDispatching(dq.Name())
	}
}

// wait waits until the dispatchers have finished the deliveries under way (after the
// context of dispatch ended), or until ctx ends. It reports whether they finished.
func (q *queues) wait(ctx context.Context) bool {
	done := make(chan struct{})
	go func() {
		q.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}
