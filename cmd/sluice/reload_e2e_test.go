package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// activeRules is what GET /sluice/v1/rules says of the active set.
type activeRules struct {
	Version string `json:"version"`
	Summary string `json:"summary"`
	Queues  []struct {
		Name string `json:"name"`
	} `json:"queues"`
}

func rulesOf(t *testing.T, p *sluiceProcess) activeRules {
	t.Helper()
	r := send(t, "GET", p.admin+"/sluice/v1/rules", nil)
	var a activeRules
	if r.status != http.StatusOK || json.Unmarshal([]byte(r.body), &a) != nil || a.Version == "" {
		t.Fatalf("GET /sluice/v1/rules: %d %s", r.status, r.body)
	}
	return a
}

// writeRulesFile replaces dir/name at once (write, then rename: the watcher never
// reads half a file; the temporary name is no rules file).
func writeRulesFile(t *testing.T, dir, name, content string) {
	t.Helper()
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

// addedQueueRules is a rules file of its own domain with a route /v1/NAME whose
// second request an hour is deferred to a new queue NAME.
func addedQueueRules(name, downstreamURL string) string {
	return fmt.Sprintf(`domain: e2e-%[1]s
descriptors:
  - key: route
    value: %[1]s
    rate_limit: {unit: hour, requests_per_unit: 1, name: %[1]s}
    algorithm: token_bucket
    on_limit: defer
    queue: %[1]s
routes:
  - name: %[1]s
    match: {method: [POST], path: /v1/%[1]s}
    descriptors:
      - [{key: route, value: %[1]s}]
queues:
  %[1]s:
    outflow: {rate: 50/s}
    downstream: %[2]s
`, name, downstreamURL)
}

func reloadCounter(t *testing.T, p *sluiceProcess, result string) string {
	t.Helper()
	for _, l := range strings.Split(send(t, "GET", p.admin+"/metrics", nil).body, "\n") {
		if v, ok := strings.CutPrefix(l, `sluice_rules_reload_total{result="`+result+`"} `); ok {
			return v
		}
	}
	t.Fatalf("no sluice_rules_reload_total{result=%q}", result)
	return ""
}

// Reloads declare first: a reload that adds a queue is served only once the queue is
// declared, so the very first defer to it, sent the moment the admin API shows the
// new rules, is accepted (202), never 503. Three reloads in a row, each adding one.
func TestReloadDeclaresQueuesFirst(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	dir := t.TempDir()
	writeRulesFile(t, dir, "base.yaml", deferRules(down.URL, "outflow: {rate: 50/s}"))
	p := startSluice(t, append([]string{"--rules", dir, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	mustDefer(t, p.url, "/v1/orders", "before")

	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("added%d", i)
		before := rulesOf(t, p).Version
		writeRulesFile(t, dir, name+".yaml", addedQueueRules(name, down.URL))
		// Poll without pause: the first moment the new set is served is what counts.
		deadline := time.Now().Add(30 * time.Second)
		var now activeRules
		for now = rulesOf(t, p); now.Version == before; now = rulesOf(t, p) {
			if time.Now().After(deadline) {
				t.Fatalf("reload %d was never served", i)
			}
		}
		if want := fmt.Sprintf("%d queues", 2+i); !strings.Contains(now.Summary, want) {
			t.Fatalf("reload %d: summary %q, want %s", i, now.Summary, want)
		}
		if r, err := postOrder(p.url, "/v1/"+name, "first", "{}"); err != nil || r.status != http.StatusOK {
			t.Fatalf("reload %d: the first request, within the limit: %v %d %s", i, err, r.status, r.body)
		}
		r, err := postOrder(p.url, "/v1/"+name, name, `{"order":1}`)
		if err != nil {
			t.Fatal(err)
		}
		a := checkAccepted(t, r) // a 503 here is the bug: the rules live before their queue
		if a.Queue != name {
			t.Errorf("reload %d: accepted into %q", i, a.Queue)
		}
		down.waitArrived(t, []string{a.Ticket}, 30*time.Second)
	}
	if got := reloadCounter(t, p, "success"); got != "3" {
		t.Errorf("successful reloads: %s, want 3", got)
	}
}

// A reload whose queue declaration the NATS server refuses (a max_bytes beyond what
// its store can hold: "insufficient storage resources") is refused as a whole: the old
// set keeps serving, the failure is counted once and logged; the queues the refused
// set changed keep (or get back) the active set's configuration; the background retry
// and SIGHUP try it again without counting it again; the fixed file goes live.
func TestReloadRefusedDeclarationRefusesTheSet(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	dir := t.TempDir()
	base := deferRules(down.URL, "outflow: {rate: 50/s}")
	rulesPath := writeRules(t, dir, base)
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	old := rulesOf(t, p)

	// orders (declared first, by name) slows to 7/s; zz_huge cannot be placed.
	huge := func(maxBytes string) string {
		return deferRules(down.URL, "outflow: {rate: 7/s}") +
			"  zz_huge:\n    outflow: {rate: 1/s}\n    max_bytes: " + maxBytes + "\n    downstream: " + down.URL + "\n"
	}
	writeRules(t, dir, huge("1000TB"))
	waitFor(t, "the refusal logged", 30*time.Second, func() bool {
		return strings.Contains(grepLines(p.output.String(), "rules: new rules refused"), "insufficient storage")
	})
	if now := rulesOf(t, p); now.Version != old.Version || len(now.Queues) != 2 {
		t.Fatalf("after the refused reload the rules are %+v, want the old set %s", now, old.Version)
	}
	if got := reloadCounter(t, p, "failure"); got != "1" {
		t.Errorf("failed reloads: %s, want 1", got)
	}
	// Nothing of the refused set is in force: orders keeps its outflow, zz_huge does
	// not exist, orders still takes defers.
	checkQueues := func(outflow string) {
		t.Helper()
		qs := queuesOf(t, p.admin, "")
		if qs["orders"].Outflow.Configured != outflow {
			t.Errorf("orders outflow %q, want %q", qs["orders"].Outflow.Configured, outflow)
		}
		if _, ok := qs["zz_huge"]; ok {
			t.Errorf("the refused queue exists: %+v", qs["zz_huge"])
		}
	}
	checkQueues("50/s")
	if a := mustDefer(t, p.url, "/v1/orders", "after-refusal"); a.Queue != "orders" {
		t.Errorf("deferred into %q", a.Queue)
	}
	// The background loop retries it (debug log), quietly and uncounted.
	waitFor(t, "a background retry", 30*time.Second, func() bool {
		return strings.Contains(p.output.String(), "rules: new rules still refused")
	})
	// So does SIGHUP.
	if err := p.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the SIGHUP reload refused", 30*time.Second, func() bool {
		return strings.Contains(grepLines(p.output.String(), "rules reload on SIGHUP refused"), "insufficient storage")
	})
	if got := reloadCounter(t, p, "failure"); got != "1" {
		t.Errorf("failed reloads after the retries: %s, want 1", got)
	}
	if now := rulesOf(t, p); now.Version != old.Version {
		t.Fatalf("the refused set went live on a retry")
	}
	checkQueues("50/s")

	// A refused change after an accepted one: orders (first by name) is declared at
	// 7/s, then tiny's max_bytes is refused, and orders is declared back at 50/s.
	// (The background retries repeat that, so orders may read 7/s for a moment.)
	writeRules(t, dir, strings.Replace(deferRules(down.URL, "outflow: {rate: 7/s}"), "    max_depth: 2\n", "    max_depth: 2\n    max_bytes: 1000TB\n", 1))
	waitFor(t, "the second refusal logged", 30*time.Second, func() bool {
		return strings.Contains(grepLines(p.output.String(), "rules: new rules refused"), `queue tiny: queue: unavailable: stream of queue \"tiny\"`)
	})
	waitFor(t, "orders back at 50/s", 30*time.Second, func() bool { return queuesOf(t, p.admin, "")["orders"].Outflow.Configured == "50/s" })
	if now := rulesOf(t, p); now.Version != old.Version {
		t.Fatalf("the refused set went live")
	}
	if got := reloadCounter(t, p, "failure"); got != "2" {
		t.Errorf("failed reloads: %s, want 2", got)
	}

	// Fixed: live, declared as written.
	writeRules(t, dir, huge("10MB"))
	waitFor(t, "the fixed rules served", 30*time.Second, func() bool { return len(rulesOf(t, p).Queues) == 3 })
	qs := queuesOf(t, p.admin, "")
	if qs["orders"].Outflow.Configured != "7/s" || qs["zz_huge"].Orphaned || qs["zz_huge"].Outflow.Configured != "1/s" {
		t.Errorf("queues after the fixed reload: %+v", qs)
	}
	if got := reloadCounter(t, p, "success"); got != "1" {
		t.Errorf("successful reloads: %s, want 1", got)
	}
}
