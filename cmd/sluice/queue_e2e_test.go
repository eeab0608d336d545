package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/queueapi"
)

// renamedRules are deferRules with the orders queue renamed.
func renamedRules(downstreamURL, name string) string {
	r := deferRules(downstreamURL, "outflow: {rate: 20/s}")
	r = strings.ReplaceAll(r, "queue: orders\n", "queue: "+name+"\n")
	return strings.ReplaceAll(r, "\n  orders:\n", "\n  "+name+":\n")
}

func queuesOf(t *testing.T, admin, token string) map[string]queueapi.QueueView {
	t.Helper()
	r := send(t, "GET", admin+"/sluice/v1/queues", nil, "Authorization", "Bearer "+token)
	var out struct {
		Queues []queueapi.QueueView `json:"queues"`
	}
	if r.status != 200 || json.Unmarshal([]byte(r.body), &out) != nil {
		t.Fatalf("GET /sluice/v1/queues: %d %s", r.status, r.body)
	}
	m := map[string]queueapi.QueueView{}
	for _, q := range out.Queues {
		m[q.Name] = q
	}
	return m
}

// Five orders parked, the queue renamed in the rules, sluice restarted: the old queue
// is reported (log, gauge, API) and drains with the configuration it was declared
// with; its tickets end done; a cancelled one is never delivered; sluice queue retire
// refuses while it holds orders and deletes it once empty.
func TestRenamedQueueDrains(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	dir, dataDir := t.TempDir(), t.TempDir()
	const token = "op-token"
	oldRules := writeRules(t, dir, deferRules(down.URL, "outflow: {rate: 20/s}"))
	common := []string{"--upstream", up.URL, "--data-dir", dataDir, "--admin-token", token}

	// 1. Park without dispatching; cancel one of them.
	p := startSluice(t, append(common, "--rules", oldRules, "--dispatch=false")...)
	warmUp(t, p.url, "/v1/orders")
	var tickets []string
	for i := range 5 {
		tickets = append(tickets, mustDefer(t, p.url, "/v1/orders", fmt.Sprintf("o%d", i)).Ticket)
	}
	cancelled := mustDefer(t, p.url, "/v1/orders", "cancel-me").Ticket
	if r := send(t, "DELETE", p.url+"/sluice/v1/deferred/"+cancelled, nil); r.status != http.StatusNoContent {
		t.Fatalf("cancel: %d %s", r.status, r.body)
	}
	if r := send(t, "DELETE", p.url+"/sluice/v1/deferred/"+strings.Repeat("a", 26), nil); r.status != http.StatusNotFound {
		t.Errorf("cancel an unknown ticket: %d", r.status)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("stop: %d", code)
	}

	// 2. The queue is renamed; still no dispatching: orphaned, reported, not retirable.
	newDir := t.TempDir()
	newRules := writeRules(t, newDir, renamedRules(down.URL, "orders_v2"))
	p = startSluice(t, append(common, "--rules", newRules, "--dispatch=false")...)
	waitFor(t, "the orphan log line", 10*time.Second, func() bool {
		return strings.Contains(grepLines(p.output.String(), "queue left the rules"), "queue=orders ")
	})
	metrics := send(t, "GET", p.admin+"/metrics", nil, "Authorization", "Bearer "+token).body
	if !strings.Contains(metrics, `sluice_queue_orphaned{queue="orders"} 1`) || !strings.Contains(metrics, `sluice_queue_orphaned{queue="orders_v2"} 0`) {
		t.Errorf("orphaned gauge:\n%s", grepLines(metrics, "sluice_queue_orphaned"))
	}
	qs := queuesOf(t, p.admin, token)
	if o := qs["orders"]; !o.Orphaned || o.Depth != 5 || o.Outflow.Configured != "20/s" || qs["orders_v2"].Orphaned {
		t.Errorf("queues API: %+v", qs)
	}
	st, _ := getStatus(t, p.url, tickets[0])
	if st.Status != "queued" || st.Queue != "orders" {
		t.Errorf("status of an orphaned ticket: %+v", st)
	}
	code, stdout, stderr := runSluice(t, "queue", "retire", "orders", "--admin", p.admin, "--admin-token", token)
	if code != 1 || !strings.Contains(stderr, "409") || !strings.Contains(stderr, "5 orders queued") {
		t.Errorf("retire a queue holding orders: %d %s %s", code, stdout, stderr)
	}
	code, _, stderr = runSluice(t, "queue", "retire", "orders_v2", "--admin", p.admin, "--admin-token", token)
	if code != 1 || !strings.Contains(stderr, "rules") {
		t.Errorf("retire a declared queue: %d %s", code, stderr)
	}
	if code := p.stop(t); code != 0 {
		t.Fatalf("stop: %d", code)
	}

	// 3. With dispatchers: every order of the old queue is delivered and done.
	p = startSluice(t, append(append(common, "--rules", newRules), dispatchFlags...)...)
	for _, tk := range tickets {
		if st := waitStatus(t, p.url, tk, "done", 60*time.Second); st.Result == nil || st.Result.Status != 201 {
			t.Errorf("ticket %s: %+v", tk, st)
		}
	}
	down.waitArrived(t, tickets, 10*time.Second)
	if n := down.arrived([]string{cancelled}); n != 0 {
		t.Errorf("the cancelled order was delivered")
	}
	if st, _ := getStatus(t, p.url, cancelled); st.Status != "cancelled" {
		t.Errorf("cancelled ticket: %+v", st)
	}
	code, stdout, stderr = runSluice(t, "queue", "list", "--admin", p.admin, "--admin-token", token)
	if code != 0 || !strings.Contains(stdout, "ORPHANED") || !strings.Contains(stdout, "orders_v2") {
		t.Errorf("queue list: %d %s %s", code, stdout, stderr)
	}
	t.Logf("sluice queue list:\n%s", stdout)
	waitFor(t, "the old queue to be empty", 20*time.Second, func() bool { return queuesOf(t, p.admin, token)["orders"].Depth == 0 })
	code, stdout, stderr = runSluice(t, "queue", "retire", "orders", "--admin", p.admin, "--admin-token", token)
	if code != 0 || !strings.Contains(stdout, "retired queue orders") {
		t.Fatalf("retire: %d %s %s", code, stdout, stderr)
	}
	if _, ok := queuesOf(t, p.admin, token)["orders"]; ok {
		t.Error("the retired queue is still listed")
	}
	if m := send(t, "GET", p.admin+"/metrics", nil, "Authorization", "Bearer "+token).body; strings.Contains(m, `sluice_queue_orphaned{queue="orders"}`) {
		t.Error("the retired queue still has its gauge")
	}
	// The achieved outflow is measured once two samples 5 s apart exist.
	waitFor(t, "a measured achieved outflow", 30*time.Second, func() bool {
		return queuesOf(t, p.admin, token)["orders_v2"].Outflow.AchievedPerSecond != nil
	})

	// 4. A reload that drops a queue reports it too.
	writeRules(t, newDir, deferRules(down.URL, "outflow: {rate: 20/s}"))
	waitFor(t, "the orphan log line on reload", 30*time.Second, func() bool {
		return strings.Contains(grepLines(p.output.String(), "queue left the rules"), "queue=orders_v2 ")
	})
	if !queuesOf(t, p.admin, token)["orders_v2"].Orphaned || queuesOf(t, p.admin, token)["orders"].Orphaned {
		t.Errorf("after the reload: %+v", queuesOf(t, p.admin, token))
	}
}

// A downstream's Retry-After of an hour pauses the queue; sluice queue resume ends it
// and the order is delivered. An operator's pause holds orders until resumed. The
// admin API needs its token.
func TestQueuePauseResume(t *testing.T) {
	t.Parallel()
	var throttle atomic.Bool
	throttle.Store(true)
	var delivered atomic.Int64
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if throttle.Swap(false) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		delivered.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(down.Close)
	up := newUpstream(t, 0)
	const token = "op-token"
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 20/s}"))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL, "--admin-token", token}, dispatchFlags...)...)
	admin := []string{"--admin", p.admin, "--admin-token", token}

	if code, _, stderr := runSluice(t, "queue", "list", "--admin", p.admin); code != 1 || !strings.Contains(stderr, "401") {
		t.Errorf("queue list without the token: %d %s", code, stderr)
	}
	warmUp(t, p.url, "/v1/orders")
	a := mustDefer(t, p.url, "/v1/orders", "a")
	waitFor(t, "the downstream's pause", 30*time.Second, func() bool {
		pu := queuesOf(t, p.admin, token)["orders"].PausedUntil
		return pu != nil && time.Until(*pu) > 30*time.Minute
	})
	code, stdout, stderr := runSluice(t, append([]string{"queue", "resume", "orders"}, admin...)...)
	if code != 0 || !strings.Contains(stdout, "orders") {
		t.Fatalf("resume: %d %s %s", code, stdout, stderr)
	}
	waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)

	code, stdout, stderr = runSluice(t, append([]string{"queue", "pause", "orders", "--for", "1h", "--json"}, admin...)...)
	var v queueapi.QueueView
	if code != 0 || json.Unmarshal([]byte(stdout), &v) != nil || v.PausedUntil == nil {
		t.Fatalf("pause: %d %s %s", code, stdout, stderr)
	}
	b := mustDefer(t, p.url, "/v1/orders", "b")
	time.Sleep(2 * time.Second) // a delivery now would be a bug, whatever the load
	if st, _ := getStatus(t, p.url, b.Ticket); st.Status != "queued" || delivered.Load() != 1 {
		t.Errorf("paused queue delivered: %+v (%d deliveries)", st, delivered.Load())
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "pause", "orders", "--for", "soon"}, admin...)...); code != 1 || !strings.Contains(stderr, "400") {
		t.Errorf("pause --for soon: %d %s", code, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "pause", "orders"}, admin...)...); code != 2 {
		t.Errorf("pause without --for: %d %s", code, stderr)
	}
	if code, _, stderr := runSluice(t, append([]string{"queue", "show", "../etc"}, admin...)...); code != 2 {
		t.Errorf("show ../etc: %d %s", code, stderr)
	}
	if code, _, _ := runSluice(t, append([]string{"queue", "resume", "orders"}, admin...)...); code != 0 {
		t.Fatal("resume failed")
	}
	waitStatus(t, p.url, b.Ticket, "done", 30*time.Second)
	// dlq through the admin API while serve holds the data directory.
	code, _, stderr = runSluice(t, append([]string{"dlq", "list", "orders"}, admin...)...)
	if code != 0 || !strings.Contains(stderr, "no dead letters") {
		t.Errorf("dlq list --admin: %d %s", code, stderr)
	}
	// An empty list is [] in JSON, as through the data directory (TestDeadLetterRequeue).
	code, stdout, stderr = runSluice(t, append([]string{"dlq", "list", "orders", "--json"}, admin...)...)
	if code != 0 || strings.TrimSpace(stdout) != "[]" {
		t.Errorf("dlq list --json --admin: %d %q %s", code, stdout, stderr)
	}
	// The path in an error is the path asked for, with its leading slash.
	code, _, stderr = runSluice(t, append([]string{"queue", "show", "nope"}, admin...)...)
	if code != 1 || !strings.Contains(stderr, "sluice queue show: admin API GET /sluice/v1/queues/nope: 404 Not Found") {
		t.Errorf("queue show nope: %d %s", code, stderr)
	}
}

// TestDLQDefaultsToTheAdminAPI: sluice dlq without --admin, --nats or --data-dir asks
// the admin API at the default --admin-listen, as sluice queue does. (It needs
// 127.0.0.1:9090 for the fake sluice that answers there: a machine where another
// process holds it skips.)
func TestDLQDefaultsToTheAdminAPI(t *testing.T) {
	ln, err := net.Listen("tcp", strings.TrimPrefix(defaultAdminURL, "http://"))
	if err != nil {
		t.Skipf("the default admin address is in use here: %v", err)
	}
	var asked atomic.Value
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Store(r.Method + " " + r.URL.Path)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"dead_letters":[]}`))
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	code, stdout, stderr := runIn(t, "dlq", "list", "orders", "--json")
	if code != exitOK || strings.TrimSpace(stdout) != "[]" || asked.Load() != "GET /sluice/v1/queues/orders/dead" {
		t.Errorf("dlq list: exit %d, stdout %q, stderr %q, asked %v", code, stdout, stderr, asked.Load())
	}
	// --data-dir names the queues directly: the admin API is not asked.
	asked.Store("")
	code, _, stderr = runIn(t, "dlq", "list", "orders", "--data-dir", filepath.Join(t.TempDir(), "none"))
	if code != exitFailure || !strings.Contains(stderr, "no sluice data in --data-dir") || asked.Load() != "" {
		t.Errorf("dlq list --data-dir: exit %d, stderr %q, asked %v", code, stderr, asked.Load())
	}
	// Nothing at the default: the default data directory instead, said so.
	srv.Close()
	code, _, stderr = runIn(t, "dlq", "list", "orders")
	if code != exitFailure || !strings.Contains(stderr, "no sluice answers at --admin "+defaultAdminURL+"; opening --data-dir sluice-data") {
		t.Errorf("dlq list with nothing at the default: exit %d, stderr %q", code, stderr)
	}
}
