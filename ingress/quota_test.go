package ingress

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// quotaRules: two quota-mode services (envoyproxy/ratelimit's example, the second
// counted per hour here so that the two waits differ) and a rule without quota mode.
const quotaRules = `
domain: svc
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, name: service_2}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1, name: per_user}
routes:
  - name: quota
    match: {path: /quota}
    descriptors:
      - [{key: service, value: service_1}]
      - [{key: service, value: service_2}]
  - name: one
    match: {path: /one}
    descriptors:
      - [{key: service, value: service_1}]
  - name: mixed
    match: {path: /mixed}
    descriptors:
      - [{key: service, value: service_2}]
      - [{key: user, from: "header:X-User"}]
`

// TestQuotaModeOverHTTP: Envoy's quota_mode on the front door and on the check for
// nginx and Traefik. A quota exhausted while another has room passes, reporting
// Remaining 0; every quota exhausted is a 429 naming them all, to retry when the
// first has room; a rule without quota mode over its limit is a 429 whatever the
// quotas say.
func TestQuotaModeOverHTTP(t *testing.T) {
	type req struct {
		path, user string
		advance    time.Duration // before the request
		status     int
		remaining  string
		retryAfter string   // on a 429
		violated   []string // on a 429
	}
	cases := []struct {
		name     string
		reqs     []req
		outcomes map[string]map[string]float64
	}{
		{name: "one quota exhausted, another not: 200", reqs: []req{
			{path: "/quota", status: 200, remaining: "0"},
			{path: "/quota", status: 200, remaining: "0"},
		}, outcomes: map[string]map[string]float64{
			"service_1": {decide.OutcomeAllowed: 1, decide.OutcomeQuotaExhausted: 1},
			"service_2": {decide.OutcomeAllowed: 2},
		}},
		{name: "every quota exhausted: 429, retry when the first has room", reqs: []req{
			{path: "/quota", status: 200},
			{path: "/quota", status: 200},
			{path: "/quota", advance: 20 * time.Second, status: 429, remaining: "0", retryAfter: "40", violated: []string{"service_1", "service_2"}},
			{path: "/quota", advance: 40 * time.Second, status: 200, remaining: "0"},
		}, outcomes: map[string]map[string]float64{
			"service_1": {decide.OutcomeAllowed: 2, decide.OutcomeQuotaExhausted: 1, decide.OutcomeRejected: 1},
			"service_2": {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 1, decide.OutcomeQuotaExhausted: 1},
		}},
		{name: "the only quota exhausted: 429", reqs: []req{
			{path: "/one", status: 200, remaining: "0"},
			{path: "/one", status: 429, retryAfter: "60", violated: []string{"service_1"}},
		}},
		{name: "a quota with room and a normal rule over its limit: 429", reqs: []req{
			{path: "/mixed", user: "u", status: 200, remaining: "0"},
			{path: "/mixed", user: "u", status: 429, retryAfter: "60", violated: []string{"per_user"}},
		}, outcomes: map[string]map[string]float64{
			"service_2": {decide.OutcomeAllowed: 2},
			"per_user":  {decide.OutcomeAllowed: 1, decide.OutcomeRejected: 1},
		}},
	}
	set, err := rules.Parse(rules.File{Name: "svc.yaml", Data: []byte(quotaRules)})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		for _, entry := range []string{"front door", "check"} {
			t.Run(tc.name+"/"+entry, func(t *testing.T) {
				var mu sync.Mutex
				now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
				store := limiter.NewMemory(limiter.WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
				reg := prometheus.NewRegistry()
				m := mustNew(t, StaticRules{set}, store, WithRegisterer(reg))
				reached := 0
				h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { reached++ }))
				if entry == "check" {
					h = m.CheckHandler()
				}
				passed := 0
				for i, rq := range tc.reqs {
					mu.Lock()
					now = now.Add(rq.advance)
					mu.Unlock()
					r := httptest.NewRequest("GET", rq.path, nil)
					if entry == "check" {
						r = httptest.NewRequest("GET", CheckPath, nil)
						r.Header.Set("X-Forwarded-Uri", rq.path)
					}
					if rq.user != "" {
						r.Header.Set("X-User", rq.user)
					}
					w := httptest.NewRecorder()
					h.ServeHTTP(w, r)
					if w.Code != rq.status {
						t.Fatalf("request %d: status %d, want %d\n%s", i, w.Code, rq.status, w.Body)
					}
					if w.Code == 200 {
						passed++
					}
					if rq.remaining != "" {
						if got := w.Header().Get("X-Ratelimit-Remaining"); got != rq.remaining {
							t.Errorf("request %d: X-Ratelimit-Remaining %q, want %s", i, got, rq.remaining)
						}
					}
					if rq.status != 429 {
						continue
					}
					if got := w.Header().Get("Retry-After"); got != rq.retryAfter {
						t.Errorf("request %d: Retry-After %q, want %s", i, got, rq.retryAfter)
					}
					var p struct {
						Violated []string `json:"violated-policies"`
					}
					if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
						t.Fatalf("request %d: problem %v\n%s", i, err, w.Body)
					}
					slices.Sort(p.Violated)
					if !slices.Equal(p.Violated, rq.violated) {
						t.Errorf("request %d: violated-policies %v, want %v", i, p.Violated, rq.violated)
					}
				}
				if entry == "front door" && reached != passed {
					t.Errorf("upstream reached %d times, %d requests passed", reached, passed)
				}
				for rule, byOutcome := range tc.outcomes {
					for outcome, want := range byOutcome {
						if got := decisiontest.Count(t, reg, rule, outcome); got != want {
							t.Errorf("sluice_decisions_total{rule=%s,outcome=%s} = %v, want %v", rule, outcome, got, want)
						}
					}
				}
			})
		}
	}
}

// TestQuotaSeriesOnlyForQuotaRules: the quota_exhausted series exists, at 0, for the
// quota-mode rules only; no other rule can count it.
func TestQuotaSeriesOnlyForQuotaRules(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "svc.yaml", Data: []byte(quotaRules)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := mustNew(t, StaticRules{set}, limiter.NewMemory(), WithRegisterer(reg))
	m.Wrap(http.NotFoundHandler()).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/nothing", nil))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, mf := range mfs {
		for _, mt := range mf.Metric {
			var rule, outcome string
			for _, l := range mt.Label {
				switch l.GetName() {
				case "rule":
					rule = l.GetValue()
				case "outcome":
					outcome = l.GetValue()
				}
			}
			if outcome == decide.OutcomeQuotaExhausted {
				got = append(got, rule)
			}
		}
	}
	slices.Sort(got)
	if want := []string{"service_1", "service_2"}; !slices.Equal(got, want) {
		t.Errorf("quota_exhausted series for %v, want %v", got, want)
	}
}

// TestAdminShowsQuotaMode: the active rules say which are in quota mode.
func TestAdminShowsQuotaMode(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "svc.yaml", Data: []byte(quotaRules)})
	if err != nil {
		t.Fatal(err)
	}
	w := httptest.NewRecorder()
	(&Admin{Rules: StaticRules{set}}).Handler().ServeHTTP(w, httptest.NewRequest("GET", "/sluice/v1/rules", nil))
	var view rulesView
	if err := json.Unmarshal(w.Body.Bytes(), &view); err != nil {
		t.Fatalf("%v\n%s", err, w.Body)
	}
	var quota []string
	for _, r := range view.Rules {
		if r.Quota {
			quota = append(quota, r.Name)
		}
	}
	slices.Sort(quota)
	if want := []string{"service_1", "service_2"}; !slices.Equal(quota, want) {
		t.Errorf("rules in quota mode %v, want %v", quota, want)
	}
}
