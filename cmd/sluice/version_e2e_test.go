package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter/childproc"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// oldestNATS is the oldest nats-server sluice supports (queue.MinServerVersion), as a
// module version to build.
const oldestNATS = "v" + queue.MinServerVersion

// tooOldNATS returns a nats-server binary of this machine that is older than sluice
// needs, and its version: Debian's (2.9 on bookworm, in /usr/sbin, off a user's PATH).
// On Linux under CI a missing one fails the test (.ci/test installs Debian's
// nats-server); elsewhere, or when the installed one is recent enough, it skips.
func tooOldNATS(t *testing.T) (path, version string) {
	t.Helper()
	for _, name := range []string{"nats-server", "/usr/sbin/nats-server"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		out, err := exec.Command(p, "--version").Output()
		m := regexp.MustCompile(`v(\d+\.\d+\.\d+)`).FindSubmatch(out)
		if err != nil || m == nil {
			t.Fatalf("%s --version: %v %q", p, err, out)
		}
		version = string(m[1])
		if strings.HasPrefix(version, "2.9.") || strings.HasPrefix(version, "2.10.") {
			return p, version
		}
		t.Skipf("%s is nats-server %s, not older than %s: nothing too old to try", p, version, queue.MinServerVersion)
	}
	if runtime.GOOS == "linux" && os.Getenv("CI") != "" {
		t.Fatal("nats-server is not installed (apt-get install nats-server; .ci/test installs it)")
	}
	t.Skip("no nats-server installed: the message for a server too old is not tested")
	return "", ""
}

// startNATSBinary runs the nats-server at bin alone, with JetStream in a temporary
// directory, on a free loopback port, until the test ends, and returns its URL.
func startNATSBinary(t *testing.T, bin string) string {
	t.Helper()
	addr := freeAddr(t)
	host, port, _ := net.SplitHostPort(addr)
	proc, err := childproc.Start(exec.Command(bin, "-a", host, "-p", port, "-js", "-sd", t.TempDir()), filepath.Join(t.TempDir(), "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proc.Kill)
	if err := proc.WaitReady(context.Background(), 30*time.Second, 20*time.Millisecond, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		t.Fatalf("%s: %v", bin, err)
	}
	return "nats://" + addr
}

// On a nats-server older than sluice needs (Debian's 2.9), `sluice serve --nats`
// names the version it found, the one it needs and what for, once a minute while it
// retries; /readyz fails on it, defers answer 503, and `sluice dlq` exits with the
// same message. The proxy keeps serving what is within the limits.
func TestNATSServerTooOld(t *testing.T) {
	t.Parallel()
	bin, version := tooOldNATS(t)
	url := startNATSBinary(t, bin)
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL, "--nats", url, "--queue-key", testQueueKey}, dispatchFlags...)...)

	want := fmt.Sprintf("nats-server %s is too old for sluice's queues (per-message TTLs, pinned priority groups, consumer pause): it needs nats-server %s or later", version, queue.MinServerVersion)
	// Declaring is retried with a backoff from 250ms: three retries take seconds, far
	// less than the minute between two messages.
	waitFor(t, "the message and three retries", 60*time.Second, func() bool {
		out := p.output.String()
		return strings.Contains(out, want) && strings.Count(out, "queues still not declared") >= 3
	})
	if n := strings.Count(p.output.String(), "the NATS server is too old for sluice"); n != 1 {
		t.Errorf("the message was logged %d times within the first minute, want once:\n%s", n, p.output)
	}
	r := send(t, "GET", p.admin+"/readyz", nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "nats-version") || !strings.Contains(r.body, version) {
		t.Errorf("/readyz: %d %s, want 503 naming the server version", r.status, r.body)
	}
	warmUp(t, p.url, "/v1/orders")
	if r, err := postOrder(p.url, "/v1/orders", "o1", "{}"); err != nil || r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" {
		t.Errorf("a defer on a server too old: %+v %v, want 503 with Retry-After", r, err)
	}
	code, _, stderr := runSluice(t, "dlq", "list", "orders", "--nats", url, "--queue-key", testQueueKey)
	if code == exitOK || !strings.Contains(stderr, want) {
		t.Errorf("dlq on a server too old: exit %d, want a failure naming the versions:\n%s", code, stderr)
	}
}

// On the oldest nats-server sluice supports (queue.MinServerVersion, built from the
// module at that version), a three-node cluster with R3 streams: every feature but
// scheduled delivery works (callbacks, idempotency keys, lanes, a nats: downstream,
// dead letters); the queue with max_delay is refused at load with a message naming
// the versions, and the rest runs and is ready.
func TestOldestNATSServer(t *testing.T) {
	t.Parallel()
	bin, err := natstest.ServerBinaryAt(oldestNATS)
	if err != nil {
		t.Fatal(err)
	}
	cluster := natstest.StartCluster(t, 3, natstest.WithServerBinary(bin))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	js, err := jetstream.New(cluster.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"},
		Storage: jetstream.FileStorage, Replicas: 3}); err != nil {
		t.Fatal(err)
	}
	mail := make(chan *nats.Msg, 4)
	nc := cluster.Connect(t)
	if _, err := nc.ChanSubscribe("notifications.email.paced", mail); err != nil {
		t.Fatal(err)
	}

	p, receiver, down := startEveryFeature(t, cluster.URL())

	refused := fmt.Sprintf(`queue later: queue: invalid config: queue \"later\": nats-server %s is too old for scheduled delivery (delay, max_delay): it needs nats-server %s or later`,
		queue.MinServerVersion, queue.MinScheduleServerVersion)
	// The refusal is also part of the retry's warning while another queue waits for
	// the cluster (an R3 stream slow to form): only "refused" says that the rest is
	// declared and the refusal is all that is left.
	waitFor(t, "the scheduled queue refused and the rest declared", 60*time.Second, func() bool {
		out := p.output.String()
		return strings.Contains(out, refused) && strings.Contains(out, "queues of the rules refused")
	})
	for _, path := range []string{"/v1/orders", "/v1/lanes", "/v1/mail"} {
		warmUp(t, p.url, path)
	}
	ok := mustDefer(t, p.url, "/v1/orders", "ok-1", "Sluice-Callback", receiver.URL+"/hooks/sluice", "Idempotency-Key", `"old-1"`)
	lane := mustDefer(t, p.url, "/v1/lanes", "lane-1", "X-Tenant", "tenant-a", "X-Priority", "high")
	m := mustDefer(t, p.url, "/v1/mail", "mail-1")
	for _, a := range []accepted{ok, lane, m} {
		waitStatus(t, p.url, a.Ticket, "done", 60*time.Second)
	}
	waitFor(t, "the callback", 60*time.Second, func() bool { return len(receiver.received()) > 0 })
	select {
	case <-mail:
	case <-time.After(30 * time.Second):
		t.Error("nothing was published on notifications.email.paced")
	}
	down.failing.Store(true)
	bad := mustDefer(t, p.url, "/v1/orders", "bad-1")
	waitStatus(t, p.url, bad.Ticket, "dead", 60*time.Second)

	if r := send(t, "GET", p.admin+"/readyz", nil); r.status != http.StatusOK {
		t.Errorf("/readyz: %d %s, want ready: only the scheduled queue is refused", r.status, r.body)
	}
	warmUp(t, p.url, "/v1/later")
	r, err := postOrder(p.url, "/v1/later", "later-1", "{}", "Sluice-Not-Before", "5")
	if err != nil || r.status == http.StatusAccepted {
		t.Errorf("a scheduled order on %s: %+v %v, want no 202", queue.MinServerVersion, r, err)
	}
	t.Logf("a defer to the refused queue: %d %s", r.status, r.body)
}
