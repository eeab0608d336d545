package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/ingress/queueapi"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// testQueueKey is the --queue-key of tests whose processes share queues.
var testQueueKey = base64.StdEncoding.EncodeToString(natstest.SigningKey())

// keptQueueKey returns the key that the embedded shape generated in dataDir.
func keptQueueKey(t *testing.T, dataDir string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dataDir, queueKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// A client of the embedded NATS that publishes on sluice.q.> or writes the tickets
// bucket cannot make sluice deliver anything or report anything: made-up, altered and
// wrongly signed orders end as dead letters with reason forged, a forged "done" record
// neither skips the genuine order nor shows on the monitor. The key is generated once
// in the data directory, mode 0600, and a restart uses it again.
func TestForgedOrdersThroughTheBinary(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	down.failing.Store(true) // keeps the genuine order in the queue while we tamper
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL,
		"outflow: {rate: 50/s}\nmax_attempts: 100\nbackoff: {initial: 100ms, max: 300ms}"))
	natsAddr, dataDir := freeAddr(t), t.TempDir()
	args := []string{"--rules", rulesPath, "--upstream", up.URL, "--nats-listen", natsAddr, "--nats-listen-token", testNATSToken, "--data-dir", dataDir}
	p := startSluice(t, args...)

	fi, err := os.Stat(filepath.Join(dataDir, queueKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("key file mode %v", fi.Mode().Perm())
	}
	key := keptQueueKey(t, dataDir)
	if raw, err := base64.StdEncoding.DecodeString(key); err != nil || len(raw) != 32 {
		t.Fatalf("key file holds %q (%v)", key, err)
	}

	warmUp(t, p.url, "/v1/orders")
	a := mustDefer(t, p.url, "/v1/orders", "genuine")
	waitFor(t, "a first failed attempt", 30*time.Second, func() bool { return down.failures.Load() >= 1 })

	// The attacker here holds the NATS token: the signature is what stops it.
	nc, err := nats.Connect("nats://"+natsAddr, nats.Token(testNATSToken))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream, err := js.Stream(ctx, queue.StreamName("orders"))
	if err != nil {
		t.Fatal(err)
	}
	raw, err := stream.GetLastMsgForSubject(ctx, "sluice.q.orders."+a.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	copyOf := func(tamper func(*nats.Msg)) *nats.Msg {
		msg := nats.NewMsg(raw.Subject)
		for k, vs := range raw.Header {
			if k != queue.HeaderMsgID && k != jetstream.ExpectedStreamHeader {
				msg.Header[k] = append([]string(nil), vs...)
			}
		}
		msg.Data = bytes.Clone(raw.Data)
		tamper(msg)
		return msg
	}
	made := 0
	madeUp := func(path string) func(*nats.Msg) {
		made++
		tk := strings.Repeat(string(rune('a'+made)), 26) // a ticket's shape, never parked
		return func(m *nats.Msg) {
			m.Subject = "sluice.q.orders." + tk
			m.Header.Set(queue.HeaderTicket, tk)
			m.Header.Set(queue.HeaderPath, path)
			m.Header.Del(queue.HeaderSignature)
			m.Data = []byte(`{"order":"made up"}`)
		}
	}
	forged := []*nats.Msg{
		copyOf(func(m *nats.Msg) { m.Data = bytes.Replace(m.Data, []byte("genuine"), []byte("genuinf"), 1) }),
		copyOf(func(m *nats.Msg) {
			m.Header.Set(queue.HeaderSignature, "v1="+base64.StdEncoding.EncodeToString(make([]byte, 32)))
		}),
		copyOf(madeUp("/v1/orders")),
		copyOf(madeUp("@evil.example/x")),
	}
	for _, msg := range forged {
		if _, err := js.PublishMsg(ctx, msg); err != nil {
			t.Fatal(err)
		}
	}
	kv, err := js.KeyValue(ctx, queue.TicketsBucket)
	if err != nil {
		t.Fatal(err)
	}
	fake, _ := json.Marshal(queue.Record{Ticket: a.Ticket, Queue: "orders", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 200, Body: []byte("forged result")}})
	if _, err := kv.Put(ctx, a.Ticket, fake); err != nil {
		t.Fatal(err)
	}
	if st, r := getStatus(t, p.url, a.Ticket); r.status != 200 || st.Status == "done" || strings.Contains(r.body, "forged") {
		t.Fatalf("monitor serves the forged record: %d %s", r.status, r.body)
	}

	down.failing.Store(false)
	st := waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	if st.Result == nil || st.Result.Status != 201 || !strings.Contains(st.Result.Body, `"genuine"`) {
		t.Errorf("genuine order's result: %+v", st.Result)
	}
	var listed []queueapi.DeadLetterView
	waitFor(t, "four forged dead letters", 30*time.Second, func() bool {
		code, stdout, _ := runSluice(t, "dlq", "list", "--json", "orders", "--nats", "nats://"+natsAddr, "--nats-token", testNATSToken, "--queue-key", key)
		listed = nil
		return code == 0 && json.Unmarshal([]byte(stdout), &listed) == nil && len(listed) == 4
	})
	for _, dl := range listed {
		if !strings.HasPrefix(dl.Reason, "forged: ") {
			t.Errorf("dead letter %s: reason %q", dl.Ticket, dl.Reason)
		}
	}
	order, count, _ := down.snapshot()
	if len(order) != 1 || order[0] != a.Ticket || count[a.Ticket] != 1 {
		t.Errorf("downstream accepted %v %v; want the genuine order once", order, count)
	}
	if got := down.started.Load() - down.failures.Load(); got != 1 {
		t.Errorf("%d requests reached the downstream beyond the failed attempts, want 1", got)
	}
	if m := send(t, "GET", p.admin+"/metrics", nil).body; !strings.Contains(m, `sluice_queue_rejected_total{queue="orders",reason="forged"} 4`) {
		t.Errorf("metrics:\n%s", grepLines(m, "sluice_queue_"))
	}

	// A key file that others may read is refused; a restart on the data directory
	// uses the kept key (orders parked before it still verify).
	if code := p.stop(t); code != 0 {
		t.Fatalf("serve exit %d", code)
	}
	keyPath := filepath.Join(dataDir, queueKeyFile)
	if err := os.Chmod(keyPath, 0o644); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runSluice(t, append([]string{"serve", "--listen", freeAddr(t), "--admin-listen", freeAddr(t)}, args...)...)
	if code != 1 || !strings.Contains(stderr, keyPath) || !strings.Contains(stderr, "may be read by others") {
		t.Errorf("serve with a readable key file: exit %d\n%s", code, stderr)
	}
	if err := os.Chmod(keyPath, 0o600); err != nil {
		t.Fatal(err)
	}
	down.failing.Store(true)
	failed := down.failures.Load()
	p = startSluice(t, args...)
	warmUp(t, p.url, "/v1/orders") // the memory limiter starts afresh
	b := mustDefer(t, p.url, "/v1/orders", "parked before a restart")
	waitFor(t, "a failed attempt", 30*time.Second, func() bool { return down.failures.Load() > failed })
	if code := p.stop(t); code != 0 {
		t.Fatalf("serve exit %d", code)
	}
	down.failing.Store(false)
	p = startSluice(t, args...)
	waitStatus(t, p.url, b.Ticket, "done", 30*time.Second)
	if got := keptQueueKey(t, dataDir); got != key {
		t.Errorf("the key file changed across restarts")
	}
}
