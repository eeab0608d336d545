package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	cdplog "github.com/chromedp/cdproto/log"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/sluicehq/sluice/queue/natstest"
)

// chromiumPath finds the browser the console test drives. On Linux under CI a missing
// browser fails the test (.ci/test installs Debian's chromium); elsewhere it skips.
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if runtime.GOOS == "linux" && os.Getenv("CI") == "true" {
		t.Fatal("chromium is not installed (apt-get install chromium; .ci/test installs it)")
	}
	t.Skip("no chromium on this machine")
	return ""
}

// browserLog collects what the pages report as errors: console.error and
// console.warn calls, uncaught exceptions, and the browser's own error entries
// (failed loads, CSP violations).
type browserLog struct {
	mu   sync.Mutex
	errs []string
}

func (b *browserLog) add(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.errs = append(b.errs, s)
}

func (b *browserLog) take() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.errs
	b.errs = nil
	return e
}

func (b *browserLog) listen(ev any) {
	switch ev := ev.(type) {
	case *cdpruntime.EventConsoleAPICalled:
		if ev.Type == cdpruntime.ConsoleAPICalledTypeError || ev.Type == cdpruntime.ConsoleAPICalledTypeWarning || ev.Type == cdpruntime.ConsoleAPICalledTypeAssert {
			var args []string
			for _, a := range ev.Args {
				args = append(args, string(a.Value)+a.Description)
			}
			b.add(fmt.Sprintf("console.%s: %s", ev.Type, strings.Join(args, " ")))
		}
	case *cdpruntime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.add("exception: " + msg)
	case *cdplog.EventEntryAdded:
		if ev.Entry.Level == cdplog.EntryLevelError || ev.Entry.Level == cdplog.EntryLevelWarning {
			b.add(fmt.Sprintf("browser %s: %s %s", ev.Entry.Level, ev.Entry.Text, ev.Entry.URL))
		}
	}
}

// The console in a real browser against a real `sluice serve`: sign-in, every page
// loads without a console error, a queue is paused and resumed, a dead letter is
// requeued (and delivered) and another purged after the typed confirmation. With
// SLUICE_SCREENSHOTS=DIR it writes a PNG of each page there.
func TestConsoleInBrowser(t *testing.T) {
	chromiumPath(t) // skips without chromium, before anything starts
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	down.failing.Store(true)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL,
		"outflow: {rate: 50/s}\nmax_attempts: 2\nbackoff: {initial: 50ms, max: 200ms}"))
	const token = "console-e2e-token-0123456789"
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--admin-token", token)

	// Decisions for the overview, and two dead letters.
	warmUp(t, p.url, "/v1/orders")
	requeued := mustDefer(t, p.url, "/v1/orders", "requeue-me").Ticket
	purged := mustDefer(t, p.url, "/v1/orders", "purge-me").Ticket
	waitStatus(t, p.url, requeued, "dead", 20*time.Second)
	waitStatus(t, p.url, purged, "dead", 20*time.Second)

	b := newConsoleBrowser(t)

	b.run("sign-in page", chromedp.Navigate(p.admin+"/console/"), chromedp.WaitVisible(idSel("token")))
	b.screenshot("login")
	b.run("wrong token", chromedp.SendKeys(idSel("token"), "wrong"), chromedp.Click(idSel("signin")), chromedp.WaitVisible(idSel("failed")))
	if failed := b.text("#failed"); !strings.Contains(failed, "not the admin token") {
		t.Errorf("wrong token: %q", failed)
	}
	b.run("sign in", chromedp.SetValue(idSel("token"), token), chromedp.Click(idSel("signin")), chromedp.WaitVisible(idSel("logout")),
		waitJS(`document.body.dataset.ready === "1"`))

	// Overview: orders for the tiny queue (one allowed, then deferred until it is full,
	// then refused) while the page turns two readings, 2 s apart, into rates.
	stopTraffic := make(chan struct{})
	trafficDone := make(chan struct{})
	go func() {
		defer close(trafficDone)
		for i := 0; ; i++ {
			select {
			case <-stopTraffic:
				return
			case <-time.After(50 * time.Millisecond):
			}
			_, _ = postOrder(p.url, "/v1/tiny", fmt.Sprintf("tiny-%d", i), "{}")
		}
	}()
	b.run("overview", waitJS(`[...document.querySelectorAll("#decisions tbody td")].some(td => td.textContent === "tiny")`),
		waitJS(`parseFloat(document.querySelector("#outcome-cards .card.deferred .v").textContent) > 0`))
	close(stopTraffic)
	<-trafficDone
	if decisions := b.text("#decisions"); !strings.Contains(decisions, "orders") || !strings.Contains(decisions, "tiny") {
		t.Errorf("overview table: %q", decisions)
	}
	b.screenshot("overview")

	// Queues: pause orders for 15 minutes, then resume it.
	pausedUntil := `document.querySelector('tr[data-queue="orders"] .paused-until').textContent`
	b.run("queues", consolePage("queues"), chromedp.WaitVisible(cssSel(`tr[data-queue="orders"]`)),
		chromedp.Click(cssSel(`button.pause[data-queue="orders"]`)), waitJS(pausedUntil+` !== "–"`))
	b.screenshot("queues")
	if q := queuesOf(t, p.admin, token)["orders"]; q.PausedUntil == nil || time.Until(*q.PausedUntil) < 10*time.Minute {
		t.Errorf("after Pause the API shows paused_until %v", q.PausedUntil)
	}
	b.run("resume", chromedp.Click(cssSel(`button.resume[data-queue="orders"]`)), waitJS(pausedUntil+` === "–"`))
	if q := queuesOf(t, p.admin, token)["orders"]; q.PausedUntil != nil && time.Until(*q.PausedUntil) > 0 {
		t.Errorf("after Resume the API shows paused_until %v", q.PausedUntil)
	}

	// Ticket lookup.
	b.run("tickets", consolePage("tickets"), chromedp.WaitVisible(idSel("ticket-input")),
		chromedp.SendKeys(idSel("ticket-input"), requeued), chromedp.Click(cssSel(`#ticket-form button[type="submit"]`)), chromedp.WaitVisible(idSel("ticket")))
	if tt := b.text("#ticket"); !strings.Contains(tt, "dead") || !strings.Contains(tt, "orders") {
		t.Errorf("ticket lookup shows %q", tt)
	}
	b.screenshot("tickets")

	// Dead letters: inspect, requeue one (delivered once the downstream is healthy),
	// purge the other after typing the queue's name.
	row := func(ticket string) string { return `#dead tr[data-ticket="` + ticket + `"]` }
	b.run("dead letters", consolePage("dead"), chromedp.WaitVisible(cssSel(row(requeued))),
		chromedp.WaitVisible(cssSel(row(purged))), chromedp.Click(cssSel(row(purged)+" button.inspect")), chromedp.WaitVisible(idSel("dead-detail")))
	if detail := b.text("#dead-detail"); !strings.Contains(detail, purged) || !strings.Contains(detail, "POST /v1/orders") || strings.Contains(detail, "purge-me") {
		t.Errorf("dead letter detail (metadata, no body): %q", detail)
	}
	b.screenshot("dead-letters")
	down.failing.Store(false)
	b.run("requeue", chromedp.Click(cssSel(`button.requeue[data-ticket="`+requeued+`"]`)), waitJS(`document.querySelector('`+row(requeued)+`') === null`))
	waitStatus(t, p.url, requeued, "done", 20*time.Second)
	b.run("purge unconfirmed", chromedp.Click(idSel("dead-purge")), chromedp.WaitVisible(idSel("purge-confirm")),
		chromedp.SendKeys(idSel("purge-input"), "order"), chromedp.Click(idSel("purge-go")), chromedp.WaitVisible(idSel("error")))
	if st, _ := getStatus(t, p.url, purged); st.Status != "dead" {
		t.Errorf("purged without the confirmation: %q", st.Status)
	}
	b.run("purge confirmed", chromedp.SetValue(idSel("purge-input"), "orders"), chromedp.Click(idSel("purge-go")),
		waitJS(`document.querySelector('`+row(purged)+`') === null`))
	if r := send(t, "GET", p.admin+"/sluice/v1/queues/orders/dead", nil, "Authorization", "Bearer "+token); !strings.Contains(r.body, `"dead_letters": []`) {
		t.Errorf("dead letters after purge: %s", r.body)
	}

	// Rules: the active set, and an explanation of a request.
	b.run("rules", consolePage("rules"), waitJS(`document.querySelectorAll("#rules tbody tr").length === 2`),
		chromedp.SetValue(idSel("ex-method"), "POST"), chromedp.SetValue(idSel("ex-path"), "/v1/orders"),
		chromedp.Click(cssSel(`#explain-form button[type="submit"]`)), chromedp.WaitVisible(cssSel("#explain p")))
	if ex := b.text("#explain"); !strings.Contains(ex, "Route orders") || !strings.Contains(ex, "defer to orders") {
		t.Errorf("explanation: %q", ex)
	}
	b.screenshot("rules")

	// Signing out leads back to the sign-in form; the console's data then answers 401.
	b.run("sign out", chromedp.Click(idSel("logout")), chromedp.WaitVisible(idSel("token")))
}

// Without an admin token and without a data directory of its own to keep a console
// token in (rls; --nats), there is nothing to sign in with: /console/ says so.
func TestConsoleNeedsToken(t *testing.T) {
	t.Parallel()
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	p := startCommand(t, "rls", "--rules", rulesPath, "--grpc-listen", freeAddr(t))
	r := send(t, "GET", p.admin+"/console/", nil)
	if r.status != 404 || !strings.Contains(r.body, "--admin-token") {
		t.Errorf("GET /console/ without --admin-token: %d %s", r.status, r.body)
	}
}

// TestConsoleTokenInDataDir: serve without --admin-token keeps a console token in
// DATA_DIR/console.token (0600), prints a one-time sign-in URL at the start that made
// it, and reuses it on restart, printing only the file; the admin API stays as it was
// without a token.
func TestConsoleTokenInDataDir(t *testing.T) {
	t.Parallel()
	up := newUpstream(t, 0)
	dir := t.TempDir()
	rulesPath := writeRules(t, t.TempDir(), e2eRules(10))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--data-dir", dir)
	signIn := signInURL(t, p)
	base, code, ok := strings.Cut(signIn, "#code=")
	if base != p.admin+"/console/" || !ok || len(code) != 32 {
		t.Fatalf("sign-in URL %q, want %s/console/#code=…", signIn, p.admin)
	}
	path := filepath.Join(dir, consoleTokenFile)
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("%s: %v %v", path, fi, err)
	}
	token, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(p.output.String(), strings.TrimSpace(string(token))) {
		t.Error("the console token is in the log")
	}
	if got := consoleSignIn(t, p.admin, "code="+code); got != http.StatusOK {
		t.Errorf("the one-time code: session %d", got)
	}
	if got := consoleSignIn(t, p.admin, "code="+code); got != http.StatusUnauthorized {
		t.Errorf("the code again: session %d", got)
	}
	if got := consoleSignIn(t, p.admin, "token="+url.QueryEscape(strings.TrimSpace(string(token)))); got != http.StatusOK {
		t.Errorf("the file's token: session %d", got)
	}
	// The admin API is as without a token.
	if resp, err := http.Get(p.admin + "/sluice/v1/rules"); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("admin API without a token: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	if code := p.stop(t); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	again := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--data-dir", dir)
	waitFor(t, "the console line", 30*time.Second, func() bool {
		return strings.Contains(again.output.String(), `msg="console: sign in with the token in the file" url=`+again.admin+"/console/ file="+path)
	})
	if strings.Contains(again.output.String(), "#code=") {
		t.Error("a restart printed a sign-in code")
	}
	if kept, err := os.ReadFile(path); err != nil || string(kept) != string(token) {
		t.Errorf("the token changed on restart: %q, was %q (%v)", kept, token, err)
	}
	if got := consoleSignIn(t, again.admin, "token="+url.QueryEscape(strings.TrimSpace(string(token)))); got != http.StatusOK {
		t.Errorf("the kept token after restart: session %d", got)
	}
}

// consoleSignIn posts the sign-in form to the console at admin and returns the status
// of GET /console/session with the cookie it got (401 without one).
func consoleSignIn(t *testing.T, admin, form string) int {
	t.Helper()
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, _ := http.NewRequest(http.MethodPost, admin+"/console/login", strings.NewReader(form))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", admin)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	req, _ = http.NewRequest(http.MethodGet, admin+"/console/session", nil)
	for _, c := range resp.Cookies() {
		req.AddCookie(c)
	}
	if resp, err = hc.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// signInURL waits for the one-time sign-in URL that p logs and returns it.
func signInURL(t *testing.T, p *sluiceProcess) string {
	t.Helper()
	var url string
	waitFor(t, "the sign-in URL", 30*time.Second, func() bool {
		_, rest, ok := strings.Cut(p.output.String(), `msg="console: sign in once at this URL`)
		if !ok {
			return false
		}
		_, rest, ok = strings.Cut(rest, `url="`)
		url, _, _ = strings.Cut(rest, `"`)
		return ok
	})
	return url
}

// TestConsoleSignInCodeInBrowser: the one-time URL signs a browser in, and the code
// leaves the address bar and the history.
func TestConsoleSignInCodeInBrowser(t *testing.T) {
	chromiumPath(t) // skips without chromium, before anything starts
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	p := startSluice(t, "--rules", rulesPath, "--upstream", newUpstream(t, 0).URL)
	signIn := signInURL(t, p)
	b := newConsoleBrowser(t)
	b.run("sign-in URL", chromedp.Navigate(signIn), chromedp.WaitVisible(idSel("logout")))
	if href := b.eval(`location.href`); href != p.admin+"/console/" {
		t.Errorf("address bar %q after the sign-in, want %s/console/ (no code)", href, p.admin)
	}
	if errs := b.log.take(); len(errs) > 0 {
		t.Errorf("the pages reported errors:\n%s", strings.Join(errs, "\n"))
	}
}

type step = chromedp.Action[chromedp.Void]

// browser is a chromium that a console test drives. With SLUICE_SCREENSHOTS=DIR its
// screenshots are written there as console-NAME.png.
type browser struct {
	t     *testing.T
	ctx   context.Context
	log   browserLog
	shots string
}

// newConsoleBrowser starts chromium (see chromiumPath) for the test, for 90 s at
// most; it stops with the test. What its pages log goes to b.log.
func newConsoleBrowser(t *testing.T) *browser {
	t.Helper()
	b := &browser{t: t, shots: os.Getenv("SLUICE_SCREENSHOTS")}
	if b.shots != "" {
		if err := os.MkdirAll(b.shots, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromiumPath(t)), chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.WindowSize(1280, 860), chromedp.Flag("lang", "en-US"))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(actx, chromedp.WithListener(b.log.listen))
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	t.Cleanup(func() { cancel(); cancelBrowser(); cancelAlloc() })
	b.ctx = ctx
	return b
}

// run runs the steps of one part of the walk and fails on any error the page reports.
func (b *browser) run(part string, steps ...step) {
	b.t.Helper()
	if err := chromedp.Do(b.ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v\nbrowser errors: %v", part, err, b.log.take())
	}
	if errs := b.log.take(); len(errs) > 0 {
		b.t.Errorf("%s: the page reported errors:\n%s", part, strings.Join(errs, "\n"))
	}
}

func (b *browser) text(sel string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Text(chromedp.CSS(sel)))
	if err != nil {
		b.t.Fatalf("text of %s: %v", sel, err)
	}
	return s
}

// eval returns the value of a JavaScript expression in the page.
func (b *browser) eval(expr string) string {
	b.t.Helper()
	s, err := chromedp.Run(b.ctx, chromedp.Evaluate[string](`String(`+expr+`)`))
	if err != nil {
		b.t.Fatalf("%s: %v", expr, err)
	}
	return s
}

func (b *browser) screenshot(name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if b.shots != "" {
		if err := os.WriteFile(filepath.Join(b.shots, "console-"+name+".png"), png, 0o644); err != nil {
			b.t.Fatal(err)
		}
	}
}

// waitJS waits until expr is true in the page.
func waitJS(expr string) step {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(100*time.Millisecond), chromedp.WithPollingTimeout(20*time.Second))
}

// consolePage shows another page of the console (a new hash: no page load).
func consolePage(name string) step {
	return chromedp.Evaluate[chromedp.Void](`location.hash = "#` + name + `"`)
}

func cssSel(sel string) chromedp.CSS { return chromedp.CSS(sel) }
func idSel(name string) chromedp.ID  { return chromedp.ID(name) }

// signIn signs in on the console's sign-in form, which the browser shows.
func signIn(token string) []step {
	return []step{chromedp.WaitVisible(idSel("token")), chromedp.SetValue(idSel("token"), token), chromedp.Click(idSel("signin")),
		chromedp.WaitVisible(idSel("logout")), waitJS(`document.body.dataset.ready === "1"`)}
}

// The console's overview through the binary with two replicas sharing one NATS: the
// console of the first shows the traffic of both, summed (each replica serves a
// route of its own), both replicas, and history charts of decisions, queue depth and
// outflow.
func TestConsoleClusterInBrowser(t *testing.T) {
	b := newConsoleBrowser(t)
	srv := natstest.Start(t)
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 2/s}"))
	const token = "console-cluster-token-0123456789"
	args := append([]string{"--rules", rulesPath, "--upstream", up.URL, "--nats", srv.URL, "--queue-key", testQueueKey,
		"--admin-token", token, "--console-report-interval", "1s"}, dispatchFlags...)
	a, other := startSluice(t, args...), startSluice(t, args...)

	// Orders through a (one allowed, then deferred to orders, delivered at 2/s), tiny
	// through the other (one allowed, then deferred: its queue fills and refuses).
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, tr := range []struct{ base, path string }{{a.url, "/v1/orders"}, {other.url, "/v1/tiny"}} {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-time.After(100 * time.Millisecond):
				}
				_, _ = postOrder(tr.base, tr.path, fmt.Sprintf("%s-%d", tr.path, i), "{}")
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()

	b.run("sign in", append([]step{chromedp.Navigate(a.admin + "/console/")}, signIn(token)...)...)
	rows := `[...document.querySelectorAll("#decisions tbody tr")].map(tr => tr.textContent)`
	for _, w := range []struct{ what, expr string }{
		{"two replicas", `document.querySelectorAll("#replicas tbody tr").length === 2`},
		{"both deciding", `[...document.querySelectorAll("#replicas tbody td.num:nth-child(3)")].every(td => parseFloat(td.textContent) > 0)`},
		{"orders (replica a)", rows + `.some(r => r.startsWith("orders"))`},
		{"tiny (the other)", rows + `.some(r => r.startsWith("tiny"))`},
		{"deferred", `parseFloat(document.querySelector("#outcome-cards .card.deferred .v").textContent) > 0`},
		// History: a point every 2 s; lines once there are a few.
		{"history points", `+document.getElementById("chart-outcomes").dataset.points >= 5`},
		{"outcome lines", `document.querySelectorAll("#chart-outcomes path.line").length >= 2`},
		{"depth lines", `document.querySelectorAll("#chart-depth path.line").length === 2`},
		{"outflow lines", `document.querySelectorAll("#chart-outflow path.line.dashed").length === 2`},
	} {
		b.run("overview: "+w.what, waitJS(w.expr))
	}
	if scope := b.text("#scope"); !strings.Contains(scope, "Summed over 2 replicas") {
		t.Errorf("scope: %q", scope)
	}
	if n := b.eval(`document.querySelectorAll("#replicas tbody tr").length`); n != "2" {
		t.Errorf("%s replicas shown", n)
	}
	b.screenshot("cluster")

	// The JSON the page reads, through the binary: both replicas, both routes.
	if r := send(t, "GET", a.admin+"/console/data/cluster?history=0", nil); r.status != 401 {
		t.Errorf("data/cluster without a session: %d", r.status)
	}
	view, body := clusterView(t, a.admin, token)
	ruleNames := map[string]bool{}
	for _, rr := range view.Rules {
		ruleNames[rr.Rule] = true
	}
	if view.Scope != "cluster" || len(view.Replicas) != 2 || !ruleNames["orders"] || !ruleNames["tiny"] {
		t.Errorf("data/cluster: %s", body)
	}
}

// consoleView is what the tests read of the console's data/cluster.
type consoleView struct {
	Scope    string `json:"scope"`
	Note     string `json:"note"`
	Replicas []struct {
		PerSecond float64 `json:"per_second"`
	} `json:"replicas"`
	Rules []struct {
		Rule string `json:"rule"`
	} `json:"rules"`
}

// clusterView signs in to the console at admin and reads data/cluster.
func clusterView(t *testing.T, admin, token string) (consoleView, string) {
	t.Helper()
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := noRedirect.PostForm(admin+"/console/login", url.Values{"token": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	var cookie string
	for _, c := range resp.Cookies() {
		cookie = c.Name + "=" + c.Value
	}
	var v consoleView
	r := send(t, "GET", admin+"/console/data/cluster?history=0", nil, "Cookie", cookie)
	if err := json.Unmarshal([]byte(r.body), &v); err != nil || r.status != 200 {
		t.Fatalf("data/cluster: %d %v %s", r.status, err, r.body)
	}
	return v, r.body
}

// sluice rls has no NATS: its console shows this process only, and says so.
func TestConsoleWithoutNATS(t *testing.T) {
	t.Parallel()
	rulesPath := writeRules(t, t.TempDir(), e2eRules(4))
	const token = "console-rls-token-0123456789"
	p := startCommand(t, "rls", "--rules", rulesPath, "--grpc-listen", freeAddr(t), "--admin-token", token)
	// The process's own report comes with the first round, a moment after the start.
	var v consoleView
	var body string
	waitFor(t, "this process's report", 30*time.Second, func() bool {
		v, body = clusterView(t, p.admin, token)
		return len(v.Replicas) > 0
	})
	if v.Scope != "process" || !strings.Contains(v.Note, "This process only") || len(v.Replicas) != 1 {
		t.Errorf("data/cluster of sluice rls: %s", body)
	}
	if code, _, stderr := runSluice(t, "rls", "--rules", rulesPath, "--grpc-listen", freeAddr(t), "--admin-token", token,
		"--console-report-interval", "100ms"); code == exitOK || !strings.Contains(stderr, "--console-report-interval") {
		t.Errorf("--console-report-interval 100ms: exit %d\n%s", code, stderr)
	}
}
