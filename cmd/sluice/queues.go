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
// cluster.
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

func (c *natsConfig) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "nats", "", "`URL`s of a NATS cluster with JetStream (comma-separated); empty: run an embedded server")
	fs.StringVar(&c.dataDir, "data-dir", "sluice-data", "`directory` of the embedded NATS server's JetStream files")
	fs.StringVar(&c.listen, "nats-listen", "", "`address` where the embedded NATS server accepts clients (for sluice dlq, dispatch); empty: in-process only")
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials `file` (JWT and nkey)")
	fs.StringVar(&c.ca, "nats-ca", "", "`file` of CA certificates that the NATS servers' TLS certificates are checked against")
	fs.StringVar(&c.cert, "nats-cert", "", "client certificate `file` for NATS TLS (with --nats-key)")
	fs.StringVar(&c.key, "nats-key", "", "client key `file` for NATS TLS")
	fs.IntVar(&c.replicas, "replicas", 0, "stream `replicas` of the queues: 0 means 1 with the embedded server, 3 with --nats")
}

// natsConn is an open connection to the queues' NATS, and the embedded server when
// there is one.
type natsConn struct {
	nc       *nats.Conn
	embedded *queue.Embedded
	replicas int
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
		return &natsConn{nc: nc, replicas: cmpOr(cfg.replicas, 3)}, nil
	}
	emb, err := queue.StartEmbedded(queue.EmbeddedConfig{DataDir: cfg.dataDir, Listen: cfg.listen})
	if err != nil {
		return nil, fmt.Errorf("embedded NATS in --data-dir %s: %w", cfg.dataDir, err)
	}
	nc, err := emb.Connect(opts...)
	if err != nil {
		emb.Shutdown()
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	return &natsConn{nc: nc, embedded: emb, replicas: cmpOr(cfg.replicas, 1)}, nil
}

func cmpOr(v, fallback int) int {
	if v != 0 {
		return v
	}
	return fallback
}

// close drains the connection (pending acknowledgements go out) and stops the
// embedded server.
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
}

// queueConfig is a rules queue as the queue package runs it.
func queueConfig(q *rules.Queue, replicas int) queue.Config {
	return queue.Config{
		Name:        q.Name,
		Outflow:     q.Outflow,
		MaxDepth:    q.MaxDepth,
		MaxBytes:    q.MaxBytes,
		MaxAge:      q.MaxAge,
		MaxAttempts: q.MaxAttempts,
		MaxInFlight: q.MaxInFlight,
		Backoff:     q.Backoff,
		Downstream:  q.Downstream.String(),
		Replicas:    replicas,
	}
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

// newQueues opens the queue store on c and, with dispatch, a dispatcher.
func newQueues(c *natsConn, dispatch bool, reg prometheus.Registerer, log *slog.Logger) (*queues, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := queue.Open(ctx, c.nc, queue.WithReplicas(c.replicas), queue.WithRegisterer(reg), queue.WithLogger(log))
	if err != nil {
		return nil, fmt.Errorf("queues: %w", err)
	}
	q := &queues{store: store, replicas: c.replicas, log: log}
	if dispatch {
		if q.disp, err = dispatcher.New(store, dispatcher.WithRegisterer(reg), dispatcher.WithLogger(log)); err != nil {
			return nil, err
		}
	}
	return q, nil
}

// sync declares every queue of set (creating or updating its stream) and starts a
// dispatcher for each new one. It returns every declaration error at once.
func (q *queues) sync(ctx context.Context, set *rules.Set) error {
	var errs []error
	for _, rq := range set.Queues() {
		if _, err := q.store.Declare(ctx, queueConfig(rq, q.replicas)); err != nil {
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
	q.wg.Go(func() {
		if err := q.disp.Run(q.ctx, name); err != nil {
			q.log.Error("dispatcher stopped", "queue", name, "err", err)
		}
	})
}

// dispatch starts the dispatchers of the declared queues, and of queues declared
// later, until ctx ends; wait waits for them to finish their deliveries.
func (q *queues) dispatch(ctx context.Context) {
	q.mu.Lock()
	q.ctx, q.running = ctx, map[string]bool{}
	q.mu.Unlock()
	for _, dq := range q.store.Queues() {
		q.startDispatching(dq.Name())
	}
}

func (q *queues) wait() { q.wg.Wait() }
