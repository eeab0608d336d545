// Package embedded runs NATS with JetStream inside the process: the single-node
// queue store of `sluice serve` when no NATS URL is given. It is a package of its own
// so that programs that use the queue package with an external NATS do not link the
// NATS server.
package embedded

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue"
)

// Errors of Start that callers branch on.
var (
	// ErrUnauthenticated: a listener was asked for without a token or verified TLS
	// client certificates. Whoever reaches an open listener reads, forges and erases
	// parked orders, so there is none.
	ErrUnauthenticated = errors.New("queue: a NATS listener needs a token or TLS client certificates")
	// ErrEncryptionKey: the data directory is encrypted at rest and no key, or not
	// the key it was written with, was given.
	ErrEncryptionKey = errors.New("queue: the encryption key of the data directory is missing or wrong")
)

// Config configures the in-process NATS server of `sluice serve`.
type Config struct {
	// DataDir is where JetStream keeps its files (required).
	DataDir string
	// Listen is a host:port for NATS clients, for example "127.0.0.1:4222". Empty: no
	// listener at all; only in-process connections (Connect) reach the server. A
	// listener requires Token, or TLS that verifies client certificates.
	Listen string
	// Token, when set, is required from every client, in-process ones too (Connect
	// gives it).
	Token string
	// TLS, when set, is the listener's TLS: clients must use it. With ClientAuth
	// tls.RequireAndVerifyClientCert (and ClientCAs) a client certificate is the
	// client's credential. In-process connections do not use TLS.
	TLS *tls.Config
	// EncryptionKey, when set, encrypts the JetStream store at rest with the server's
	// own cipher (ChaCha20-Poly1305; keys derived from it per stream). A directory
	// written in clear is encrypted when opened with a key; one written with a key
	// cannot be opened without it (ErrEncryptionKey).
	EncryptionKey string
	// ServerName names the server (default "sluice").
	ServerName string
	// MaxPayload is the largest message (headers and body) accepted, in bytes
	// (default: the server's 1 MiB).
	MaxPayload int32
	// MaxStore caps JetStream file storage in bytes (default: the server's choice, based
	// on the free disk space).
	MaxStore int64
	// Logger receives the server's log lines; nil keeps the server quiet.
	Logger *slog.Logger
	// RecoveryLogger receives what the server's supervision does: JetStream restarted
	// after a write error (see Server). Nil: slog.Default().
	RecoveryLogger *slog.Logger
	// Debug adds the server's debug lines (with Logger).
	Debug bool
	// ReadyTimeout bounds the start-up (default 30s; JetStream recovers its files first).
	ReadyTimeout time.Duration
}

// Server is a running in-process NATS server with JetStream. Every write to a stream
// is synced to disk before it is acknowledged (SyncAlways): a single node has no replica
// to fall back on, so an acknowledged message survives a crash of the process or the
// machine.
//
// A stream or consumer whose write fails (a full disk: ENOSPC) stops: nats-server
// 2.15 answers none of its requests again until JetStream restarts, leaving that to
// an operator. The Server does it: once a write error has been reported and the disk
// has queue.DiskReserve free again (the room the queue package keeps before it takes
// new orders), it restarts JetStream in the running server, which reopens every
// file stream and consumer from its files, synced up to the last acknowledged write
// (memory streams, such as the queues' key slots, come back empty: their clients' key
// caps count afresh). Clients are disconnected for the restart, and their logins
// held until it is done (see loginGate); they reconnect by themselves. A restart that
// opens fewer streams than the directory holds turns JetStream off again, as Start
// refuses to start then, rather than let a queue be declared anew, empty, over files
// the server did not load.
type Server struct {
	srv     *server.Server
	gate    *loginGate // and the token
	dataDir string
	log     *slog.Logger

	jetStream    server.JetStreamConfig // as Start's server began, for restarts
	writeFailed  atomic.Bool            // a write error reported since JetStream last started
	quit         chan struct{}
	stopWatching sync.Once
	watching     sync.WaitGroup
}

// recoverEvery is how often a Server whose store reported a write error looks at the
// free disk space.
const recoverEvery = time.Second

// ErrDiskFreeUnknown: DiskFree has no figure on this system.
var ErrDiskFreeUnknown = errors.New("queue: the free disk space is not known on this system")

// Start starts the server and waits until it accepts connections.
func Start(cfg Config) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("queue: embedded NATS needs a data directory")
	}
	if cfg.Listen != "" && cfg.Token == "" && (cfg.TLS == nil || cfg.TLS.ClientAuth != tls.RequireAndVerifyClientCert) {
		return nil, ErrUnauthenticated
	}
	// nats-server skips a stream it cannot decrypt and starts without it; sluice would
	// then declare the queue again, empty, over the old files. So a key that is
	// missing is found before the start, and a wrong one by counting what loaded.
	stored, encrypted := storedStreams(cfg.DataDir)
	if cfg.EncryptionKey == "" && encrypted > 0 {
		return nil, fmt.Errorf("%w: %d of its %d streams are encrypted at rest, and no key was given", ErrEncryptionKey, encrypted, stored)
	}
	opts := &server.Options{
		ServerName:      cfg.ServerName,
		JetStream:       true,
		StoreDir:        cfg.DataDir,
		SyncAlways:      true,
		SyncInterval:    2 * time.Minute,
		NoSigs:          true,
		NoLog:           cfg.Logger == nil,
		MaxPayload:      cfg.MaxPayload,
		Debug:           cfg.Debug,
		JetStreamKey:    cfg.EncryptionKey,
		JetStreamCipher: server.ChaCha,
	}
	if cfg.TLS != nil {
		opts.TLS, opts.TLSConfig = true, cfg.TLS
		opts.TLSVerify = cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	}
	if opts.ServerName == "" {
		opts.ServerName = "sluice"
	}
	if cfg.MaxStore > 0 {
		opts.JetStreamMaxStore = cfg.MaxStore
	}
	if cfg.Listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(cfg.Listen)
		if err != nil {
			return nil, fmt.Errorf("queue: embedded NATS listen address %q: %w", cfg.Listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("queue: embedded NATS listen port %q: %w", port, err)
		}
		opts.Host, opts.Port = host, p
		if p == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	gate := &loginGate{token: cfg.Token}
	opts.CustomClientAuthentication = gate
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("queue: embedded NATS: %w", err)
	}
	e := &Server{srv: srv, gate: gate, dataDir: cfg.DataDir, log: cfg.RecoveryLogger, quit: make(chan struct{})}
	if e.log == nil {
		e.log = slog.Default()
	}
	// The server's log is its only report of a write error, so it is always read.
	logs := logAdapter{writeFailed: e.noteWriteError}
	if cfg.Logger != nil {
		logs.l = cfg.Logger.With("component", "nats-server")
	}
	srv.SetLoggerV2(logs, cfg.Debug && cfg.Logger != nil, false, false)
	srv.Start()
	timeout := cfg.ReadyTimeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	if !srv.ReadyForConnections(timeout) {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, fmt.Errorf("queue: embedded NATS not ready after %s", timeout)
	}
	if !srv.JetStreamEnabled() {
		srv.Shutdown()
		srv.WaitForShutdown()
		return nil, errors.New("queue: embedded NATS started without JetStream")
	}
	if loaded := srv.GlobalAccount().JetStreamUsage().Streams; loaded < stored {
		srv.Shutdown()
		srv.WaitForShutdown()
		if encrypted > 0 {
			return nil, fmt.Errorf("%w: %d of its %d streams do not open with the key given", ErrEncryptionKey, stored-loaded, stored)
		}
		return nil, fmt.Errorf("queue: embedded NATS opened %d of the %d streams in %s; refusing to start without the others", loaded, stored, cfg.DataDir)
	}
	e.jetStream = *srv.JetStreamConfig()
	e.jetStream.StoreDir = cfg.DataDir // EnableJetStream adds its "jetstream" directory again
	e.watching.Go(e.recoverWrites)
	return e, nil
}

// recoverWrites restarts JetStream once a write error was reported and the disk has
// the reserve free again, until Shutdown.
func (e *Server) recoverWrites() {
	t := time.NewTicker(recoverEvery)
	defer t.Stop()
	// Restarts follow one another no sooner than wait, which doubles up to a minute
	// while they keep failing or write errors keep coming back (a disk that fails
	// writes with room to spare), and starts afresh once the store went a minute
	// without one.
	var restartedAt time.Time
	wait := recoverEvery
	for {
		select {
		case <-e.quit:
			return
		case <-t.C:
		}
		if !e.writeFailed.Load() || time.Since(restartedAt) < wait {
			continue
		}
		if free, err := e.DiskFree(); err != nil || free < queue.DiskReserve(e.jetStream.MaxStore) {
			continue
		}
		if time.Since(restartedAt) > wait+time.Minute {
			wait = recoverEvery
		}
		err := e.restartJetStream()
		restartedAt, wait = time.Now(), min(2*wait, time.Minute)
		if err != nil {
			e.writeFailed.Store(true)
			e.log.Error("embedded NATS: JetStream not restarted after a write error; new orders are refused until it is", "err", err, "retry_in", wait)
		}
	}
}

// noteWriteError records a write error the server reported (line), and says so once
// until JetStream restarts.
func (e *Server) noteWriteError(line string) {
	if e.writeFailed.CompareAndSwap(false, true) {
		e.log.Error("embedded NATS: a write to the store failed; JetStream restarts once the disk has the reserve free", "err", line)
	}
}

// restartJetStream restarts JetStream (or starts it, off after a failed restart) with
// the configuration it started with, and turns it off again when it opens fewer
// streams than the data directory holds.
func (e *Server) restartJetStream() error {
	stored, _ := storedStreams(e.dataDir)
	e.log.Warn("embedded NATS: the store met a write error and the disk has room again; restarting JetStream", "data_dir", e.dataDir)
	start := time.Now()
	e.writeFailed.Store(false)
	e.gate.restarting.Lock()
	defer e.gate.restarting.Unlock()
	if err := e.disconnectClients(); err != nil {
		return err // tried again later (see recoverWrites)
	}
	if err := e.srv.ShutdownJetStream(); err != nil {
		return fmt.Errorf("shut JetStream down: %w", err)
	}
	cfg := e.jetStream
	if err := e.srv.EnableJetStream(&cfg); err != nil {
		return fmt.Errorf("start JetStream: %w", err)
	}
	if loaded := e.srv.GlobalAccount().JetStreamUsage().Streams; loaded < stored {
		_ = e.srv.ShutdownJetStream()
		return fmt.Errorf("opened %d of the %d streams in %s; JetStream is off", loaded, stored, e.dataDir)
	}
	e.log.Info("embedded NATS: JetStream restarted", "streams", stored, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// loginGate is the server's client authentication: the token, when there is one,
// and a hold on every login while JetStream restarts. nats-server answers JetStream's
// API as soon as a restart begins, before it has reopened the streams and consumers
// from their files: a client asking then is told that a stream or consumer does not
// exist, and one that declares it anew on that answer (a dispatcher setting its
// consumer up again, a queue declared on a reload) makes a second store over the
// files being reopened (a probe that did left one running on the stream's
// directory), or a consumer in place of the one being reopened with its state. So no
// client is connected during a restart: the restart disconnects them all, and a login
// waits until the restart is done.
type loginGate struct {
	token      string
	restarting sync.RWMutex // held by a restart
}

// Check implements server.Authentication.
func (g *loginGate) Check(c server.ClientAuthentication) bool {
	g.restarting.RLock()
	g.restarting.RUnlock() //nolint:staticcheck // an empty section: it waits out a restart
	if g.token == "" {
		return true // no listener, or one whose TLS verified the client's certificate
	}
	return subtle.ConstantTimeCompare([]byte(c.GetOpts().Token), []byte(g.token)) == 1
}

// disconnectClients closes every client connection (they reconnect by themselves)
// and returns once what they had sent is done, as far as the server's counts tell: the
// messages from clients and the requests to JetStream's API in flight stood still for
// drainQuiet. A connection closed while the server reads from it still has its last
// read processed, maybe such a request, which nats-server would otherwise serve while
// it sets that API up again. (The count of requests in flight is not a count after a
// restart: requests a restart overtook are counted off the next JetStream's. Its
// standing still is what says that the queued requests have been served; one that
// takes longer than drainQuiet to serve is not waited for.)
func (e *Server) disconnectClients() error {
	conns, err := e.srv.Connz(&server.ConnzOptions{Limit: e.srv.NumClients() + 1024})
	if err != nil {
		return fmt.Errorf("list the clients to disconnect: %w", err)
	}
	for _, c := range conns.Conns {
		_ = e.srv.DisconnectClientByID(c.Cid) // gone meanwhile
	}
	type counts struct{ msgs, api int64 }
	deadline := time.Now().Add(drainMax)
	last := counts{-1, -1}
	for quiet := time.Duration(0); quiet < drainQuiet; {
		v, err := e.srv.Varz(nil)
		if err != nil {
			return fmt.Errorf("read the server's counts: %w", err)
		}
		js, err := e.srv.Jsz(nil)
		if err != nil {
			return fmt.Errorf("read JetStream's counts: %w", err)
		}
		if now := (counts{v.InMsgs, int64(js.API.Inflight)}); now == last {
			quiet += drainPoll
		} else {
			last, quiet = now, 0
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the clients' requests still running %s after they were disconnected", drainMax)
		}
		time.Sleep(drainPoll)
	}
	return nil
}

// drainQuiet, drainPoll and drainMax: see disconnectClients.
const (
	drainQuiet = 50 * time.Millisecond
	drainPoll  = 5 * time.Millisecond
	drainMax   = 10 * time.Second
)

// storedStreams counts the streams of the global account in dir, and those of them
// that are encrypted (nats-server keeps an encrypted stream's key in meta.key beside
// its meta.inf).
func storedStreams(dir string) (stored, encrypted int) {
	metas, _ := filepath.Glob(filepath.Join(dir, "jetstream", server.DEFAULT_GLOBAL_ACCOUNT, "streams", "*", "meta.inf"))
	for _, m := range metas {
		stored++
		if _, err := os.Stat(filepath.Join(filepath.Dir(m), "meta.key")); err == nil {
			encrypted++
		}
	}
	return stored, encrypted
}

// SyncMetadata syncs the store's structure: every directory of the data directory
// (and the directory that holds it), so that the names in them survive a power cut,
// and every stream's and consumer's metadata file (meta.*). nats-server syncs a
// stream's messages and the directory that holds them, but neither the parents of a
// new stream's (or consumer's) directory nor, for a stream in async persist mode
// (sluice's key streams), its metadata: where a directory's entries last only once
// that directory is synced (POSIX; ext2, ext4 without a journal) a power cut after a
// stream was created, however long after, loses the stream whole, acknowledged
// messages and all; and where a new file's data may reach the disk after its name (ext4's
// delayed allocation) the cut leaves an empty meta.inf, a stream the server cannot
// load, and sluice refuses to start without it. sluice calls it once its queues are
// declared.
func (e *Server) SyncMetadata() error {
	err := filepath.WalkDir(e.dataDir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !(d.IsDir() || d.Type().IsRegular() && strings.HasPrefix(d.Name(), "meta.")) {
			return err
		}
		return syncPath(path)
	})
	if err != nil {
		return fmt.Errorf("queue: sync the store's metadata in %s: %w", e.dataDir, err)
	}
	return syncPath(filepath.Dir(e.dataDir))
}

func syncPath(path string) error {
	d, err := os.Open(path)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

// NATS returns the underlying nats-server.
func (e *Server) NATS() *server.Server { return e.srv }

// MaxStore returns the JetStream file storage limit in force (MaxStore, or the server's
// choice from the free disk space): what queue.Open takes as queue.WithStoreLimit.
func (e *Server) MaxStore() int64 {
	if c := e.srv.JetStreamConfig(); c != nil {
		return c.MaxStore
	}
	return 0
}

// DiskFree returns the bytes free (to an unprivileged writer) on the disk of the data
// directory: what queue.Open takes as queue.WithDiskFree. ErrDiskFreeUnknown where the
// system has no such figure for sluice.
func (e *Server) DiskFree() (uint64, error) { return diskFree(e.dataDir) }

// ClientURL returns the URL of the listener ("" without one).
func (e *Server) ClientURL() string {
	if e.srv.Addr() == nil {
		return ""
	}
	return e.srv.ClientURL()
}

// Connect opens an in-process connection (no TCP), whether or not the server listens.
// It does not buffer publishes while disconnected (see Store), and reconnects forever,
// 20 ms after a disconnection, without jitter, whatever opts say: the disconnections
// are a restart's of JetStream, which holds the logins until it is done (see
// loginGate), so trying soon costs nothing, and every order refused meanwhile for want
// of a connection is one too many.
func (e *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	all := []nats.Option{
		nats.InProcessServer(e.srv),
		nats.Name("sluice"),
		nats.MaxReconnects(-1),
		nats.ReconnectBufSize(-1),
	}
	if e.gate.token != "" {
		all = append(all, nats.Token(e.gate.token))
	}
	all = append(all, opts...)
	all = append(all, nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	return nats.Connect("", all...)
}

// Shutdown stops the server and waits until it is down.
func (e *Server) Shutdown() {
	e.stopWatching.Do(func() { close(e.quit) })
	e.watching.Wait()
	e.srv.Shutdown()
	e.srv.WaitForShutdown()
}

// ShutdownContext is Shutdown bounded by ctx.
func (e *Server) ShutdownContext(ctx context.Context) error {
	done := make(chan struct{})
	go func() { e.Shutdown(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// logAdapter is the server's logger: it passes the lines on to l (nil: nowhere), and
// notes the write errors nats-server reports ("... critical write error: ...", of a
// stream or a consumer), after which it answers nothing of theirs until JetStream
// restarts.
type logAdapter struct {
	l           *slog.Logger
	writeFailed func(line string)
}

func (a logAdapter) line(level slog.Level, format string, v ...any) {
	if a.l != nil {
		a.l.Log(context.Background(), level, fmt.Sprintf(format, v...))
	}
}

func (a logAdapter) Noticef(format string, v ...any) { a.line(slog.LevelInfo, format, v...) }
func (a logAdapter) Warnf(format string, v ...any)   { a.line(slog.LevelWarn, format, v...) }
func (a logAdapter) Fatalf(format string, v ...any)  { a.line(slog.LevelError, format, v...) }
func (a logAdapter) Debugf(format string, v ...any)  { a.line(slog.LevelDebug, format, v...) }
func (a logAdapter) Tracef(format string, v ...any)  { a.line(slog.LevelDebug, format, v...) }

func (a logAdapter) Errorf(format string, v ...any) {
	if strings.Contains(strings.ToLower(format), "critical write error") {
		a.writeFailed(fmt.Sprintf(format, v...))
	}
	a.line(slog.LevelError, format, v...)
}
