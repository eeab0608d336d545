package dispatcher

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/limiter/childproc"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// processEnv, set in the environment of the test binary, makes it a dispatcher
// process instead of running tests (see TestMain), for tests that stop a dispatcher
// as an operating system does (SIGSTOP): its value is a ProcessSpec in JSON.
const processEnv = "SLUICE_TEST_DISPATCHER"

// ProcessSpec is what a dispatcher process runs: one queue, on NATS at URL, its
// requests tagged X-Test-Replica: Name and X-Test-Start: the delivery's pacing slot.
type ProcessSpec struct {
	URL       string
	Name      string
	Queue     queueconfig.Config
	PinnedTTL time.Duration
	FetchWait time.Duration
	AckWait   time.Duration
}

// runProcess runs the dispatcher of processEnv until SIGTERM, and returns the exit code.
func runProcess() int {
	var spec ProcessSpec
	if err := json.Unmarshal([]byte(os.Getenv(processEnv)), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher process:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	nc, err := nats.Connect(spec.URL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher process:", err)
		return 1
	}
	defer nc.Close()
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(natstest.SigningKey()))
	if err == nil {
		_, err = store.Declare(ctx, spec.Queue)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher process:", err)
		return 1
	}
	client := &http.Client{
		Transport: TagTransport{Name: spec.Name, Base: http.DefaultTransport},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return http.ErrUseLastResponse
		},
	}
	d, err := New(store, WithHTTPClient(client), WithPinnedTTL(spec.PinnedTTL), WithFetchWait(spec.FetchWait),
		WithAckWait(spec.AckWait), WithDeliveryTimeout(2*time.Second))
	if err == nil {
		err = d.Run(ctx)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "dispatcher process:", err)
		return 1
	}
	return 0
}

// TagTransport marks each request with the dispatcher that sent it (X-Test-Replica:
// Name), its pacing slot (X-Test-Start) and attempt (X-Test-Attempt), a real transport
// in front of Base.
type TagTransport struct {
	Name string
	Base http.RoundTripper
}

func (tt TagTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	req.Header.Set("X-Test-Replica", tt.Name)
	if d, ok := DeliveryFrom(req.Context()); ok {
		req.Header.Set("X-Test-Start", d.Start.Format(time.RFC3339Nano))
		req.Header.Set("X-Test-Attempt", fmt.Sprint(d.Attempt))
	}
	return tt.Base.RoundTrip(req)
}

// Process is a dispatcher process started by StartProcess.
type Process struct{ proc *childproc.Process }

// StartProcess starts this test binary as a dispatcher process running spec; it is
// killed when the test ends, and its log shown if the test failed.
func StartProcess(t *testing.T, spec ProcessSpec) *Process {
	t.Helper()
	b, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), processEnv+"="+string(b))
	log := filepath.Join(t.TempDir(), "dispatcher-"+spec.Name+".log")
	proc, err := childproc.Start(cmd, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		proc.Kill()
		if t.Failed() {
			t.Logf("dispatcher process %s:\n%s", spec.Name, childproc.Tail(log, 4000))
		}
	})
	return &Process{proc: proc}
}
