package natstest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const serverModule = "github.com/nats-io/nats-server/v2"

// Cluster is a JetStream cluster of separate nats-server processes on loopback, built
// from the nats-server version in go.mod. R3 streams work on a 3-node cluster.
type Cluster struct {
	t     testing.TB
	dir   string
	bin   string
	nodes []*node
}

type node struct {
	name        string
	conf        string
	log         string
	clientPort  int
	clusterPort int

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// ServerBinary returns a nats-server binary of the version this module requires,
// building it once per machine and version into the user cache directory.
func ServerBinary() (string, error) {
	buildOnce.Do(func() { builtBin, buildErr = buildServer() })
	return builtBin, buildErr
}

func buildServer() (string, error) {
	// The version go.mod selects (the test binary carries no module list).
	version := "unknown"
	if out, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", serverModule).Output(); err == nil {
		if v := strings.TrimSpace(string(out)); v != "" && !strings.ContainsAny(v, "/\\ ") {
			version = v
		}
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "sluice-natstest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "nats-server-"+version)
	if version != "unknown" {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	tmp, err := os.CreateTemp(dir, "build-*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	// Built in this module, so go.mod picks the version.
	cmd := exec.Command("go", "build", "-o", tmp.Name(), serverModule)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("natstest: go build %s: %v\n%s", serverModule, err, out)
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}

// StartCluster starts an n-node JetStream cluster (every write synced, like sluice's
// embedded server) and waits until JetStream answers. The processes are killed when the
// test ends, and (on Linux) when the test binary dies.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	bin, err := ServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, dir: t.TempDir(), bin: bin}
	ports, err := freePorts(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		c.nodes = append(c.nodes, &node{
			name:        fmt.Sprintf("n%d", i+1),
			clientPort:  ports[2*i],
			clusterPort: ports[2*i+1],
		})
	}
	for _, nd := range c.nodes {
		var routes []string
		for _, other := range c.nodes {
			if other != nd {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", other.clusterPort))
			}
		}
		nd.conf = filepath.Join(c.dir, nd.name+".conf")
		nd.log = filepath.Join(c.dir, nd.name+".log")
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
jetstream {
  store_dir: %q
  sync_interval: always
}
cluster {
  name: natstest
  listen: 127.0.0.1:%d
  routes: [%s]
}
`, nd.name, nd.clientPort, filepath.Join(c.dir, nd.name), nd.clusterPort, strings.Join(routes, ", "))
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(c.Shutdown)
	for i := range c.nodes {
		if err := c.start(i); err != nil {
			t.Fatal(err)
		}
	}
	c.WaitReady()
	return c
}

func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func (c *Cluster) start(i int) error {
	nd := c.nodes[i]
	logf, err := os.OpenFile(nd.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(c.bin, "-c", nd.conf)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = procAttr()
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("natstest: start %s: %w", nd.name, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(exited)
	}()
	nd.mu.Lock()
	nd.cmd, nd.exited = cmd, exited
	nd.mu.Unlock()
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", nd.clientPort), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("natstest: %s exited at start:\n%s", nd.name, tail(nd.log))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("natstest: %s does not listen after 30s:\n%s", nd.name, tail(nd.log))
		}
	}
}

func tail(path string) string {
	b, _ := os.ReadFile(path)
	if len(b) > 3000 {
		b = b[len(b)-3000:]
	}
	return string(b)
}

// URL returns the client URLs of every node, comma-separated, for nats.Connect.
func (c *Cluster) URL() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
	}
	return strings.Join(urls, ",")
}

// NodeURL returns the client URL of node i.
func (c *Cluster) NodeURL(i int) string {
	return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].clientPort)
}

// Connect opens a connection to the cluster (any node; it fails over between them),
// closed when the test ends.
func (c *Cluster) Connect(t testing.TB, opts ...nats.Option) *nats.Conn {
	t.Helper()
	all := append([]nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.ReconnectBufSize(-1),
		nats.Timeout(5 * time.Second),
	}, opts...)
	nc, err := nats.Connect(c.URL(), all...)
	if err != nil {
		t.Fatalf("natstest: connect to the cluster: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// WaitReady waits until JetStream answers through the running nodes (a meta leader is
// elected).
func (c *Cluster) WaitReady() {
	c.t.Helper()
	var urls []string
	for i, nd := range c.nodes {
		if c.Running(i) {
			urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
		}
	}
	nc, err := nats.Connect(strings.Join(urls, ","), nats.Timeout(5*time.Second))
	if err != nil {
		c.t.Fatalf("natstest: connect: %v", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		c.t.Fatal(err)
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.AccountInfo(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("natstest: JetStream cluster not ready after 60s: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Running reports whether node i runs.
func (c *Cluster) Running(i int) bool {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.cmd == nil {
		return false
	}
	select {
	case <-nd.exited:
		return false
	default:
		return true
	}
}

// Kill kills node i with SIGKILL, as a crash would, and waits until it is gone.
func (c *Cluster) Kill(i int) {
	nd := c.nodes[i]
	nd.mu.Lock()
	cmd, exited := nd.cmd, nd.exited
	nd.cmd = nil
	nd.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	<-exited
}

// Restart starts node i again (after Kill) with its ports and data.
func (c *Cluster) Restart(i int) {
	c.t.Helper()
	c.Kill(i)
	if err := c.start(i); err != nil {
		c.t.Fatal(err)
	}
}

// Shutdown kills every node.
func (c *Cluster) Shutdown() {
	for i := range c.nodes {
		c.Kill(i)
	}
}
