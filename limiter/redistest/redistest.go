// Package redistest starts real Redis servers for tests: a standalone server
// (Start) or a Redis Cluster of several masters (StartCluster), each on free
// loopback ports, without persistence, in a temporary directory.
//
// Servers are killed when the test ends (t.Cleanup, which also runs when the test
// fails or panics) and, on Linux, by the kernel when the test binary dies
// (Pdeathsig), so no redis-server outlives its tests.
//
// If redis-server is not on PATH the tests are skipped, except when the CI
// environment variable is set: there they fail, so CI never skips silently.
// New and NewCluster start servers that are not tied to one test (for example a
// server shared by a whole test binary, owned by TestMain); their owner must Close them.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/limiter/childproc"
)

// ErrNotInstalled is returned by New and NewCluster when redis-server (or, for a
// cluster, redis-cli) is not on PATH.
var ErrNotInstalled = errors.New("redistest: redis-server not found on PATH")

// startTimeout bounds how long a server may take to answer PING.
const startTimeout = 15 * time.Second

// Available reports whether the Redis binaries needed for a cluster are installed:
// nil, or an error wrapping ErrNotInstalled.
func Available() error { return lookPath("redis-server", "redis-cli") }

func lookPath(bins ...string) error {
	for _, bin := range bins {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%w (%s: %w)", ErrNotInstalled, bin, err)
		}
	}
	return nil
}

// Require skips t when Redis is not installed, or fails it when the environment
// variable CI is set.
func Require(t testing.TB) {
	t.Helper()
	if err := Available(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v; CI must run the Redis tests: install redis-server", err)
		}
		t.Skipf("%v; skipping (set CI=1 to make this a failure)", err)
	}
}

// Server is one redis-server process.
type Server struct {
	dir     string
	ownDir  bool // remove dir on Close
	port    int
	cluster bool

	mu     sync.Mutex
	proc   *childproc.Process // nil when stopped
	client *redis.Client
	closed bool
}

// Start starts a standalone server in t.TempDir() and stops it when t ends. It skips
// t (or fails it, under CI) when redis-server is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	s, err := start(t.TempDir(), false, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// New starts a standalone server in a new temporary directory. The caller must Close it.
func New() (*Server, error) {
	if err := lookPath("redis-server"); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-")
	if err != nil {
		return nil, err
	}
	s, err := start(dir, true, false)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

// start launches a server on a free port, trying other ports if one is taken by
// the time the server binds it.
func start(dir string, ownDir, cluster bool) (*Server, error) {
	var lastErr error
	for range 10 {
		port, err := freePort(cluster)
		if err != nil {
			return nil, err
		}
		s := &Server{dir: dir, ownDir: ownDir, port: port, cluster: cluster}
		if lastErr = s.launch(); lastErr == nil {
			return s, nil
		}
	}
	return nil, lastErr
}

// freePort finds a loopback port that can be bound now; for a cluster node, the
// cluster bus port (port+10000) must be free too.
func freePort(cluster bool) (int, error) {
	for range 200 {
		port := 20000 + rand.IntN(30000)
		if !canBind(port) || (cluster && !canBind(port+10000)) {
			continue
		}
		return port, nil
	}
	return 0, errors.New("redistest: no free port found")
}

func canBind(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	l.Close()
	return true
}

func (s *Server) args() []string {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--appendonly", "no",
		"--dir", s.dir,
		"--daemonize", "no",
		"--logfile", "", // stdout, which goes to the log file below
	}
	if s.cluster {
		args = append(args,
			"--cluster-enabled", "yes",
			"--cluster-config-file", "nodes-"+strconv.Itoa(s.port)+".conf",
			"--cluster-node-timeout", "5000",
		)
	}
	return args
}

func (s *Server) logPath() string {
	return filepath.Join(s.dir, "redis-"+strconv.Itoa(s.port)+".log")
}

// launch starts the process and waits until it answers PING.
func (s *Server) launch() error {
	cmd := exec.Command("redis-server", s.args()...)
	cmd.Dir = s.dir
	proc, err := childproc.Start(cmd, s.logPath())
	if err != nil {
		return fmt.Errorf("redistest: start redis-server: %w", err)
	}
	s.mu.Lock()
	s.proc = proc
	s.mu.Unlock()
	err = proc.WaitReady(context.Background(), startTimeout, 20*time.Millisecond, func() bool { return ping(s.Addr()) == nil })
	if err != nil {
		if !errors.Is(err, childproc.ErrExited) {
			s.kill()
		}
		return fmt.Errorf("redistest: redis-server on port %d: %w:\n%s", s.port, err, s.log())
	}
	return nil
}

// ping sends one PING over a fresh connection.
func ping(addr string) error {
	conn, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(time.Second))
	if _, err := conn.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return err
	}
	if line != "+PONG\r\n" {
		return fmt.Errorf("redistest: PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

// log returns the tail of the server's log, for error messages.
func (s *Server) log() string { return childproc.Tail(s.logPath(), 4000) }

// Addr returns the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Port returns the server's port.
func (s *Server) Port() int { return s.port }

// Client returns a client of the server, created on first use and closed with the
// server. It honours context deadlines (ContextTimeoutEnabled) and survives Restart.
func (s *Server) Client() *redis.Client {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.client == nil {
		s.client = redis.NewClient(ClientOptions(s.Addr()))
	}
	return s.client
}

// ClientOptions returns the options Client uses: short timeouts suited to tests.
func ClientOptions(addr string) *redis.Options {
	return &redis.Options{
		Addr:                  addr,
		ContextTimeoutEnabled: true,
		DialTimeout:           2 * time.Second,
		ReadTimeout:           2 * time.Second,
		WriteTimeout:          2 * time.Second,
	}
}

// Stop kills the server (as a crash would: nothing is saved). It is safe to call on
// a stopped server. Clients see connection errors until Restart.
func (s *Server) Stop() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	proc := s.proc
	s.proc = nil
	s.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// Restart stops the server if it runs and starts it again on the same port, empty.
func (s *Server) Restart() error {
	s.kill()
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errors.New("redistest: Restart after Close")
	}
	var err error
	deadline := time.Now().Add(startTimeout)
	for time.Now().Before(deadline) {
		if err = s.launch(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond) // the port may still be held
	}
	return err
}

// Close stops the server for good, closes its client and removes the directory New
// created.
func (s *Server) Close() {
	s.kill()
	s.mu.Lock()
	s.closed = true
	client := s.client
	s.client = nil
	s.mu.Unlock()
	if client != nil {
		_ = client.Close()
	}
	if s.ownDir {
		_ = os.RemoveAll(s.dir)
	}
}

// Cluster is a Redis Cluster of masters without replicas.
type Cluster struct {
	nodes  []*Server
	dir    string
	ownDir bool

	mu     sync.Mutex
	client *redis.ClusterClient
}

// StartCluster starts a cluster of masters (at least 3) in t.TempDir() and stops it
// when t ends. It skips t (or fails it, under CI) when Redis is missing.
func StartCluster(t testing.TB, masters int) *Cluster {
	t.Helper()
	Require(t)
	c, err := newCluster(t.TempDir(), false, masters)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// NewCluster starts a cluster of masters (at least 3) in a new temporary directory.
// The caller must Close it.
func NewCluster(masters int) (*Cluster, error) {
	if err := Available(); err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "redistest-cluster-")
	if err != nil {
		return nil, err
	}
	c, err := newCluster(dir, true, masters)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

func newCluster(dir string, ownDir bool, masters int) (c *Cluster, err error) {
	if masters < 3 {
		return nil, fmt.Errorf("redistest: a cluster needs at least 3 masters, got %d", masters)
	}
	c = &Cluster{dir: dir, ownDir: ownDir}
	defer func() {
		if err != nil {
			c.stopNodes()
		}
	}()
	for i := range masters {
		nodeDir := filepath.Join(dir, "node"+strconv.Itoa(i))
		if err := os.MkdirAll(nodeDir, 0o755); err != nil {
			return nil, err
		}
		s, err := start(nodeDir, false, true)
		if err != nil {
			return nil, err
		}
		c.nodes = append(c.nodes, s)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", "0", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("redistest: redis-cli --cluster create: %w\n%s", err, out)
	}
	if err := c.waitReady(ctx); err != nil {
		return nil, err
	}
	return c, nil
}

// waitReady waits until every node reports cluster_state:ok and knows every other.
func (c *Cluster) waitReady(ctx context.Context) error {
	want := "cluster_known_nodes:" + strconv.Itoa(len(c.nodes))
	for _, n := range c.nodes {
		client := redis.NewClient(ClientOptions(n.Addr()))
		var info string
		var err error
		for {
			info, err = client.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, want) &&
				strings.Contains(info, "cluster_slots_ok:16384") {
				break
			}
			select {
			case <-ctx.Done():
				client.Close()
				return fmt.Errorf("redistest: cluster node %s not ready: %w\n%s", n.Addr(), err, info)
			case <-time.After(50 * time.Millisecond):
			}
		}
		client.Close()
	}
	return nil
}

// Addrs returns the masters' host:port.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Client returns a cluster client, created on first use and closed with the cluster.
func (c *Cluster) Client() *redis.ClusterClient {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.client == nil {
		c.client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs:                 c.Addrs(),
			ContextTimeoutEnabled: true,
			DialTimeout:           2 * time.Second,
			ReadTimeout:           2 * time.Second,
			WriteTimeout:          2 * time.Second,
		})
	}
	return c.client
}

func (c *Cluster) stopNodes() {
	for _, n := range c.nodes {
		n.Close()
	}
}

// Close stops every node, closes the client and removes the directory NewCluster
// created.
func (c *Cluster) Close() {
	c.mu.Lock()
	client := c.client
	c.client = nil
	c.mu.Unlock()
	if client != nil {
		_ = client.Close()
	}
	c.stopNodes()
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}
