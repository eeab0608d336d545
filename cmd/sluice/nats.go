package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
)

// natsConfig says where the queues live: an embedded server (the default) or a NATS
// cluster. Every command that touches the queues (serve, ingress, dispatch, dlq) takes
// these flags, so that they all find the same JetStream.
type natsConfig struct {
	url      string
	dataDir  string
	listen   string
	creds    string
	token    string
	ca       string
	cert     string
	key      string
	replicas replicasFlag
	idemMax  sizeFlag
	queueKey string // --queue-key as given (base64)
	signKey  []byte // decoded by check

	// requireDurable: refuse to start on a NATS where acknowledged orders are not
	// durable, as far as a client can tell (queue.CheckDurability).
	requireDurable bool

	// The embedded server's listener: its clients' credentials, a token or TLS
	// client certificates (verified against listenCA).
	listenToken, listenCert, listenKey, listenCA string
	// The embedded server's store is encrypted at rest with this key (or the one in
	// encryptionKeyFile); check reads the file into encryptionKey.
	encryptionKey, encryptionKeyFile string

	// maxBody is the largest body a queue takes: the embedded server's max payload
	// makes room for it (0: NATS's default max payload).
	maxBody int64
}

// minSecretLen is the shortest token or encryption key taken: both guard everything
// parked, and a key can be attacked offline on a copy of the data directory.
const minSecretLen = 32

// flags registers the NATS flags; server adds --nats-listen, which only a long-running
// command's embedded server has use for.
func (c *natsConfig) flags(fs *pflag.FlagSet, server bool) {
	fs.StringVar(&c.url, "nats", "", "`URL`s of a NATS server or cluster with JetStream (comma-separated); empty: run an embedded server")
	fs.StringVar(&c.dataDir, "data-dir", "sluice-data", "`directory` of the embedded NATS server's JetStream files (one process at a time)")
	if server {
		fs.StringVar(&c.listen, "nats-listen", "", "`address` where the embedded NATS server accepts clients (for sluice dispatch, ingress and dlq elsewhere), who must give --nats-listen-token or a client certificate; empty: in-process only")
		fs.StringVar(&c.listenToken, "nats-listen-token", "", "`token` that clients of --nats-listen must give (--nats-token), at least 32 characters (best from SLUICE_NATS_LISTEN_TOKEN)")
		fs.StringVar(&c.listenCert, "nats-listen-cert", "", "certificate `file` of --nats-listen: clients must use TLS (with --nats-listen-key)")
		fs.StringVar(&c.listenKey, "nats-listen-key", "", "key `file` of --nats-listen-cert")
		fs.StringVar(&c.listenCA, "nats-listen-ca", "", "CA certificates `file`: clients of --nats-listen must present a certificate it signed (with --nats-listen-cert)")
	}
	fs.StringVar(&c.encryptionKey, "encryption-key", "", "`key` that encrypts the embedded NATS server's data directory at rest, at least 32 characters (best from SLUICE_ENCRYPTION_KEY or --encryption-key-file); without it parked orders are stored in clear")
	fs.StringVar(&c.encryptionKeyFile, "encryption-key-file", "", "`file` holding --encryption-key")
	fs.StringVar(&c.creds, "nats-creds", "", "NATS credentials `file` (JWT and nkey)")
	fs.StringVar(&c.token, "nats-token", "", "`token` for --nats, such as the --nats-listen-token of another sluice (best from SLUICE_NATS_TOKEN)")
	fs.StringVar(&c.ca, "nats-ca", "", "`file` of CA certificates that the NATS servers' TLS certificates are checked against")
	fs.StringVar(&c.cert, "nats-cert", "", "client certificate `file` for NATS TLS (with --nats-key)")
	fs.StringVar(&c.key, "nats-key", "", "client key `file` for NATS TLS")
	c.idemMax = queue.DefaultIdempotencyMaxBytes
	fs.Var(&c.idemMax, "idempotency-max-bytes", "cap of the idempotency key bucket (and of each queue's key stream), in bytes or with a unit (256MiB); new keys past 90% of it get 503; 0: no cap")
	fs.StringVar(&c.queueKey, "queue-key", "", "`base64` of the secret (at least 32 bytes) that signs parked orders and ticket records; every process sharing the queues needs the same one; required with --nats; empty with the embedded server: generated once and kept in DATA_DIR/"+queueKeyFile)
	fs.BoolVar(&c.requireDurable, "require-durable", false, "with --nats: refuse to start when sluice can tell that orders acknowledged there are not durable (memory storage, one replica on a cluster; a server's sync_interval is not visible to a client: check /varz on its monitoring port); without it that is a warning")
	fs.Var(&c.replicas, "replicas", "stream replicas of the queues, 1 to 5, or auto: 3 on a NATS cluster, 1 on a single server or the embedded one")
}

// replicasFlag is --replicas: a stream replica count from 1 to 5 (JetStream's most),
// or 0, written auto (0 is taken too): decided by where the queues live.
type replicasFlag int

func (r *replicasFlag) Set(v string) error {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, "auto") {
		*r = 0
		return nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > 5 {
		return errors.New("want auto or a count from 1 to 5")
	}
	*r = replicasFlag(n)
	return nil
}

func (r *replicasFlag) String() string {
	if *r == 0 {
		return "auto"
	}
	return strconv.Itoa(int(*r))
}

// Type names the kind of value in the help (--replicas replicas).
func (r *replicasFlag) Type() string { return "replicas" }

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

// natsConn is an open connection to the queues' NATS, and the embedded server when
// there is one.
type natsConn struct {
	nc       *nats.Conn
	key      []byte // signs the queues' messages and records
	embedded *embedded.Server
	unlock   func() // releases --data-dir
	replicas int    // --replicas; 0: decided by what the connection reaches
	idemMax  int64  // --idempotency-max-bytes
	where    string // for logs: "embedded nats in DIR" or the server URLs
	lastErr  *atomic.Pointer[error]
}

// The liveness check of sluice's NATS connections (see natsOptions).
const (
	natsPingInterval = 2 * time.Second
	natsMaxPingsOut  = 2
)

// inProcess names the embedded server's connection in logs and the status.
const inProcess = "embedded (in process)"

// openNATS connects to the queues' NATS. With --nats and background, a server that
// cannot be reached yet is no error: the connection keeps trying in the background
// (a long-running command must outlive a NATS rollout); without background (a
// one-shot command) it is.
func openNATS(cfg natsConfig, log *slog.Logger, background bool) (*natsConn, error) {
	lastErr := new(atomic.Pointer[error]) // of the latest failed connection attempt
	opts := natsOptions(cfg, log, background, lastErr)
	if cfg.url != "" {
		nc, err := nats.Connect(cfg.url, opts...)
		if err != nil {
			return nil, fmt.Errorf("--nats: %w", err)
		}
		if !nc.IsConnected() {
			log.Warn("NATS not reachable yet; connecting in the background (defers answer 503 meanwhile)", "nats", redactURLs(cfg.url))
		}
		conn := &natsConn{nc: nc, key: cfg.signKey, replicas: int(cfg.replicas), idemMax: int64(cfg.idemMax), where: "nats " + redactURLs(cfg.url), lastErr: lastErr}
		if err := conn.checkDurable(log, cfg.requireDurable); err != nil {
			nc.Close()
			return nil, err
		}
		return conn, nil
	}
	return openEmbedded(cfg, log, opts, lastErr)
}

// natsOptions are the options of sluice's NATS connections: liveness, endless
// reconnection without buffering, credentials and TLS, and logs of the connection's
// changes. lastErr keeps the error of the latest failed attempt (nil once connected).
func natsOptions(cfg natsConfig, log *slog.Logger, background bool, lastErr *atomic.Pointer[error]) []nats.Option {
	// The embedded server is reached in process: its URL (no listener) says nothing.
	server := func(nc *nats.Conn) string {
		if cfg.url == "" {
			return inProcess
		}
		return nc.ConnectedUrlRedacted()
	}
	opts := []nats.Option{
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				lastErr.Store(&err)
			}
		}),
		nats.Name("sluice"),
		// A server that stops answering with the connection up (SIGSTOP, a stuck host,
		// a partition that drops packets) is left for another node after at most
		// natsPingInterval × (natsMaxPingsOut + 1), 6 s: nats.go's default (2 min × 2)
		// kept a replica on it, refusing defers, for the whole fault.
		nats.PingInterval(natsPingInterval),
		nats.MaxPingsOutstanding(natsMaxPingsOut),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		nats.ReconnectBufSize(-1), // never buffer publishes: a 202 needs a real ack
		nats.RetryOnFailedConnect(background),
		nats.ConnectHandler(func(nc *nats.Conn) {
			lastErr.Store(nil)
			log.Info("NATS connected", "server", server(nc))
		}),
		// A nil error is a disconnection sluice asked for (Drain or Close at a stop),
		// not trouble: only a lost connection is worth a warning.
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				log.Debug("NATS connection closed")
				return
			}
			log.Warn("NATS disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			lastErr.Store(nil)
			log.Info("NATS reconnected", "server", server(nc))
		}),
	}
	if cfg.creds != "" {
		opts = append(opts, nats.UserCredentials(cfg.creds))
	}
	if cfg.token != "" {
		opts = append(opts, nats.Token(cfg.token))
	}
	if cfg.ca != "" {
		opts = append(opts, nats.RootCAs(cfg.ca))
	}
	if cfg.cert != "" || cfg.key != "" {
		opts = append(opts, nats.ClientCert(cfg.cert, cfg.key))
	}
	return opts
}

// openEmbedded locks --data-dir, starts the embedded server in it with the queue key
// kept there (or --queue-key) and connects to it in process with opts.
func openEmbedded(cfg natsConfig, log *slog.Logger, opts []nats.Option, lastErr *atomic.Pointer[error]) (*natsConn, error) {
	// nats-server does not guard its store directory: two processes on one directory
	// would corrupt each other's files. The lock is released by the kernel when the
	// process dies, so a restart after kill -9 finds it free.
	unlock, err := lockDataDir(cfg.dataDir)
	if err != nil {
		return nil, err
	}
	key := cfg.signKey
	if key == nil {
		if key, err = loadQueueKey(cfg.dataDir); err != nil {
			unlock()
			return nil, err
		}
	} else if kept, err := readQueueKey(filepath.Join(cfg.dataDir, queueKeyFile)); err == nil && !bytes.Equal(kept, key) {
		log.Warn("--queue-key differs from the key kept in --data-dir: orders parked under that key will be dead-lettered as forged",
			"file", filepath.Join(cfg.dataDir, queueKeyFile))
	}
	listenTLS, err := cfg.listenTLS()
	if err != nil {
		unlock()
		return nil, err
	}
	emb, err := embedded.Start(embedded.Config{DataDir: cfg.dataDir, Listen: cfg.listen,
		Token: cfg.listenToken, TLS: listenTLS, EncryptionKey: cfg.encryptionKey, MaxPayload: embeddedPayload(cfg.maxBody),
		RecoveryLogger: log})
	if errors.Is(err, embedded.ErrEncryptionKey) {
		unlock()
		return nil, fmt.Errorf("embedded NATS in --data-dir %s: %w; give the key it was written with in --encryption-key, SLUICE_ENCRYPTION_KEY or --encryption-key-file", cfg.dataDir, err)
	}
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
	return &natsConn{nc: nc, key: key, embedded: emb, unlock: unlock, replicas: cmp.Or(int(cfg.replicas), 1), idemMax: int64(cfg.idemMax), where: where, lastErr: lastErr}, nil
}

// redactURLs returns comma-separated URLs with their passwords masked, for logs.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}

// replicaCount returns the stream replica count of the queues: --replicas, else R3 on
// a cluster (a single server reports no cluster name) and R1 on a lone server such as
// another sluice's embedded one, since a count the server cannot hold makes every
// declaration fail. It is known once connected.
func (c *natsConn) replicaCount() (int, error) {
	if c.replicas != 0 {
		return c.replicas, nil
	}
	if !c.nc.IsConnected() {
		return 0, c.notConnected()
	}
	if c.nc.ConnectedClusterName() != "" {
		return 3, nil
	}
	return 1, nil
}

// errNotDurable: --require-durable, and acknowledged orders would not be durable.
var errNotDurable = errors.New("--require-durable: acknowledged orders would not be durable on this NATS")

// checkDurable tells what sluice can tell of the durability of acknowledged orders on
// its --nats (queue.CheckDurability): one warning naming every problem, and what it
// could not check, at debug level. With require it returns errNotDurable on a
// problem, and an error when it cannot check at all (not connected). Without require
// a connection that is not up yet is checked once it is.
func (c *natsConn) checkDurable(log *slog.Logger, require bool) error {
	check := func() error {
		replicas, err := c.replicaCount()
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		d, err := queue.CheckDurability(ctx, c.nc, replicas)
		if err != nil {
			return err
		}
		log.Debug("NATS durability", "server_version", d.Version, "cluster", d.Cluster, "servers", d.Servers,
			"domain", d.Domain, "not_known", d.Unknown)
		if len(d.Problems) == 0 {
			return nil
		}
		if require {
			return fmt.Errorf("%w: %s", errNotDurable, strings.Join(d.Problems, "; "))
		}
		log.Warn("orders answered 202 on this NATS may be lost in a crash of its hosts", "problems", d.Problems)
		return nil
	}
	if require {
		if err := check(); err != nil {
			return fmt.Errorf("--require-durable: %w", err)
		}
		return nil
	}
	go func() {
		// Polled, so that the goroutine ends with the connection (Close) at once.
		next := time.Now()
		for wait := time.Second; !c.nc.IsClosed(); time.Sleep(100 * time.Millisecond) {
			if !c.nc.IsConnected() || time.Now().Before(next) {
				continue
			}
			err := check()
			if err == nil || errors.Is(err, errNotDurable) {
				return
			}
			log.Debug("cannot check the durability of NATS yet", "err", err)
			next, wait = time.Now().Add(wait), min(2*wait, time.Minute)
		}
	}()
	return nil
}

// errNotConnected: the connection to NATS is not up (yet).
var errNotConnected = errors.New("not connected to NATS")

// notConnected returns errNotConnected with the connection's last error (refused,
// authorization violation…), so that the log and the status say why.
func (c *natsConn) notConnected() error {
	err := c.nc.LastError()
	if p := c.lastErr.Load(); p != nil {
		err = *p
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errNotConnected, err)
	}
	return errNotConnected
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
