package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter/childproc"
)

const serverModule = "github.com/nats-io/nats-server/v2"

// Cluster is a JetStream cluster of separate nats-server processes on loopback, built
// from the nats-server version in go.mod. R3 streams work on a 3-node cluster.
type Cluster struct {
	t      testing.TB // nil for NewCluster's
	dir    string
	ownDir bool // remove dir on Close
	bin    string
	o      clusterOptions
	nodes  []*node
}

type node struct {
	name        string
	conf        string
	log         string
	clientPort  int
	clusterPort int
	httpPort    int // monitoring: /jsz tells the meta leader's view of its peers

	mu   sync.Mutex
	proc *childproc.Process // nil when killed
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
	// Built in this module, so go.mod picks the version.
	return cachedBuild("nats-server", version, version != "unknown", func(out string) *exec.Cmd {
		return exec.Command("go", "build", "-o", out, serverModule)
	})
}

var (
	atMu    sync.Mutex
	builtAt = map[string]string{}
)

// ServerBinaryAt returns a nats-server binary of version (such as "v2.11.0"), built
// once per machine from the module at that version (go install, which fetches it
// through the module proxy) into the user cache directory: for tests against the
// oldest server sluice supports, which is not the one go.mod requires.
func ServerBinaryAt(version string) (string, error) {
	if !semverRE.MatchString(version) {
		return "", fmt.Errorf("natstest: version %q: want vMAJOR.MINOR.PATCH", version)
	}
	atMu.Lock()
	defer atMu.Unlock()
	if bin, ok := builtAt[version]; ok {
		return bin, nil
	}
	bin, err := cachedBuild("nats-server", version, true, func(out string) *exec.Cmd {
		// go install writes into GOBIN under the command's name: a directory of its
		// own, moved into place below.
		cmd := exec.Command("go", "install", serverModule+"@"+version)
		cmd.Env = append(os.Environ(), "GOBIN="+out+".d")
		return cmd
	})
	if err == nil {
		builtAt[version] = bin
	}
	return bin, err
}

var semverRE = regexp.MustCompile(`^v\d+\.\d+\.\d+$`)

// CLIBinaryAt returns the nats CLI (github.com/nats-io/natscli) of version, built once
// per machine like ServerBinaryAt: for tests that run what operators run with it, such
// as the stream-creating job of deploy/compose.
func CLIBinaryAt(version string) (string, error) {
	if !semverRE.MatchString(version) {
		return "", fmt.Errorf("natstest: version %q: want vMAJOR.MINOR.PATCH", version)
	}
	atMu.Lock()
	defer atMu.Unlock()
	return cachedBuild("nats", version, true, func(out string) *exec.Cmd {
		cmd := exec.Command("go", "install", "github.com/nats-io/natscli/nats@"+version)
		cmd.Env = append(os.Environ(), "GOBIN="+out+".d")
		return cmd
	})
}

// cachedBuild returns the binary name (nats-server, nats) of version in the user cache
// directory, building it with the command build makes (which writes the binary at its
// argument, or into that path + ".d") when it is missing or not reusable.
func cachedBuild(name, version string, reusable bool, build func(out string) *exec.Cmd) (string, error) {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "sluice-natstest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, name+"-"+version)
	if reusable {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	tmp, err := os.CreateTemp(dir, "build-*")
	if err != nil {
		return "", err
	}
	tmp.Close()
	defer os.RemoveAll(tmp.Name() + ".d")
	cmd := build(tmp.Name())
	if cmd.Env == nil {
		cmd.Env = os.Environ()
	}
	cmd.Env = append(cmd.Env, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp.Name())
		return "", fmt.Errorf("natstest: %s: %w\n%s", strings.Join(cmd.Args, " "), err, out)
	}
	if installed := filepath.Join(tmp.Name()+".d", name); fileExists(installed) {
		if err := os.Rename(installed, tmp.Name()); err != nil {
			return "", err
		}
	}
	if err := os.Rename(tmp.Name(), bin); err != nil {
		return "", err
	}
	return bin, nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// StartCluster starts an n-node JetStream cluster (every write synced, like sluice's
// embedded server, unless WithSyncInterval says otherwise) in t.TempDir() and waits
// until it is Ready. The processes are killed when the test ends, and (on Linux) when
// the test binary dies.
func StartCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	o, err := clusterOpts(opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := newCluster(t.TempDir(), false, n, o)
	if err != nil {
		t.Fatal(err)
	}
	c.t = t
	t.Cleanup(c.closeFor(t))
	return c
}

// ClusterOption configures StartCluster, PrepareCluster and NewCluster.
type ClusterOption func(*clusterOptions)

type clusterOptions struct {
	bin          string
	storeDir     func(node int) string
	syncInterval string
	maxMemory    *int64 // jetstream max_memory_store; nil: the server's default
	// accounts: a nats-server configuration file every node includes; probe: how
	// Ready's probe connects then.
	accounts string
	probe    []nats.Option
}

// clusterOpts applies opts over the defaults, building the server binary when no
// other is given.
func clusterOpts(opts []ClusterOption) (clusterOptions, error) {
	o := clusterOptions{syncInterval: "always"}
	for _, opt := range opts {
		opt(&o)
	}
	if o.bin == "" {
		var err error
		if o.bin, err = ServerBinary(); err != nil {
			return o, err
		}
	}
	return o, nil
}

// WithServerBinary runs the nats-server binary at path instead of building the version
// in go.mod (ServerBinary).
func WithServerBinary(path string) ClusterOption {
	return func(o *clusterOptions) { o.bin = path }
}

// WithStoreDir puts node i's JetStream store in dir(i) (for example a mount of its
// own) instead of the cluster's directory.
func WithStoreDir(dir func(node int) string) ClusterOption {
	return func(o *clusterOptions) { o.storeDir = dir }
}

// WithSyncInterval sets the nodes' jetstream sync_interval ("always" by default,
// like sluice's shipped configurations); "" leaves it out, for the server's default
// (a sync every two minutes).
func WithSyncInterval(v string) ClusterOption {
	return func(o *clusterOptions) { o.syncInterval = v }
}

// WithMaxMemoryStore sets the nodes' jetstream max_memory_store to n bytes (0: no
// memory streams at all, as on servers where memory is kept for other uses).
func WithMaxMemoryStore(n int64) ClusterOption {
	return func(o *clusterOptions) { o.maxMemory = &n }
}

// WithAccounts has every node include the nats-server configuration file at path (its
// accounts, users and permissions: deploy/nats/accounts.conf, as the shipped clusters
// include it), copied beside the nodes' configurations, where the servers resolve an
// include. The variables it names come from the test's environment, which the nodes
// inherit. Ready then connects as user with password: without no_auth_user in the file
// nobody else gets in, and the user's account must have JetStream.
func WithAccounts(path, user, password string) ClusterOption {
	return func(o *clusterOptions) {
		o.accounts = path
		o.probe = []nats.Option{nats.UserInfo(user, password)}
	}
}

// NewCluster starts an n-node cluster like StartCluster, not tied to a test, in a new
// temporary directory. The caller must Close it; on Linux the processes also die with
// the calling process. Its Restart and WaitReady panic on failure (they are for
// StartCluster's clusters); use RestartNode and Ready instead.
func NewCluster(n int, opts ...ClusterOption) (*Cluster, error) {
	o, err := clusterOpts(opts)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "natstest-cluster-")
	if err != nil {
		return nil, err
	}
	c, err := newCluster(dir, true, n, o)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return c, nil
}

// closeFor returns the cleanup of t's cluster: Close, after logging the end of each
// node's log when t failed (what the servers said is what a failure on a busy machine
// is read from).
func (c *Cluster) closeFor(t testing.TB) func() {
	return func() {
		if t.Failed() {
			for i, nd := range c.nodes {
				t.Logf("natstest: the last of node %d's log (%s):\n%s", i, nd.name, childproc.Tail(nd.log, 4000))
			}
		}
		c.Close()
	}
}

// PrepareCluster prepares an n-node cluster like StartCluster (ports, directories and
// configuration) without starting it, for tests of programs that start before their
// NATS: URL is known at once, and Start starts the nodes. Whatever runs is killed when
// the test ends.
func PrepareCluster(t testing.TB, n int, opts ...ClusterOption) *Cluster {
	t.Helper()
	o, err := clusterOpts(opts)
	if err != nil {
		t.Fatal(err)
	}
	c, err := prepareCluster(t.TempDir(), false, n, o)
	if err != nil {
		t.Fatal(err)
	}
	c.t = t
	t.Cleanup(c.closeFor(t))
	return c
}

// Start starts every node that does not run and waits until the cluster is Ready.
func (c *Cluster) Start() error {
	for i := range c.nodes {
		if !c.Running(i) {
			if err := c.start(i); err != nil {
				return err
			}
		}
	}
	return c.Ready(context.Background())
}

// newCluster writes the nodes' configurations into dir, starts them and waits until
// the cluster is Ready; on failure the nodes started are killed.
func newCluster(dir string, ownDir bool, n int, o clusterOptions) (c *Cluster, err error) {
	if c, err = prepareCluster(dir, ownDir, n, o); err != nil {
		return nil, err
	}
	if err := c.Start(); err != nil {
		c.Shutdown()
		return nil, err
	}
	return c, nil
}

// prepareCluster chooses the nodes' ports and writes their configurations into dir.
func prepareCluster(dir string, ownDir bool, n int, o clusterOptions) (c *Cluster, err error) {
	c = &Cluster{dir: dir, ownDir: ownDir, bin: o.bin, o: o}
	include := ""
	if o.accounts != "" {
		b, err := os.ReadFile(o.accounts)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(dir, "accounts.conf"), b, 0o600); err != nil {
			return nil, err
		}
		include = "include ./accounts.conf\n"
	}
	ports, err := freePorts(3 * n)
	if err != nil {
		return nil, err
	}
	for i := range n {
		c.nodes = append(c.nodes, &node{
			name:        fmt.Sprintf("n%d", i+1),
			clientPort:  ports[3*i],
			clusterPort: ports[3*i+1],
			httpPort:    ports[3*i+2],
		})
	}
	for i, nd := range c.nodes {
		var routes []string
		for _, other := range c.nodes {
			if other != nd {
				routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", other.clusterPort))
			}
		}
		nd.conf = filepath.Join(c.dir, nd.name+".conf")
		nd.log = filepath.Join(c.dir, nd.name+".log")
		store := filepath.Join(c.dir, nd.name)
		if o.storeDir != nil {
			store = o.storeDir(i)
		}
		sync := ""
		if o.syncInterval != "" {
			sync = fmt.Sprintf("\n  sync_interval: %s", o.syncInterval)
		}
		if o.maxMemory != nil {
			sync += fmt.Sprintf("\n  max_memory_store: %d", *o.maxMemory)
		}
		conf := fmt.Sprintf(`server_name: %s
listen: 127.0.0.1:%d
http: 127.0.0.1:%d
jetstream {
  store_dir: %q%s
}
cluster {
  name: natstest
  listen: 127.0.0.1:%d
  routes: [%s]
}
%s`, nd.name, nd.clientPort, nd.httpPort, store, sync, nd.clusterPort, strings.Join(routes, ", "), include)
		if err := os.WriteFile(nd.conf, []byte(conf), 0o644); err != nil {
			return nil, err
		}
	}
	return c, nil
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
	proc, err := childproc.Start(exec.Command(c.bin, "-c", nd.conf), nd.log)
	if err != nil {
		return fmt.Errorf("natstest: start %s: %w", nd.name, err)
	}
	nd.mu.Lock()
	nd.proc = proc
	nd.mu.Unlock()
	addr := fmt.Sprintf("127.0.0.1:%d", nd.clientPort)
	err = proc.WaitReady(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("natstest: %s does not listen: %w:\n%s", nd.name, err, childproc.Tail(nd.log, 3000))
	}
	return nil
}

// URL returns the client URLs of every node, comma-separated, for nats.Connect.
func (c *Cluster) URL() string {
	var urls []string
	for _, nd := range c.nodes {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
	}
	return strings.Join(urls, ",")
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

// WaitReady waits until the running nodes form a healthy JetStream cluster (see
// Ready), failing the test after 60s.
func (c *Cluster) WaitReady() {
	if c.t != nil {
		c.t.Helper()
	}
	if err := c.Ready(context.Background()); err != nil {
		c.fatal(err)
	}
}

// ReadyStream is the stream Ready creates and deletes to prove that replicated
// streams can be placed.
const ReadyStream = "NATSTEST_READY"

// Ready waits until the running nodes form a healthy JetStream cluster: a meta leader
// is elected, sees every other running node as a current, online peer of the meta
// group, and a file stream with as many replicas as nodes run (at most 3) can be
// placed. JetStream answering is not enough: until the leader has heard from every
// peer, creating an R3 stream fails with "no suitable peers for placement". It waits
// at most 60s, or until ctx is done.
func (c *Cluster) Ready(ctx context.Context) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		err := c.ready(ctx)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("natstest: JetStream cluster not ready: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ready checks once what Ready waits for.
func (c *Cluster) ready(ctx context.Context) error {
	var running []*node
	for i, nd := range c.nodes {
		if c.Running(i) {
			running = append(running, nd)
		}
	}
	if len(running) == 0 {
		return errors.New("no node runs")
	}
	meta, err := c.metaLeaderView(ctx, running)
	if err != nil {
		return err
	}
	for _, nd := range running {
		if nd.name == meta.Leader {
			continue
		}
		i := slices.IndexFunc(meta.Replicas, func(p *server.PeerInfo) bool { return p.Name == nd.name })
		switch {
		case i < 0:
			return fmt.Errorf("meta leader %s does not know %s yet", meta.Leader, nd.name)
		case !meta.Replicas[i].Current || meta.Replicas[i].Offline:
			return fmt.Errorf("meta leader %s: peer %s is not current (offline %v)", meta.Leader, nd.name, meta.Replicas[i].Offline)
		}
	}
	return c.probeStream(ctx, running)
}

// metaLeaderView returns the meta group as its leader sees it (followers' views of
// their peers are not kept up to date), from the leader's monitoring endpoint.
func (c *Cluster) metaLeaderView(ctx context.Context, running []*node) (*server.MetaClusterInfo, error) {
	for _, nd := range running {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		info, err := jsz(rctx, nd.httpPort)
		cancel()
		if err == nil && info != nil && info.Meta != nil && info.Meta.Leader == nd.name {
			return info.Meta, nil
		}
	}
	return nil, errors.New("no meta leader")
}

// jsz reads /jsz?leader-only=true of a node: nil (and no error) when it is not the
// meta leader.
func jsz(ctx context.Context, port int) (*server.JSInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("http://127.0.0.1:%d/jsz?leader-only=true", port), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil, nil
	}
	var info server.JSInfo
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return nil, fmt.Errorf("/jsz: %w", err)
	}
	return &info, nil
}

// probeStream creates and deletes ReadyStream with a replica for each running node
// (at most 3): the final proof that the leader can place replicated streams.
func (c *Cluster) probeStream(ctx context.Context, running []*node) error {
	var urls []string
	for _, nd := range running {
		urls = append(urls, fmt.Sprintf("nats://127.0.0.1:%d", nd.clientPort))
	}
	nc, err := nats.Connect(strings.Join(urls, ","), append([]nats.Option{nats.Timeout(5 * time.Second)}, c.o.probe...)...)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := js.CreateOrUpdateStream(pctx, jetstream.StreamConfig{
		Name:     ReadyStream,
		Subjects: []string{"natstest.ready"},
		Storage:  jetstream.FileStorage,
		Replicas: min(3, len(running)),
	}); err != nil {
		return fmt.Errorf("probe stream R%d: %w", min(3, len(running)), err)
	}
	if err := js.DeleteStream(pctx, ReadyStream); err != nil {
		return fmt.Errorf("delete the probe stream: %w", err)
	}
	return nil
}

// Running reports whether node i runs.
func (c *Cluster) Running(i int) bool {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	return nd.proc != nil && nd.proc.Running()
}

// Process returns node i's process, nil when it does not run: for signals the
// Cluster has no method for (Kill and Restart still own its life).
func (c *Cluster) Process(i int) *os.Process {
	nd := c.nodes[i]
	nd.mu.Lock()
	defer nd.mu.Unlock()
	if nd.proc == nil || !nd.proc.Running() {
		return nil
	}
	return nd.proc.Cmd.Process
}

// Kill kills node i with SIGKILL, as a crash would, and waits until it is gone.
func (c *Cluster) Kill(i int) {
	nd := c.nodes[i]
	nd.mu.Lock()
	proc := nd.proc
	nd.proc = nil
	nd.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// Restart starts node i again (after Kill) with its ports and data, failing the test
// if it does not listen.
func (c *Cluster) Restart(i int) {
	if c.t != nil {
		c.t.Helper()
	}
	if err := c.RestartNode(i); err != nil {
		c.fatal(err)
	}
}

// RestartNode is Restart returning the error: it kills node i if it runs and starts it
// again with its ports and data.
func (c *Cluster) RestartNode(i int) error {
	c.Kill(i)
	return c.start(i)
}

// Node returns the index of the node with server name name (as in a stream's cluster
// info), or -1.
func (c *Cluster) Node(name string) int {
	for i, nd := range c.nodes {
		if nd.name == name {
			return i
		}
	}
	return -1
}

// Shutdown kills every node; their data stays.
func (c *Cluster) Shutdown() {
	for i := range c.nodes {
		c.Kill(i)
	}
}

// Close kills every node and removes the directory NewCluster created.
func (c *Cluster) Close() {
	c.Shutdown()
	if c.ownDir {
		_ = os.RemoveAll(c.dir)
	}
}

// fatal fails the test of a StartCluster cluster; a NewCluster one has none, so it panics.
func (c *Cluster) fatal(err error) {
	if c.t == nil {
		panic(err)
	}
	c.t.Helper()
	c.t.Fatal(err)
}

// Log returns what node i has logged so far (its standard output and error, across
// restarts): for tests that look for what the server refused.
func (c *Cluster) Log(i int) string {
	b, _ := os.ReadFile(c.nodes[i].log)
	return string(b)
}
