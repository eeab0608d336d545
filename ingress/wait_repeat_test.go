package ingress

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// repeatingDeferrer answers every request with an Idempotency-Key as the repeat of
// an accepted order (as deferral.Deferrer.AnswerRepeat does for a known key).
type repeatingDeferrer struct{ recordingDeferrer }

func (d repeatingDeferrer) AnswerRepeat(w http.ResponseWriter, r *http.Request, _ Deferral) (*http.Request, bool) {
	w.WriteHeader(http.StatusAccepted)
	return r, true
}

// waitAndDeferRules: POST /pay is paced per X-Account (on_limit: wait, at most 2
// held) and deferred into the queue pay past 1000 per minute over all accounts.
const waitAndDeferRules = `
domain: pay
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 10}
    name: pay
    on_limit: wait
    max_wait: 30s
    max_waiting: 2
  - key: all
    rate_limit: {unit: minute, requests_per_unit: 1000}
    name: pay-all
    on_limit: defer
    queue: pay
routes:
  - name: pay
    match: {method: [POST], path: /pay}
    descriptors:
      - [{key: account, from: "header:X-Account"}]
      - [{key: all, value: all}]
queues:
  pay:
    outflow: {rate: 50/s}
    downstream: http://pay:8080
`

// TestWaitRepeatAnswerGivesTheHoldBack: a request on a wait rule whose
// Idempotency-Key repeats an accepted order is answered from the queue, not held;
// the place it took among max_waiting and its slot must be given back. Else a
// client repeating one key max_waiting times makes every later request of the rule
// fall back (reject or defer) for good, in this process.
func TestWaitRepeatAnswerGivesTheHoldBack(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "pay.yaml", Data: []byte(waitAndDeferRules)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	store := limiter.NewMemory(limiter.WithClock(func() time.Time { return now }))
	var parked, reached atomic.Int64
	m := mustNew(t, StaticRules{set}, store, WithRegisterer(prometheus.NewRegistry()),
		WithDeferrer(repeatingDeferrer{recordingDeferrer{&parked}}))
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	do := func(key string) int {
		r := httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/pay", strings.NewReader("{}"))
		r.Header.Set("X-Account", "a")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	for i := range 2 {
		if code := do(`"k-1"`); code != http.StatusAccepted {
			t.Fatalf("repeat %d: %d, want 202", i, code)
		}
	}
	rule := m.rules.Set().Rules()[0]
	if n := m.engine.Holding(rule); n != 0 {
		t.Errorf("after two repeats answered from the queue, %d requests count as held (max_waiting 2)", n)
	}
	if code := do(""); code != http.StatusOK || reached.Load() != 1 {
		t.Errorf("a new request after the repeats: %d (parked %d, reached %d), want 200 forwarded", code, parked.Load(), reached.Load())
	}
}
