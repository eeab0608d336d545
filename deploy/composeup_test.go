//go:build linux && composeup

package deploy_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluicehq/sluice/queue/natstest"
)

// TestComposeUp runs the shipped compose/compose.yaml on a Docker engine of its own and
// puts it through what an operator would: the quick-start traffic through the front
// door (nginx → the replicas), deferred orders delivered, a NATS node and a replica
// killed under load, a NATS node paused for 15 s, and after the heal every 202
// delivered, the ticket API and Prometheus answering.
//
// It runs as a stage of its own (.ci/compose, built with -tags composeup): it takes
// minutes. Linux and root only; under CI=true nothing missing skips it.
//
// How, on a machine that reaches no registry:
//   - dockerd (Debian's docker.io) runs in a network namespace of its own (unshare
//     --net), with its own data root, exec root and socket under a temporary
//     directory, vfs storage, no iptables rules and no default bridge. Compose's own
//     bridge networks (edge with nginx's fixed address, back) live in that namespace,
//     so the shipped file runs with the networking users run, and nothing of the
//     machine's network changes. The test reaches the published ports on that
//     namespace's loopback (dialNetns).
//   - Every image the file names is made locally under that name with `docker
//     import` of a root file system: the sluice image from ./cmd/sluice and
//     cmd/sluice-bench built static (CGO_ENABLED=0) with the runtime configuration of
//     deploy/Dockerfile's final stage (ENV, USER, WORKDIR, EXPOSE, ENTRYPOINT);
//     nats-server built from the module go.mod requires (natstest.ServerBinary) and
//     nats-box's nats CLI from natscli (natstest.CLIBinaryAt), with Debian's static
//     busybox for the health check's wget and the job's shell; redis, nginx and
//     Prometheus from this machine's Debian binaries and the libraries ldd names.
//     They carry the upstream tags but Debian's versions (Redis 7.0, nginx 1.22,
//     Prometheus 2.42). The Redis image turns protected mode off, as the official
//     one does.
//   - Compose is Debian's docker-compose 1.29.2: Debian has no `docker compose`
//     plugin (docker-compose-plugin is not a Debian package), and building Compose v2
//     from source pulls hundreds of modules. 1.29 predates the top-level `name:` key,
//     so it reads the file without that line and gets the name as -p.
//   - The only change to what the file runs: Debian's nginx 1.22 has no `resolve`
//     parameter on an upstream server (nginx 1.27.3), so an override mounts nginx.conf
//     without it. grafana is left out (`up` names the services it starts): Debian has
//     no Grafana.
func TestComposeUp(t *testing.T) {
	start := time.Now()
	requireComposeTools(t)
	c := loadCompose(t)
	d := startDockerd(t)
	timings := map[string]time.Duration{}
	phase := func(name string, f func()) {
		t.Helper()
		s := time.Now()
		f()
		timings[name] = time.Since(s)
		t.Logf("%s: %s", name, timings[name].Round(100*time.Millisecond))
	}
	phase("images", func() { buildComposeImages(t, d, c) })

	cp := newComposeProject(t, d, c)
	phase("compose up", func() {
		cp.run(t, 10*time.Minute, "up", "-d", "--no-build", "lb", "prometheus", "nats-streams")
		cp.waitFrontDoor(t)
		// Every replica's limiter on Redis and its queues on NATS, as Prometheus
		// scrapes them (the replicas' admin ports are not published).
		waitPrometheus(t, d.httpClient(), `sluice_dependency_up == 1`, 6, 3*time.Minute)
	})

	fd := &frontDoor{base: "http://127.0.0.1:8080", client: d.httpClient()}
	phase("quick-start", func() { quickStart(t, fd) })

	var load *orderLoad
	phase("faults under load", func() {
		load = startOrderLoad(fd)
		defer load.stop()
		time.Sleep(3 * time.Second)
		nats2, sluice1 := cp.container(t, "nats-2"), cp.container(t, "sluice-1")
		d.docker(t, "kill", nats2, sluice1)
		t.Logf("killed nats-2 and sluice-1")
		time.Sleep(15 * time.Second)
		d.docker(t, "start", nats2, sluice1)
		cp.waitHealthy(t, "nats-2")
		time.Sleep(5 * time.Second)
		nats3 := cp.container(t, "nats-3")
		d.docker(t, "pause", nats3)
		t.Logf("paused nats-3")
		time.Sleep(15 * time.Second)
		d.docker(t, "unpause", nats3)
		cp.waitHealthy(t, "nats-3")
		time.Sleep(5 * time.Second)
	})
	counts, tickets := load.result()
	t.Logf("load: responses by status %v (0: no response), %d tickets; faults: 2 kills (nats-2, sluice-1, 15 s), 1 pause (nats-3, 15 s)", counts, len(tickets))
	if counts[http.StatusAccepted] == 0 || counts[http.StatusOK] == 0 {
		t.Errorf("load: want both 200 and 202 among %v", counts)
	}

	phase("heal", func() {
		fd.waitDelivered(t, tickets, 5*time.Minute)
		checkPrometheus(t, d.httpClient())
	})
	t.Logf("timings: %v; total %s", timings, time.Since(start).Round(time.Second))
}

// requireComposeTools installs what the test runs when it is missing (Debian's
// packages through apt-get); without root, or where that fails, the test skips, and
// fails under CI=true.
func requireComposeTools(t *testing.T) {
	t.Helper()
	fail := t.Skipf
	if os.Getenv("CI") == "true" {
		fail = t.Fatalf
	}
	if os.Geteuid() != 0 {
		fail("compose test: dockerd needs root")
	}
	need := map[string]string{ // a file → the Debian package that has it
		"/usr/sbin/dockerd":       "docker.io",
		"/usr/bin/docker-compose": "docker-compose",
		"/usr/bin/prometheus":     "prometheus",
		"/usr/bin/redis-server":   "redis-server",
		"/usr/bin/redis-cli":      "redis-tools",
		"/usr/sbin/nginx":         "nginx",
		"/bin/busybox":            "busybox-static",
		"/usr/bin/unshare":        "util-linux",
		"/usr/sbin/ip":            "iproute2",
	}
	var missing []string
	for file, pkg := range need {
		if _, err := os.Stat(file); err != nil && !slices.Contains(missing, pkg) {
			missing = append(missing, pkg)
		}
	}
	if len(missing) == 0 {
		return
	}
	slices.Sort(missing)
	if _, err := exec.LookPath("apt-get"); err != nil {
		fail("compose test: install %v (no apt-get here)", missing)
	}
	t.Logf("installing %v", missing)
	cmd := exec.Command("sh", "-c", `apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"`, "sh")
	cmd.Args = append(cmd.Args, missing...)
	cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
	if out, err := cmd.CombinedOutput(); err != nil {
		fail("compose test: apt-get install %v: %v\n%s", missing, err, out)
	}
}

// dockerEngine is a dockerd of the test's own.
type dockerEngine struct {
	root   string   // its data root, exec root and socket live here
	env    []string // the environment of docker and docker-compose: DOCKER_HOST
	netns  *os.File // its network namespace
	client *http.Client
}

// startDockerd starts dockerd in a network namespace of its own and stops it (and
// every container) when the test ends, failed or not.
func startDockerd(t *testing.T) *dockerEngine {
	t.Helper()
	// Short: the socket's path must fit a sockaddr_un.
	root, err := os.MkdirTemp("", "sluice-docker-")
	if err != nil {
		t.Fatal(err)
	}
	d := &dockerEngine{root: root, env: append(os.Environ(), "DOCKER_HOST=unix://"+filepath.Join(root, "docker.sock"))}
	logf, err := os.Create(filepath.Join(root, "dockerd.log"))
	if err != nil {
		t.Fatal(err)
	}
	// unshare execs sh, which brings the namespace's loopback up and execs dockerd:
	// one process, whose namespace ends with it.
	cmd := exec.Command("unshare", "--net", "--", "sh", "-c", `ip link set lo up && exec "$@"`, "sh",
		"dockerd",
		"--data-root", filepath.Join(root, "data"),
		"--exec-root", filepath.Join(root, "exec"),
		"--pidfile", filepath.Join(root, "dockerd.pid"),
		"-H", "unix://"+filepath.Join(root, "docker.sock"),
		"--storage-driver=vfs", "--iptables=false", "--bridge=none")
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			logTail(t, "dockerd", filepath.Join(root, "dockerd.log"), 40)
		}
		// Every container stops with the daemon (no live restore).
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(90 * time.Second):
			t.Errorf("dockerd did not stop within 90 s of SIGTERM; killed")
			cmd.Process.Kill()
			<-exited
		}
		if d.netns != nil {
			d.netns.Close()
		}
		logf.Close()
		if err := os.RemoveAll(root); err != nil {
			t.Logf("removing %s: %v", root, err)
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		out, err := d.try("version", "--format", "{{.Server.Version}}")
		if err == nil {
			t.Logf("dockerd %s", strings.TrimSpace(out))
			break
		}
		select {
		case <-exited:
			t.Fatalf("dockerd exited: %v", cmd.ProcessState)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("dockerd did not answer within 2 min: %v %s", err, out)
		}
		time.Sleep(500 * time.Millisecond)
	}
	d.netns, err = os.Open(fmt.Sprintf("/proc/%d/ns/net", cmd.Process.Pid))
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{DialContext: d.dialNetns, MaxIdleConnsPerHost: 16}
	d.client = &http.Client{Timeout: 20 * time.Second, Transport: tr}
	t.Cleanup(tr.CloseIdleConnections)
	return d
}

func logTail(t *testing.T, what, path string, n int) {
	t.Helper()
	data, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	t.Logf("last lines of %s:\n%s", what, strings.Join(lines[max(0, len(lines)-n):], "\n"))
}

func (d *dockerEngine) try(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = d.env
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// docker runs a docker command and fails the test if it fails.
func (d *dockerEngine) docker(t *testing.T, args ...string) string {
	t.Helper()
	out, err := d.try(args...)
	if err != nil {
		t.Fatalf("docker %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// dialNetns dials in the engine's network namespace: a thread of its own enters it
// for the socket's creation and leaves it after, so the published ports of compose
// are reached on that namespace's loopback.
func (d *dockerEngine) dialNetns(ctx context.Context, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		self, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer self.Close()
		if err := setns(d.netns); err != nil {
			runtime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("setns: %w", err)}
			return
		}
		var dl net.Dialer
		c, err := dl.DialContext(ctx, network, addr)
		if setns(self) == nil {
			runtime.UnlockOSThread()
		} // else the thread stays locked and ends with this goroutine, never reused
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}

func setns(f *os.File) error {
	return unix.Setns(int(f.Fd()), unix.CLONE_NEWNET)
}

// httpClient is the client of the published ports; its idle connections close when
// the test ends (before the engine stops).
func (d *dockerEngine) httpClient() *http.Client { return d.client }

// rootFS is a root file system for `docker import`.
type rootFS struct {
	files map[string]string // path in the image → file on this machine
	links map[string]string // symlink → target
	dirs  map[string]int    // directory → owner uid (and gid)
	data  map[string][]byte // path → contents
}

// addBinary adds a binary and every shared library ldd names for it.
func (r *rootFS) addBinary(t *testing.T, dst, src string) {
	t.Helper()
	r.files[dst] = src
	out, err := exec.Command("ldd", src).CombinedOutput()
	if err != nil { // "not a dynamic executable": static
		return
	}
	for _, m := range lddPath.FindAllStringSubmatch(string(out), -1) {
		r.files[m[1]] = m[1]
	}
}

var lddPath = regexp.MustCompile(`(?m)(?:=> |^\s+)(/\S+) \(0x`)

func newRootFS() *rootFS {
	return &rootFS{
		files: map[string]string{},
		links: map[string]string{},
		dirs:  map[string]int{"/tmp": 0, "/etc": 0},
		data: map[string][]byte{
			"/etc/passwd": []byte("root:x:0:0:root:/root:/bin/sh\nwww-data:x:33:33::/var/www:/bin/false\nnonroot:x:65532:65532::/home/nonroot:/bin/false\nnobody:x:65534:65534::/nonexistent:/bin/false\n"),
			"/etc/group":  []byte("root:x:0:\nwww-data:x:33:\nnonroot:x:65532:\nnogroup:x:65534:\nnobody:x:65534:\n"),
		},
	}
}

// tar writes the file system; parent directories come first, owned by root.
func (r *rootFS) tar(w io.Writer) error {
	tw := tar.NewWriter(w)
	written := map[string]bool{}
	var dir func(p string, uid int) error
	dir = func(p string, uid int) error {
		if p == "/" || written[p] {
			return nil
		}
		if err := dir(filepath.Dir(p), 0); err != nil {
			return err
		}
		written[p] = true
		mode := int64(0o755)
		if p == "/tmp" {
			mode = 0o1777
		}
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: mode, Uid: uid, Gid: uid})
	}
	for _, p := range slices.Sorted(mapKeys(r.dirs)) {
		if err := dir(p, r.dirs[p]); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(mapKeys(r.links)) {
		if err := dir(filepath.Dir(p), 0); err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(p, "/"), Linkname: r.links[p], Mode: 0o777}); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(mapKeys(r.data)) {
		if err := dir(filepath.Dir(p), 0); err != nil {
			return err
		}
		b := r.data[p]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: 0o644, Size: int64(len(b))}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	for _, p := range slices.Sorted(mapKeys(r.files)) {
		if err := dir(filepath.Dir(p), 0); err != nil {
			return err
		}
		f, err := os.Open(r.files[p]) // follows symlinks: the library itself
		if err != nil {
			return err
		}
		st, err := f.Stat()
		if err == nil {
			err = tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Mode: int64(st.Mode().Perm()), Size: st.Size()})
		}
		if err == nil {
			_, err = io.Copy(tw, f)
		}
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", r.files[p], err)
		}
	}
	return tw.Close()
}

func mapKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// importImage makes image tag from r with `docker import`, the Dockerfile
// instructions in changes giving its configuration.
func (d *dockerEngine) importImage(t *testing.T, tag string, r *rootFS, changes ...string) {
	t.Helper()
	start := time.Now()
	var buf bytes.Buffer
	if err := r.tar(&buf); err != nil {
		t.Fatalf("image %s: %v", tag, err)
	}
	size := buf.Len()
	args := []string{"import"}
	for _, c := range changes {
		args = append(args, "--change", c)
	}
	args = append(args, "-", tag)
	cmd := exec.Command("docker", args...)
	cmd.Env = d.env
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("docker import %s: %v\n%s", tag, err, out)
	}
	t.Logf("image %s: %d MB in %s", tag, size>>20, time.Since(start).Round(100*time.Millisecond))
}

// natsCLIVersion is the nats CLI of the nats-streams job's image: one known to build
// from the module proxy.
const natsCLIVersion = "v0.5.0"

const imagePath = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// buildComposeImages makes every image of the services the test starts, under the
// names compose.yaml gives them.
func buildComposeImages(t *testing.T, d *dockerEngine, c composeFile) {
	t.Helper()
	image := func(service string) string {
		s, ok := c.Services[service]
		if !ok || s.Image == "" {
			t.Fatalf("compose.yaml: no image for service %s", service)
		}
		return s.Image
	}
	if image("orders-api") != image("sluice-1") {
		t.Fatalf("compose.yaml: orders-api runs %s, the replicas %s: the test builds one sluice image", image("orders-api"), image("sluice-1"))
	}

	// sluice: the binaries static, with the final stage's runtime configuration.
	start := time.Now()
	dir := staticBinaries.build(t)
	t.Logf("sluice and sluice-bench built static: %s", time.Since(start).Round(100*time.Millisecond))
	final := parseDockerfile(t, "Dockerfile")
	st := final.stages[len(final.stages)-1]
	r := newRootFS()
	ic := loadImageConfig(t)
	for _, bin := range ic.binaries {
		r.files[bin] = filepath.Join(dir, filepath.Base(bin))
	}
	var changes []string
	for _, in := range st.instrs {
		switch in.op {
		case "ENV", "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD":
			changes = append(changes, in.op+" "+in.rest)
		}
		if in.op == "WORKDIR" {
			r.dirs[in.rest] = 65532 // the data directory, owned by the image's user
		}
	}
	d.importImage(t, image("sluice-1"), r, changes...)

	// NATS: the server go.mod requires; busybox for the health check's wget.
	start = time.Now()
	nats, err := natstest.ServerBinary()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nats-server (go.mod's): %s", time.Since(start).Round(100*time.Millisecond))
	r = newRootFS()
	r.addBinary(t, "/usr/local/bin/nats-server", nats)
	r.addBinary(t, "/bin/busybox", "/bin/busybox")
	r.links["/bin/sh"], r.links["/bin/wget"] = "busybox", "busybox"
	for _, s := range []string{"nats-1", "nats-2", "nats-3"} {
		if image(s) != image("nats-1") {
			t.Fatalf("compose.yaml: %s runs %s, nats-1 %s", s, image(s), image("nats-1"))
		}
	}
	d.importImage(t, image("nats-1"), r, imagePath, `ENTRYPOINT ["/usr/local/bin/nats-server"]`, "EXPOSE 4222 6222 8222")

	r = newRootFS()
	r.addBinary(t, "/usr/bin/redis-server", "/usr/bin/redis-server")
	r.addBinary(t, "/usr/bin/redis-cli", "/usr/bin/redis-cli")
	r.addBinary(t, "/bin/busybox", "/bin/busybox")
	r.links["/bin/sh"] = "busybox"
	r.dirs["/data"] = 0
	// The official image turns protected mode off (its clients are on other
	// containers' addresses, which protected mode refuses without a password); its
	// entrypoint also runs what it is given.
	d.importImage(t, image("redis"), r, imagePath, "WORKDIR /data", "EXPOSE 6379",
		`ENTRYPOINT ["/bin/sh", "-c", "if [ \"$1\" = redis-server ]; then shift; set -- redis-server --protected-mode no \"$@\"; fi; exec \"$@\"", "redis-entrypoint"]`,
		`CMD ["redis-server"]`)

	r = newRootFS()
	r.addBinary(t, "/usr/sbin/nginx", "/usr/sbin/nginx")
	for _, p := range []string{"/var/log/nginx", "/var/lib/nginx", "/run", "/etc/nginx"} {
		r.dirs[p] = 0
	}
	d.importImage(t, image("lb"), r, imagePath, `CMD ["nginx", "-g", "daemon off;"]`, "EXPOSE 8080")

	// nats-box: the nats CLI, and a shell for the job's retry loop.
	start = time.Now()
	cli, err := natstest.CLIBinaryAt(natsCLIVersion)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("nats CLI %s: %s", natsCLIVersion, time.Since(start).Round(100*time.Millisecond))
	r = newRootFS()
	r.addBinary(t, "/usr/local/bin/nats", cli)
	r.addBinary(t, "/bin/busybox", "/bin/busybox")
	r.links["/bin/sh"], r.links["/bin/sleep"] = "busybox", "busybox"
	r.dirs["/root"] = 0
	d.importImage(t, image("nats-streams"), r, imagePath, "ENV HOME=/root", `CMD ["sh"]`)

	r = newRootFS()
	r.addBinary(t, "/bin/prometheus", "/usr/bin/prometheus")
	r.dirs["/prometheus"], r.dirs["/etc/prometheus"] = 0, 0
	d.importImage(t, image("prometheus"), r, imagePath, `ENTRYPOINT ["/bin/prometheus"]`, "WORKDIR /prometheus", "EXPOSE 9090")
}

// composeProject is compose.yaml under docker-compose 1.29 on the test's engine.
type composeProject struct {
	d    *dockerEngine
	args []string // -p NAME --project-directory DIR -f FILE -f OVERRIDE
	env  []string
}

func newComposeProject(t *testing.T, d *dockerEngine, c composeFile) *composeProject {
	t.Helper()
	dir, err := filepath.Abs(composeDir)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// docker-compose 1.29 refuses the top-level name (Compose v2.3); it comes as -p.
	noName := regexp.MustCompile(`(?m)^name:.*\n`).ReplaceAll(raw, nil)
	if bytes.Equal(noName, raw) || c.Name == "" {
		t.Fatal("compose.yaml: no top-level name")
	}
	work := t.TempDir()
	file := filepath.Join(work, "compose.yaml")
	// nginx 1.22 (Debian) has no `resolve` on upstream servers.
	conf, err := os.ReadFile(filepath.Join(dir, "nginx.conf"))
	if err != nil {
		t.Fatal(err)
	}
	conf = regexp.MustCompile(`(?m)^(\s*server \S+) resolve\b`).ReplaceAll(conf, []byte("$1"))
	confPath := filepath.Join(work, "nginx.conf")
	override := filepath.Join(work, "override.yaml")
	for p, b := range map[string][]byte{
		file:     noName,
		confPath: conf,
		override: fmt.Appendf(nil, "services:\n  lb:\n    volumes: [%q]\n", confPath+":/etc/nginx/nginx.conf:ro"),
	} {
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cp := &composeProject{
		d:    d,
		args: []string{"--ansi", "never", "-p", c.Name, "--project-directory", dir, "-f", file, "-f", override},
		env:  slices.Clone(d.env),
	}
	for k, v := range composeEnv {
		cp.env = append(cp.env, k+"="+v)
	}
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := cp.try(time.Minute, "logs", "--no-color", "--tail", "30")
			t.Logf("compose logs:\n%s", out)
		}
		// The engine's end removes everything; down first stops them in order.
		if out, err := cp.try(3*time.Minute, "down", "-v", "-t", "10"); err != nil {
			t.Logf("docker-compose down: %v\n%s", err, out)
		}
	})
	return cp
}

func (cp *composeProject) try(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "docker-compose", append(slices.Clone(cp.args), args...)...)
	cmd.Env = cp.env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String() + stderr.String(), err
	}
	return stdout.String(), nil
}

func (cp *composeProject) run(t *testing.T, timeout time.Duration, args ...string) string {
	t.Helper()
	out, err := cp.try(timeout, args...)
	if err != nil {
		t.Fatalf("docker-compose %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// container is the id of a service's container.
func (cp *composeProject) container(t *testing.T, service string) string {
	t.Helper()
	id := strings.TrimSpace(cp.run(t, time.Minute, "ps", "-q", service))
	if id == "" || strings.Contains(id, "\n") {
		t.Fatalf("docker-compose ps -q %s: %q", service, id)
	}
	return id
}

// waitHealthy waits for a service's health check to pass.
func (cp *composeProject) waitHealthy(t *testing.T, service string) {
	t.Helper()
	id := cp.container(t, service)
	deadline := time.Now().Add(3 * time.Minute)
	for {
		out, err := cp.d.try("inspect", "--format", "{{.State.Health.Status}}", id)
		if err == nil && strings.TrimSpace(out) == "healthy" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not healthy within 3 min: %v %s", service, err, out)
		}
		time.Sleep(time.Second)
	}
}

// waitFrontDoor waits until a request through nginx reaches a replica.
func (cp *composeProject) waitFrontDoor(t *testing.T) {
	t.Helper()
	client := cp.d.httpClient()
	deadline := time.Now().Add(3 * time.Minute)
	for {
		resp, err := client.Get("http://127.0.0.1:8080/")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 500 {
				return
			}
			err = errors.New(resp.Status)
		}
		if time.Now().After(deadline) {
			t.Fatalf("the front door did not answer within 3 min: %v", err)
		}
		time.Sleep(time.Second)
	}
}

// frontDoor is compose's nginx on the engine's loopback.
type frontDoor struct {
	base   string
	client *http.Client
}

// order posts an order as the README's quick start does and returns the status and,
// for a 202, the ticket.
func (f *frontDoor) order(user string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, f.base+"/v1/orders", strings.NewReader(`{"item":1}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("X-User-ID", user)
	req.Header.Set("Content-Type", "application/json")
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusAccepted {
		return resp.StatusCode, "", err
	}
	var accepted struct {
		Ticket string `json:"ticket"`
	}
	if err := json.Unmarshal(body, &accepted); err != nil || accepted.Ticket == "" {
		return resp.StatusCode, "", fmt.Errorf("202 without a ticket: %w %s", err, body)
	}
	if loc := resp.Header.Get("Location"); loc != "/sluice/v1/deferred/"+accepted.Ticket {
		return resp.StatusCode, "", fmt.Errorf("202: Location %q for ticket %s", loc, accepted.Ticket)
	}
	return resp.StatusCode, accepted.Ticket, nil
}

// ticket reads a ticket's status through the front door.
func (f *frontDoor) ticket(tk string) (string, int, error) {
	resp, err := f.client.Get(f.base + "/sluice/v1/deferred/" + url.PathEscape(tk))
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var st struct {
		Status string `json:"status"`
		Result *struct {
			Status int `json:"status"`
		} `json:"result"`
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return "", 0, fmt.Errorf("GET ticket %s: %s %s", tk, resp.Status, body)
	}
	if err := json.Unmarshal(body, &st); err != nil {
		return "", 0, fmt.Errorf("ticket %s: %w: %s", tk, err, body)
	}
	code := 0
	if st.Result != nil {
		code = st.Result.Status
	}
	return st.Status, code, nil
}

// waitDelivered waits until every ticket is done with the demo API's 200; a failed or
// dead one fails.
func (f *frontDoor) waitDelivered(t *testing.T, tickets []string, within time.Duration) {
	t.Helper()
	pending := slices.Clone(tickets)
	deadline := time.Now().Add(within)
	var lastErr error
	for len(pending) > 0 {
		var left []string
		for _, tk := range pending {
			// Under the shipped per-address limit (50 a second) that the front door
			// applies to these GETs too.
			time.Sleep(25 * time.Millisecond)
			st, code, err := f.ticket(tk)
			switch {
			case err != nil:
				lastErr = err
				left = append(left, tk)
			case st == "done":
				if code != http.StatusOK {
					t.Errorf("ticket %s: done with downstream status %d, want 200 (orders-api)", tk, code)
				}
			case st == "failed" || st == "dead":
				t.Errorf("ticket %s: %s", tk, st)
			default:
				left = append(left, tk)
			}
		}
		pending = left
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d tickets not done within %s (last error %v): %v", len(pending), len(tickets), within, lastErr, pending[:min(len(pending), 10)])
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("all %d tickets done", len(tickets))
}

// quickStart is the README's try-it: 30 orders of one user (the bucket of 20 takes the
// first, the rest are deferred) and other requests over the quick-start's per-client
// limit (429); the deferred orders are delivered.
func quickStart(t *testing.T, f *frontDoor) {
	t.Helper()
	counts := map[int]int{}
	var tickets []string
	// The README's 30; more if they all passed (a replica whose Redis check timed out
	// decides alone, on a bucket of its own, until its next probe).
	for i := 0; i < 30 || (len(tickets) == 0 && i < 120); i++ {
		code, tk, err := f.order("42")
		if err != nil {
			t.Fatalf("order: %v", err)
		}
		counts[code]++
		if tk != "" {
			tickets = append(tickets, tk)
		}
		if i == 29 {
			t.Logf("quick start: 30 orders of one user: %v", counts)
		}
	}
	if counts[http.StatusAccepted] == 0 {
		t.Fatalf("quick start: no 202 among %v", counts)
	}
	// The shipped rules' per-address limit (orders.yaml's everything-else, 50 a second
	// for every client): a quick run of GETs from one client meets it.
	var limited *http.Response
	for i := 0; i < 500 && limited == nil; i++ {
		resp, err := f.client.Get(f.base + "/v1/catalog")
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			limited = resp
		}
	}
	if limited == nil {
		t.Fatal("quick start: 500 GETs of one client, no 429")
	}
	if limited.Header.Get("Retry-After") == "" || limited.Header.Get("RateLimit-Policy") == "" {
		t.Errorf("429 without Retry-After or RateLimit-Policy: %v", limited.Header)
	}
	f.waitDelivered(t, tickets, 3*time.Minute)
}

// orderLoad posts orders of one user at about 10 a second until stopped: twice the
// orders rule's refill, so about half are deferred.
type orderLoad struct {
	stopc chan struct{}
	done  chan struct{}

	mu      sync.Mutex
	counts  map[int]int // by status; 0: no response
	tickets []string
}

func startOrderLoad(f *frontDoor) *orderLoad {
	l := &orderLoad{stopc: make(chan struct{}), done: make(chan struct{}), counts: map[int]int{}}
	go func() {
		defer close(l.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		var wg sync.WaitGroup
		defer wg.Wait()
		for i := 0; ; i++ {
			select {
			case <-l.stopc:
				return
			case <-tick.C:
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				code, tk, _ := f.order("load")
				l.mu.Lock()
				defer l.mu.Unlock()
				l.counts[code]++
				if tk != "" {
					l.tickets = append(l.tickets, tk)
				}
			}()
		}
	}()
	return l
}

func (l *orderLoad) stop() {
	select {
	case <-l.stopc:
	default:
		close(l.stopc)
	}
	<-l.done
}

func (l *orderLoad) result() (map[int]int, []string) {
	l.stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts, slices.Clone(l.tickets)
}

// checkPrometheus waits until compose's Prometheus has scraped all three replicas up,
// each seeing Redis and NATS up.
func checkPrometheus(t *testing.T, client *http.Client) {
	t.Helper()
	waitPrometheus(t, client, `up{job="sluice"} == 1`, 3, 2*time.Minute)
	waitPrometheus(t, client, `sluice_dependency_up == 1`, 6, 2*time.Minute)
}

// waitPrometheus waits until the instant query has want series, asking compose's
// Prometheus (port 9091 on the engine's loopback).
func waitPrometheus(t *testing.T, client *http.Client, query string, want int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		resp, err := client.Get("http://127.0.0.1:9091/api/v1/query?query=" + url.QueryEscape(query))
		if err == nil {
			var r struct {
				Status string `json:"status"`
				Data   struct {
					Result []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			last = string(body)
			if json.Unmarshal(body, &r) == nil && r.Status == "success" && len(r.Data.Result) == want {
				return
			}
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			t.Fatalf("Prometheus: %s: want %d series within %s; last answer %s", query, want, within, last)
		}
		time.Sleep(2 * time.Second)
	}
}
