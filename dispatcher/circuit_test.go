package dispatcher_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// flappingServer is a real HTTP downstream on a fixed port that can be stopped (port
// closed: connections refused) and started again.
type flappingServer struct {
	addr string
	mu   sync.Mutex
	srv  *http.Server
	ok   map[string]int
}

func (f *flappingServer) start(t *testing.T) {
	t.Helper()
	var l net.Listener
	var err error
	for i := 0; ; i++ { // the port may be held for a moment after the stop
		if l, err = net.Listen("tcp", f.addr); err == nil {
			break
		}
		if i == 100 {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		f.mu.Lock()
		f.ok[r.Header.Get("Idempotency-Key")]++
		f.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	})}
	f.mu.Lock()
	f.srv = srv
	f.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (f *flappingServer) stop() {
	f.mu.Lock()
	srv := f.srv
	f.srv = nil
	f.mu.Unlock()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
}

func (f *flappingServer) delivered() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.ok)
}

// A downstream whose port is closed for a while pauses the queue (circuit open) instead
// of costing the orders their attempts: with max_attempts 2 nothing is dead-lettered,
// every order ends done with 0 failed attempts, and the circuit shows in the metrics
// and the log once per state change.
func TestDownstreamDownOpensCircuit(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ds := &flappingServer{addr: l.Addr().String(), ok: map[string]int{}}
	l.Close()
	ds.start(t)
	t.Cleanup(ds.stop)

	srv := natstest.Start(t)
	cfg := baseConfig("flaky", "http://"+ds.addr)
	cfg.Outflow = limiter.PerSecond(20)
	cfg.MaxAttempts = 2
	store, _ := openStore(t, srv.Conn, cfg)
	tickets := park(t, store, "flaky", 0, 40)

	reg := prometheus.NewRegistry()
	var logs lockedBuffer
	// No keep-alive: every attempt dials, so that a stopped server means refused
	// connections rather than a request cut on a pooled connection.
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	startReplica(t, srv, cfg, "a", dispatcher.WithRegisterer(reg), dispatcher.WithHTTPClient(client),
		dispatcher.WithCircuit(3, 2*time.Second),
		dispatcher.WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))

	waitFor(t, "some deliveries", 30*time.Second, func() bool { return ds.delivered() >= 5 })
	ds.stop()
	waitFor(t, "the circuit to open", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_queue_circuit_open", "queue", "flaky") == 1
	})
	// Down for a while longer: several probes fail.
	waitFor(t, "failed probes", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_queue_retried_total", "queue", "flaky", "reason", "circuit") >= 3
	})
	ds.start(t)
	waitFor(t, "every order", 60*time.Second, func() bool { return ds.delivered() == len(tickets) })
	waitFor(t, "the circuit to close", 10*time.Second, func() bool {
		return gather(t, reg, "sluice_queue_circuit_open", "queue", "flaky") == 0
	})
	for _, tk := range tickets {
		var st *queue.Record
		waitFor(t, "status done", 20*time.Second, func() bool {
			st, err = store.Status(ctxT(t), tk)
			return err == nil && st.Status == queue.StatusDone
		})
		if st.Attempts != 1 { // the one that delivered it
			t.Errorf("order %s lost %d attempts to a downstream that was down", tk, st.Attempts-1)
		}
	}
	if dead, err := store.DeadLetters(ctxT(t), "flaky", 0); err != nil || len(dead) != 0 {
		t.Errorf("dead letters: %d %v", len(dead), err)
	}
	out := logs.String()
	if n := strings.Count(out, "circuit open"); n != 1 {
		t.Errorf("%d log lines for the circuit opening, want 1:\n%s", n, out)
	}
	if n := strings.Count(out, "circuit closed"); n != 1 {
		t.Errorf("%d log lines for the circuit closing, want 1:\n%s", n, out)
	}
	t.Logf("probes while down: %.0f", gather(t, reg, "sluice_queue_retried_total", "queue", "flaky", "reason", "circuit"))
}

// A nats: downstream whose stream disappears after the declaration is a downstream
// that is down: the circuit opens and the orders wait, attempts unchanged, until a
// stream captures the subject again.
func TestNATSDownstreamWithoutStreamWaits(t *testing.T) {
	srv := natstest.Start(t)
	js, _ := jetstream.New(srv.Conn)
	streamCfg := jetstream.StreamConfig{Name: "OUT", Subjects: []string{"orders.out"}}
	if _, err := js.CreateStream(ctxT(t), streamCfg); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig("tojs", "nats:orders.out")
	cfg.MaxAttempts = 1
	store, _ := openStore(t, srv.Conn, cfg)
	reg := prometheus.NewRegistry()
	startReplica(t, srv, cfg, "a", dispatcher.WithRegisterer(reg), dispatcher.WithCircuit(2, time.Second))
	if err := js.DeleteStream(ctxT(t), "OUT"); err != nil {
		t.Fatal(err)
	}
	tickets := park(t, store, "tojs", 0, 5)
	waitFor(t, "the circuit to open", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_queue_circuit_open", "queue", "tojs") == 1
	})
	out, err := js.CreateStream(ctxT(t), streamCfg)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "every order in the stream", 30*time.Second, func() bool {
		info, err := out.Info(ctxT(t))
		return err == nil && info.State.Msgs == uint64(len(tickets))
	})
	for _, tk := range tickets {
		var st *queue.Record
		waitFor(t, "status done", 20*time.Second, func() bool {
			st, err = store.Status(ctxT(t), tk)
			return err == nil && st.Status == queue.StatusDone
		})
		if st.Attempts != 1 { // the one that delivered it
			t.Errorf("order %s: %d attempts counted while no stream captured the subject", tk, st.Attempts-1)
		}
	}
}
