// Package natstest starts real NATS servers with JetStream for tests: an in-process
// server from the nats-server module in go.mod (Start), and a cluster of separate
// nats-server processes built from that same module version (StartCluster). Everything
// lives in temporary directories and on free loopback ports, and is stopped and removed
// when the test ends, also when it fails.
//
// NewCluster starts a cluster that is not tied to a test (for a benchmark, or one
// shared by a whole test binary); its owner must Close it.
package natstest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Server is an in-process NATS server with JetStream, listening on a loopback port.
type Server struct {
	// URL is the client URL (nats://127.0.0.1:PORT); it stays the same across Restart.
	URL string
	// Dir is the JetStream data directory; it survives Restart.
	Dir string
	// Conn is a connection opened by Start, closed when the test ends. It reconnects
	// forever (also across Restart) and does not buffer while disconnected.
	Conn *nats.Conn

	t    testing.TB
	port int
	base *server.Options // from a configuration file (StartConfig); nil: Start's

	mu  sync.Mutex
	srv *server.Server
}

// Start starts a server with JetStream in a fresh temporary directory, syncing every
// write like the embedded server of sluice. It is shut down when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, Dir: t.TempDir()}
	s.start(server.RANDOM_PORT)
	t.Cleanup(s.Shutdown) // registered after TempDir: runs before the directory goes
	s.URL = fmt.Sprintf("nats://127.0.0.1:%d", s.port)
	s.Conn = s.Connect(t)
	return s
}

// StartConfig starts a server configured by a nats-server configuration file (its
// accounts, users and permissions), on a loopback port and with JetStream in a fresh
// temporary directory whatever the file says. Conn is nil: the file decides who may
// connect, so the test connects with Connect and the credentials it means to try.
// Each adjust changes the options read from the file before the server starts (for
// example the cluster listener and routes of a file written for other hosts).
func StartConfig(t testing.TB, path string, adjust ...func(*server.Options)) *Server {
	t.Helper()
	base, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("natstest: %s: %v", path, err)
	}
	for _, f := range adjust {
		f(base)
	}
	s := &Server{t: t, Dir: t.TempDir(), base: base}
	s.start(server.RANDOM_PORT)
	t.Cleanup(s.Shutdown)
	s.URL = fmt.Sprintf("nats://127.0.0.1:%d", s.port)
	return s
}

func (s *Server) start(port int) {
	s.t.Helper()
	opts := &server.Options{ServerName: "natstest"}
	if s.base != nil {
		opts = s.base.Clone()
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", port, 0
	opts.JetStream, opts.StoreDir = true, s.Dir
	opts.SyncAlways, opts.SyncInterval = true, 2*time.Minute
	opts.NoSigs, opts.NoLog = true, true
	var srv *server.Server
	var err error
	// The port of a restarted server may still be held for a moment.
	for i := 0; ; i++ {
		srv, err = server.NewServer(opts)
		if err != nil {
			s.t.Fatalf("natstest: %v", err)
		}
		srv.Start()
		if srv.ReadyForConnections(20 * time.Second) {
			break
		}
		srv.Shutdown()
		srv.WaitForShutdown()
		if i == 20 {
			s.t.Fatalf("natstest: server not ready on port %d", port)
		}
		time.Sleep(100 * time.Millisecond)
	}
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok {
		s.t.Fatalf("natstest: server has no TCP address")
	}
	s.mu.Lock()
	s.srv, s.port = srv, addr.Port
	s.mu.Unlock()
}

// Connect opens a new connection that is closed when the test ends. Like Conn it
// reconnects forever and does not buffer publishes while disconnected.
func (s *Server) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(s.URL, all...)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", s.URL, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Server returns the running nats-server (nil while shut down).
func (s *Server) Server() *server.Server {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.srv
}

// Shutdown stops the server and waits until it is down; the data directory stays.
func (s *Server) Shutdown() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Restart shuts the server down (if running) and starts it again on the same port with
// the same data directory, as after a crash and restart of the process, and waits
// until Conn (when Start opened one) is connected to the new server. Conn's
// IsConnected is no such sign: on a loaded machine the client may not yet have seen
// the old server close the connection, and a request written to it then is lost and
// waits for its caller's deadline.
func (s *Server) Restart() {
	s.t.Helper()
	var reconnects uint64
	if s.Conn != nil {
		reconnects = s.Conn.Stats().Reconnects
	}
	s.Shutdown()
	s.start(s.port)
	if s.Conn == nil {
		return
	}
	deadline := time.Now().Add(30 * time.Second)
	for s.Conn.Stats().Reconnects == reconnects || !s.Conn.IsConnected() {
		if time.Now().After(deadline) {
			s.t.Fatalf("natstest: Conn not connected to the restarted server in 30s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Stream returns a handle on the stream name (a queue's: queue.StreamName), for tests
// that look at or change server state the queue package keeps to itself.
func (s *Server) Stream(t testing.TB, name string) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(s.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatalf("stream %s: %v", name, err)
	}
	return st
}

// SigningKey returns a fixed signing key for queue.WithSigningKey in tests (40 bytes).
// Processes of one test must share it, as replicas do; a test of forgery signs with
// another key.
func SigningKey() []byte { return []byte("sluice test key: not a secret, 40 bytes.") }
