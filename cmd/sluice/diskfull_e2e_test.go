//go:build linux

package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest/fulldisk"
)

// Full-disk tests: `sluice serve`'s embedded JetStream stores on a size-limited tmpfs
// that the test fills for real with a ballast file (fallocate), so statfs, the server's
// writes and sluice's free-space check all meet the same full disk.

// diskFullSize is each test filesystem's size: the embedded server takes 75% of the free
// space as its store limit (48 MiB), for which the disk reserve is 16 MiB.
const diskFullSize = 64 << 20

// diskOrder is one order sent to a full disk and what it was answered.
type diskOrder struct {
	order, key string // key "": sent without an Idempotency-Key
	status     int
	ticket     string
	reason     string // a refusal's detail, any ticket it names written T
	took       time.Duration
}

// diskClient sends orders to a front door and keeps every answer.
type diskClient struct {
	t      *testing.T
	client *http.Client
	seq    atomic.Int64

	mu       sync.Mutex
	orders   []diskOrder
	problems []string // answers sluice must never give
}

func newDiskClient(t *testing.T) *diskClient {
	// The bound on an answer: a publish that JetStream leaves unanswered is given up
	// after the publish timeout (5s) and answered 503; far more is a hang.
	c := &diskClient{t: t, client: &http.Client{Timeout: 45 * time.Second}}
	t.Cleanup(c.client.CloseIdleConnections)
	return c
}

// send posts one over-limit order to base, with an Idempotency-Key when keyed, and
// returns its answer; an answer other than 202, or 503 / 429 with Retry-After, is a
// problem.
func (c *diskClient) send(base, prefix string, keyed bool) diskOrder {
	o := diskOrder{order: fmt.Sprintf("%s-%d", prefix, c.seq.Add(1))}
	if keyed {
		o.key = strconv.Quote(o.order)
	}
	o.status, o.ticket, o.reason, o.took = c.post(base, o.order, o.key)
	c.mu.Lock()
	c.orders = append(c.orders, o)
	c.mu.Unlock()
	return o
}

// post sends order (with key, when not "") and returns the status, the ticket of a
// 202 or the detail of a refusal, and how long the answer took; what is wrong with the
// answer is recorded.
func (c *diskClient) post(base, order, key string) (status int, ticket, reason string, took time.Duration) {
	req, err := http.NewRequest("POST", base+"/v1/orders", strings.NewReader(fmt.Sprintf(`{"order":%q}`, order)))
	if err != nil {
		c.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-User-ID", "disk")
	if key != "" {
		req.Header.Set("X-Order", order) // the downstream checks the client's key on keyed orders
		req.Header.Set("Idempotency-Key", key)
	}
	start := time.Now()
	resp, err := c.client.Do(req)
	if err != nil {
		c.problem("order %s: no answer after %s: %v", order, time.Since(start).Round(time.Millisecond), err)
		return 0, "", "", time.Since(start)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took = time.Since(start)
	if err != nil {
		c.problem("order %s: reading the answer: %v", order, err)
		return 0, "", "", took
	}
	switch resp.StatusCode {
	case http.StatusAccepted:
		var a accepted
		if err := json.Unmarshal(b, &a); err != nil || !queue.ValidTicket(a.Ticket) {
			c.problem("order %s: 202 with body %q", order, b)
			return 0, "", "", took
		}
		return resp.StatusCode, a.Ticket, "", took
	case http.StatusServiceUnavailable, http.StatusTooManyRequests:
		if resp.Header.Get("Retry-After") == "" {
			c.problem("order %s: %d without Retry-After: %s", order, resp.StatusCode, b)
		}
	default:
		c.problem("order %s: status %d: %s", order, resp.StatusCode, b)
	}
	var prob struct {
		Detail string `json:"detail"`
		Ticket string `json:"ticket"`
	}
	if json.Unmarshal(b, &prob) != nil || prob.Detail == "" {
		prob.Detail = string(b)
	}
	if prob.Ticket != "" {
		// The ticket an order may have been accepted as: one reason for them all.
		prob.Detail = strings.ReplaceAll(prob.Detail, prob.Ticket, "T")
	}
	return resp.StatusCode, "", prob.Detail, took
}

func (c *diskClient) problem(format string, args ...any) {
	c.mu.Lock()
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
	c.mu.Unlock()
}

// accepted returns the tickets of every order answered 202.
func (c *diskClient) accepted() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, o := range c.orders {
		if o.status == http.StatusAccepted {
			out = append(out, o.ticket)
		}
	}
	return out
}

// acceptedKeyed returns the keyed orders answered 202.
func (c *diskClient) acceptedKeyed() []diskOrder {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []diskOrder
	for _, o := range c.orders {
		if o.status == http.StatusAccepted && o.key != "" {
			out = append(out, o)
		}
	}
	return out
}

// summary counts the answers from the from-th on by status, gives the slowest one and
// the refusals' details.
func (c *diskClient) summary(from int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	counts, reasons := map[int]int{}, map[string]int{}
	var slowest time.Duration
	for _, o := range c.orders[from:] {
		counts[o.status]++
		slowest = max(slowest, o.took)
		if o.reason != "" {
			reasons[o.reason]++
		}
	}
	return fmt.Sprintf("%d×202 %d×503 %d×429 %d×other, slowest answer %s; refused: %v", counts[202], counts[503], counts[429],
		len(c.orders[from:])-counts[202]-counts[503]-counts[429], slowest.Round(time.Millisecond), reasons)
}

func (c *diskClient) sent() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.orders)
}

// check fails t for every problem recorded.
func (c *diskClient) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, p := range c.problems {
		t.Error(p)
	}
}

// lastLine returns the last line of out that contains substr.
func lastLine(out, substr string) string {
	lines := strings.Split(out, "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.Contains(lines[i], substr) {
			return lines[i]
		}
	}
	return "(none)"
}

// checkOutput fails t when sluice's output shows a panic (the race detector's reports
// are failed on by startBinaryEnv's cleanup).
func checkOutput(t *testing.T, p *sluiceProcess) {
	t.Helper()
	if out := p.output.String(); strings.Contains(out, "panic:") || strings.Contains(out, "goroutine ") && strings.Contains(out, "[running]") {
		t.Errorf("sluice panicked:\n%s", out)
	}
}

// startDiskSluice starts `sluice serve` with its data directory on a new tmpfs and a
// recording downstream, spends the one order the rules let through, and returns it
// with the data directory and its arguments (to start it again on the same store).
func startDiskSluice(t *testing.T) (p *sluiceProcess, down *clDownstream, disk string, args []string) {
	t.Helper()
	disk = fulldisk.Mount(t, diskFullSize)
	up := newUpstream(t, 0)
	down = newClDownstream(t)
	rulesPath := writeRules(t, t.TempDir(), clusterRules(down.URL))
	args = append([]string{"--rules", rulesPath, "--upstream", up.URL, "--data-dir", filepath.Join(disk, "data"), "--log-level", "info"}, clDispatchFlags...)
	p = startSluice(t, args...)
	warmUp(t, p.url, "/v1/orders")
	return p, down, disk, args
}

// The disk reserve, on a real filesystem: once another file leaves less than the
// reserve free (statfs), an over-limit order is answered 503 with Retry-After, never
// 202, while JetStream still answers (an earlier ticket's status); once the file is
// gone orders are accepted again by the same process, and every 202 is delivered once.
func TestServeKeepsTheDiskReserve(t *testing.T) {
	t.Parallel()
	p, down, disk, _ := startDiskSluice(t)
	c := newDiskClient(t)
	for i := range 6 {
		if o := c.send(p.url, "dr", i%2 == 0); o.status != http.StatusAccepted {
			t.Fatalf("order %s with the disk free: %d", o.order, o.status)
		}
	}
	first := c.accepted()[0]
	limit := clMetric(t, p, "sluice_queue_store_limit_bytes")
	reserve := queue.DiskReserve(int64(limit))
	if limit <= 0 || reserve >= diskFullSize/2 {
		t.Fatalf("store limit %v, reserve %d on a %d-byte disk", limit, reserve, diskFullSize)
	}

	ballast := fulldisk.Fill(t, disk, reserve/2)
	t.Logf("store limit %.0f bytes, reserve %d; the ballast leaves %d free", limit, reserve, fulldisk.Free(t, disk))
	// Until sluice reads the free space again (at most 250 ms old) an order may still
	// be accepted; then every one is refused.
	clWait(t, "an order refused for the disk", 30*time.Second, func() bool {
		return c.send(p.url, "dr", true).status == http.StatusServiceUnavailable
	})
	refusedFrom := c.sent()
	for i := range 10 {
		if o := c.send(p.url, "dr", i%2 == 0); o.status != http.StatusServiceUnavailable {
			t.Errorf("order %s with %d bytes free of a %d reserve: %d, want 503", o.order, fulldisk.Free(t, disk), reserve, o.status)
		}
	}
	if free := clMetric(t, p, "sluice_queue_store_disk_free_bytes"); free >= float64(reserve) {
		t.Errorf("sluice_queue_store_disk_free_bytes %v with the ballast, reserve %d", free, reserve)
	}
	// JetStream still answers: an earlier ticket, and a repeat of an accepted keyed
	// order (nothing new to store).
	if st, r := getStatus(t, p.url, first); r.status != http.StatusOK || st.Status == "" {
		t.Errorf("ticket %s with the disk at its reserve: %d %s", first, r.status, r.body)
	}
	keyed := c.acceptedKeyed()[0]
	if status, ticket, _, _ := c.post(p.url, keyed.order, keyed.key); status != http.StatusAccepted || ticket != keyed.ticket {
		t.Errorf("repeat of %s with the disk at its reserve: %d ticket %q, want 202 with %s", keyed.order, status, ticket, keyed.ticket)
	}
	t.Logf("with the ballast: %s", c.summary(refusedFrom))

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	clWait(t, "an order accepted again, without a restart", 30*time.Second, func() bool {
		return c.send(p.url, "dr", true).status == http.StatusAccepted
	})
	for i := range 4 {
		if o := c.send(p.url, "dr", i%2 == 0); o.status != http.StatusAccepted {
			t.Errorf("order %s after the ballast went: %d", o.order, o.status)
		}
	}
	tickets := c.accepted()
	if missing := plWait(down, tickets, 30*time.Second); len(missing) > 0 {
		t.Errorf("%d of %d accepted orders never delivered, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
	}
	r := down.report("dr-", tickets)
	t.Logf("accepted %d, delivered %d, repeat deliveries %d, delivered without a 202 %d; in all %s", r.accepted, r.delivered, r.duplicates, r.unpromised, c.summary(0))
	diskCheckDeliveries(t, down, tickets)
	c.check(t)
	checkOutput(t, p)
}

// diskCheckDeliveries fails t for a ticket delivered more than once, or an order
// delivered under two tickets.
func diskCheckDeliveries(t *testing.T, down *clDownstream, tickets []string) {
	t.Helper()
	down.mu.Lock()
	defer down.mu.Unlock()
	for _, m := range down.mismatches {
		t.Errorf("delivered under different keys: %s", m)
	}
	for _, tk := range tickets {
		if n := down.count[tk]; n > 1 {
			t.Errorf("ticket %s (order %q) delivered %d times", tk, down.orderOfKey[tk], n)
		}
	}
}

// The disk fills up at once, under load and with a backlog being delivered: faster
// than sluice's free-space check sees it, so JetStream itself meets ENOSPC. Every
// answer meanwhile is 202, or 503 / 429 with Retry-After, within a bounded time; once
// the space is freed the same process takes orders again, every order answered 202
// (before, during or after the fill) reaches the downstream exactly once, a repeat of
// an accepted keyed order finds its ticket, and so it does after a restart.
func TestServeSurvivesAFullDisk(t *testing.T) {
	t.Parallel()
	p, down, disk, args := startDiskSluice(t)
	c := newDiskClient(t)
	started := time.Now()

	// Four clients, half their orders keyed, faster than the outflow (50/s): a backlog.
	var stop atomic.Bool
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				c.send(p.url, "df", (w+i)%2 == 0)
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	defer func() { stop.Store(true); wg.Wait() }()
	clWait(t, "a backlog of 40 accepted orders", 30*time.Second, func() bool {
		return len(c.accepted())-down.delivered() >= 40
	})
	acceptedBefore := len(c.accepted())
	fillFrom := c.sent()
	ballast := fulldisk.Fill(t, disk, 0)
	t.Logf("disk filled (%d bytes free) %s after the start, with %d orders accepted, %d delivered", fulldisk.Free(t, disk), time.Since(started).Round(time.Millisecond), acceptedBefore, down.delivered())
	// Orders keep coming to the full disk: at least 40 answers, a few of them after a
	// publish timeout.
	clWait(t, "40 answers on the full disk", 60*time.Second, func() bool { return c.sent()-fillFrom >= 40 })
	stop.Store(true)
	wg.Wait()
	t.Logf("on the full disk: %s; %d accepted in all", c.summary(fillFrom), len(c.accepted()))
	c.check(t)
	checkOutput(t, p)

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	// The same process takes orders again once the space is back: its embedded server
	// restarts JetStream, whose streams nats-server 2.15 leaves unanswering after a
	// write error.
	freedFrom, freedAt := c.sent(), time.Now()
	clWait(t, "an order accepted again without a restart", 60*time.Second, func() bool {
		return c.send(p.url, "df", true).status == http.StatusAccepted
	})
	t.Logf("space freed (%d bytes free); accepted again after %s (%s); %s",
		fulldisk.Free(t, disk), time.Since(freedAt).Round(time.Millisecond), c.summary(freedFrom), lastLine(p.output.String(), "JetStream restarted"))
	// Whether the server met ENOSPC depends on the race between the fill and the
	// free-space check; when it did, the restart must follow. It may come after the
	// first 202: a write error on another stream (the ticket records, which delivering
	// writes past the high-water mark) leaves the orders' stream taking writes, and the
	// watch restarts JetStream at its next look at the disk.
	if strings.Contains(p.output.String(), "a write to the store failed") {
		clWait(t, "JetStream restarted after the write error", 15*time.Second, func() bool {
			return strings.Contains(p.output.String(), "JetStream restarted")
		})
	} else if out := p.output.String(); strings.Contains(out, "JetStream restarted") {
		t.Errorf("JetStream restarted with no write error logged:\n%s", out)
	} else {
		t.Log("the free-space check stopped every write before the disk was full: no write error this time")
	}
	tickets := c.accepted()
	missing := plWait(down, tickets, 60*time.Second)
	r := down.report("df-", tickets)
	t.Logf("without a restart: accepted %d, delivered %d, repeat deliveries %d, delivered without a 202 %d", r.accepted, r.delivered, r.duplicates, r.unpromised)
	if len(missing) > 0 {
		t.Errorf("%d of %d accepted orders never delivered, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
	}
	for _, o := range c.acceptedKeyed()[:3] {
		if status, ticket, _, _ := c.post(p.url, o.order, o.key); status != http.StatusAccepted || ticket != o.ticket {
			t.Errorf("repeat of %s once the space is back: %d ticket %q, want 202 with %s", o.order, status, ticket, o.ticket)
		}
	}
	stopAt := time.Now()
	if code := p.stop(t); code != 0 {
		t.Errorf("sluice exited %d after SIGTERM", code)
	}
	t.Logf("stopped in %s", time.Since(stopAt).Round(time.Millisecond))
	checkOutput(t, p)
	// A restart on the same store finds every order where the first process left it.
	p2 := startSluice(t, args...)
	for _, o := range c.acceptedKeyed()[:3] {
		if status, ticket, _, _ := c.post(p2.url, o.order, o.key); status != http.StatusAccepted || ticket != o.ticket {
			t.Errorf("repeat of %s after a restart: %d ticket %q, want 202 with %s", o.order, status, ticket, o.ticket)
		}
	}
	clWait(t, "an order accepted after the restart", 30*time.Second, func() bool {
		return c.send(p2.url, "df", true).status == http.StatusAccepted
	})
	tickets = c.accepted()
	if missing := plWait(down, tickets, 45*time.Second); len(missing) > 0 {
		t.Errorf("%d of %d accepted orders never delivered after the restart, e.g. %v", len(missing), len(tickets), missing[:min(5, len(missing))])
	}
	diskCheckDeliveries(t, down, tickets)
	c.check(t)
	checkOutput(t, p2)
}
