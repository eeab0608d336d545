package ingress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// waitRules paces POST /pay at 10 per UNIT per X-Account, holding a request up to
// MAXWAIT.
const waitRules = `
domain: pay
descriptors:
  - key: account
    rate_limit: {unit: UNIT, requests_per_unit: 10}
    name: pay
    on_limit: wait
    max_wait: MAXWAIT
    max_waiting: MAXWAITING
    then: THEN
    QUEUE
routes:
  - name: pay
    match: {method: [POST], path: /pay}
    descriptors:
      - [{key: account, from: "header:X-Account"}]
queues:
  pay:
    outflow: {rate: 50/s}
    downstream: http://pay:8080
`

// waitFixture is a middleware with waitRules on a memory store whose clock stands
// still: every reservation is made at one instant, so the waits are exact.
type waitFixture struct {
	m       *Middleware
	store   *limiter.Memory
	handler http.Handler
	reg     *prometheus.Registry
	reached atomic.Int64
	parked  atomic.Int64
}

// recordingDeferrer answers 202 and counts what it is given.
type recordingDeferrer struct{ n *atomic.Int64 }

func (d recordingDeferrer) Defer(w http.ResponseWriter, _ *http.Request, _ Deferral) {
	d.n.Add(1)
	w.WriteHeader(http.StatusAccepted)
}

func newWaitFixture(t *testing.T, unit, maxWait, maxWaiting, then string) *waitFixture {
	t.Helper()
	src := strings.NewReplacer("UNIT", unit, "MAXWAITING", maxWaiting, "MAXWAIT", maxWait, "THEN", then, "QUEUE", map[bool]string{true: "queue: pay", false: ""}[then == "defer"]).Replace(waitRules)
	set, err := rules.Parse(rules.File{Name: "pay.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	f := &waitFixture{reg: prometheus.NewRegistry()}
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	f.store = limiter.NewMemory(limiter.WithClock(func() time.Time { return now }))
	f.m = mustNew(t, StaticRules{set}, f.store, WithRegisterer(f.reg), WithDeferrer(recordingDeferrer{&f.parked}))
	f.handler = f.m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.reached.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	return f
}

func (f *waitFixture) do(ctx context.Context, account string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, http.MethodPost, "/pay", strings.NewReader("{}"))
	r.Header.Set("X-Account", account)
	w := httptest.NewRecorder()
	f.handler.ServeHTTP(w, r)
	return w
}

// TestWaitHoldsUntilTheSlot: six requests at one instant on a rule of 10/s that
// holds up to 300ms: four get the slots 0, 100, 200 and 300ms ahead, are held and
// forwarded, and say so in Sluice-Waited; two would wait 400ms and are rejected
// (then: reject) with Retry-After for the 100ms until a slot is within reach.
// Another account has its own slots.
func TestWaitHoldsUntilTheSlot(t *testing.T) {
	f := newWaitFixture(t, "second", "300ms", "100", "reject")
	var mu sync.Mutex
	var waited []string
	var statuses []int
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			w := f.do(context.Background(), "a")
			mu.Lock()
			defer mu.Unlock()
			statuses = append(statuses, w.Code)
			if w.Code == http.StatusOK {
				waited = append(waited, w.Header().Get(HeaderWaited))
			} else if ra := w.Header().Get("Retry-After"); w.Code != http.StatusTooManyRequests || ra != "1" {
				t.Errorf("fallback %d, Retry-After %q; want 429 and 1", w.Code, ra)
			}
		})
	}
	wg.Wait()
	slices.Sort(waited)
	if !slices.Equal(waited, []string{"0", "0.1", "0.2", "0.3"}) {
		t.Fatalf("Sluice-Waited %q (statuses %v), want 0, 0.1, 0.2, 0.3", waited, statuses)
	}
	if n := f.reached.Load(); n != 4 {
		t.Fatalf("upstream reached %d times, want 4", n)
	}
	if w := f.do(context.Background(), "b"); w.Code != http.StatusOK || w.Header().Get(HeaderWaited) != "0" {
		t.Fatalf("another account: %d, waited %q", w.Code, w.Header().Get(HeaderWaited))
	}
	for outcome, want := range map[string]float64{decide.OutcomeWaited: 3, decide.OutcomeAllowed: 2, decide.OutcomeRejected: 2} {
		if got := decisiontest.Count(t, f.reg, "pay", outcome); got != want {
			t.Errorf("sluice_decisions_total{outcome=%q} = %v, want %v", outcome, got, want)
		}
	}
}

// TestWaitFallsBackToDefer: then: defer parks what cannot wait.
func TestWaitFallsBackToDefer(t *testing.T) {
	f := newWaitFixture(t, "second", "300ms", "100", "defer")
	var wg sync.WaitGroup
	var accepted atomic.Int64
	for range 6 {
		wg.Go(func() {
			if w := f.do(context.Background(), "a"); w.Code == http.StatusAccepted {
				accepted.Add(1)
			}
		})
	}
	wg.Wait()
	if f.reached.Load() != 4 || f.parked.Load() != 2 || accepted.Load() != 2 {
		t.Fatalf("forwarded %d, parked %d (202: %d); want 4 and 2", f.reached.Load(), f.parked.Load(), accepted.Load())
	}
}

// TestWaitIsBoundedAndFreesAClientThatLeaves: past max_waiting held requests the
// fallback comes at once; a client that goes away frees its place and gives its
// slot back, so the next request gets it.
func TestWaitIsBoundedAndFreesAClientThatLeaves(t *testing.T) {
	f := newWaitFixture(t, "minute", "30s", "2", "reject")
	if w := f.do(context.Background(), "a"); w.Code != http.StatusOK {
		t.Fatalf("first request %d", w.Code)
	}
	rule := f.m.rules.Set().Rules()[0]
	held := func() int64 { return f.m.engine.Holding(rule) }
	ctxs := make([]context.CancelFunc, 2)
	var wg sync.WaitGroup
	var codes [2]int
	for i := range ctxs {
		ctx, cancel := context.WithCancel(context.Background())
		ctxs[i] = cancel
		wg.Go(func() { codes[i] = f.do(ctx, "a").Code })
		waitFor(t, func() bool { return held() == int64(i+1) })
	}
	start := time.Now()
	if w := f.do(context.Background(), "a"); w.Code != http.StatusTooManyRequests {
		t.Fatalf("a request past max_waiting: %d, want 429 at once", w.Code)
	} else if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("the fallback past max_waiting took %v", d)
	}
	// The latest reservation first: each cancel then frees its slot.
	ctxs[1]()
	waitFor(t, func() bool { return held() == 1 })
	ctxs[0]()
	wg.Wait()
	if held() != 0 || f.reached.Load() != 1 {
		t.Fatalf("held %d, reached %d after both clients left (codes %v)", held(), f.reached.Load(), codes)
	}
	res, err := f.store.Reserve(context.Background(), rulesCheckKey(t, f.m, "a"), rule.Pace())
	if err != nil || !res.OK || res.Wait != 6*time.Second {
		t.Fatalf("after both left, the next reservation is %+v, %v; want the slot after the first request's", res, err)
	}
}

// TestWaitCheckAnswersTheWait: a check (Authorize) cannot hold its request: over
// the limit it answers 429 with Retry-After for the wait and gives the slot back.
func TestWaitCheckAnswersTheWait(t *testing.T) {
	f := newWaitFixture(t, "second", "300ms", "100", "reject")
	authorize := func() (bool, http.Header) {
		r := httptest.NewRequest(http.MethodPost, "/pay", nil)
		r.Header.Set("X-Account", "a")
		w := httptest.NewRecorder()
		return f.m.Authorize(w, r, ""), w.Header()
	}
	if ok, _ := authorize(); !ok {
		t.Fatal("the first check was refused")
	}
	for range 3 {
		ok, h := authorize()
		if ok || h.Get("Retry-After") != "1" {
			t.Fatalf("a check that would wait: allowed %v, Retry-After %q; want 429 and 1", ok, h.Get("Retry-After"))
		}
	}
	rule := f.m.rules.Set().Rules()[0]
	res, err := f.store.Reserve(context.Background(), rulesCheckKey(t, f.m, "a"), rule.Pace())
	if err != nil || res.Wait != 100*time.Millisecond {
		t.Fatalf("after the refused checks the next slot waits %+v, %v; want 100ms (their slots given back)", res, err)
	}
}

// rulesCheckKey is the limiter key of the wait rule for account.
func rulesCheckKey(t *testing.T, m *Middleware, account string) string {
	t.Helper()
	r := httptest.NewRequest(http.MethodPost, "/pay", nil)
	r.Header.Set("X-Account", account)
	_, checks := m.rules.Set().Match(r, netip.MustParseAddr("192.0.2.1"), nil)
	if len(checks) != 1 {
		t.Fatalf("%d checks", len(checks))
	}
	return checks[0].Key(0)
}

// waitFor polls cond until it holds, failing t after a generous deadline.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 20s")
		}
	}
}
