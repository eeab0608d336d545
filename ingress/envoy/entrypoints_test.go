package envoy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
)

// sameDescriptors is the descriptor tree every entry point decides on in
// TestEveryEntryPointDecidesAlike; the routes (sameRoutes) are written from the same
// table the rate limit service's descriptors are made of.
const sameDescriptors = `
domain: same
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 2, name: plain}
  - key: multi
    name: multi
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {window: 30s, requests_per_unit: 2}
  - key: soft
    rate_limit: {unit: minute, requests_per_unit: 1, name: soft}
    shadow_mode: true
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0, name: blocked}
  - key: orders
    rate_limit: {unit: hour, requests_per_unit: 1, name: orders}
    on_limit: defer
    queue: orders
  - key: service
    value: q1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: q1}
  - key: service
    value: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, name: q2}
  - key: pace
    rate_limit: {unit: second, requests_per_unit: 10, name: pace}
    on_limit: wait
    max_wait: 300ms
    max_waiting: 100
    then: reject
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: http://127.0.0.1:9
`

// user stands for the request's X-User in a route's descriptor.
const user = "$user"

// sameRoutes are the routes of TestEveryEntryPointDecidesAlike by path: the
// descriptors the route sends, each a list of key, value pairs (value user: from the
// request's X-User header), as Envoy's route would send them to the rate limit
// service.
var sameRoutes = []struct {
	path  string
	descs [][][2]string
}{
	{"/plain", [][][2]string{{{"plain", user}}}},
	{"/multi", [][][2]string{{{"multi", user}}}},
	{"/soft", [][][2]string{{{"soft", user}}, {{"plain", user}}}},
	{"/blocked", [][][2]string{{{"blocked", user}}}},
	{"/orders", [][][2]string{{{"orders", user}}}},
	{"/quota", [][][2]string{{{"service", "q1"}}, {{"service", "q2"}}}},
	{"/mixed", [][][2]string{{{"service", "q2"}}, {{"plain", user}}}},
	{"/pace", [][][2]string{{{"pace", user}}}},
}

// sameRules is sameDescriptors with the routes of sameRoutes.
func sameRules() string {
	var b strings.Builder
	b.WriteString(sameDescriptors + "routes:\n")
	for _, r := range sameRoutes {
		fmt.Fprintf(&b, "  - name: %s\n    match: {path: %s}\n    descriptors:\n", strings.TrimPrefix(r.path, "/"), r.path)
		for _, d := range r.descs {
			var entries []string
			for _, e := range d {
				if e[1] == user {
					entries = append(entries, fmt.Sprintf(`{key: %s, from: "header:X-User"}`, e[0]))
				} else {
					entries = append(entries, fmt.Sprintf(`{key: %s, value: %s}`, e[0], e[1]))
				}
			}
			b.WriteString("      - [" + strings.Join(entries, ", ") + "]\n")
		}
	}
	return b.String()
}

// seen is what one entry point answered one request, in the terms every entry point
// can say: the outcome, the rate-limit fields of the closest limit, and when rejected
// the Retry-After and the rules that refused (the problem's violated-policies; the
// rate limit service's descriptors OVER_LIMIT), sorted.
type seen struct {
	outcome                                 string // allow, reject, defer, wait DURATION
	limit, remaining, policy, status, retry string
	refused                                 string
}

func (s seen) String() string {
	return fmt.Sprintf("%s limit=%s remaining=%s policy=%s ratelimit=%s retry=%s refused=%s",
		s.outcome, s.limit, s.remaining, s.policy, s.status, s.retry, s.refused)
}

// entryPoint answers a request to path from user at one of sluice's four doors.
type entryPoint struct {
	name string
	// parks: a request over a defer rule is parked (202); otherwise refused.
	parks bool
	// holds: a request a wait rule would hold is held until its slot; otherwise
	// refused with Retry-After for the wait (or, without wait rules, decided on
	// its limit: the rate limit service).
	holds bool
	// rls: the rate limit service, which has no wait rules' holds at all.
	rls bool
	reg *prometheus.Registry // where it counts its decisions
	ask func(t *testing.T, path, user string) seen
}

// TestEveryEntryPointDecidesAlike: one rule set, one clock standing still, the same
// requests through the front door (the middleware), the check endpoint of nginx and
// Traefik, Envoy's ext_authz (with the request's body and without) and Envoy's rate
// limit service (both over gRPC): every
// entry point gives the same outcome, the same closest limit with the same
// remaining and reset, and the same Retry-After; the same shadow and quota_mode
// behaviour; and counts the same decisions. An entry point differs only in what its
// wire cannot do: the check endpoint, ext_authz without the body and the rate limit
// service refuse what a defer rule parks at the front door and ext_authz with the
// body (and count it rejected, as they answered); the checks refuse, with Retry-After for the wait, what a wait rule holds
// at the front door; the rate limit service, which cannot hold, is not asked about
// wait rules.
func TestEveryEntryPointDecidesAlike(t *testing.T) {
	set := parseRules(t, sameRules())
	_, store := parktest.Store(t, set.Queue("orders").Config)

	type step struct {
		path, user string
		want       seen // at the front door
	}
	allow := func(limit, remaining, policy, status string) seen {
		return seen{outcome: "allow", limit: limit, remaining: remaining, policy: policy, status: status}
	}
	reject := func(limit, remaining, policy, status, retry, refused string) seen {
		return seen{outcome: "reject", limit: limit, remaining: remaining, policy: policy, status: status, retry: retry, refused: refused}
	}
	deferred := func(limit, remaining, policy, status, retry, refused string) seen {
		s := reject(limit, remaining, policy, status, retry, refused)
		s.outcome = "defer"
		return s
	}
	plainPolicy := `"plain";q=2;w=60`
	cases := []struct {
		name   string
		shadow bool // every rule in shadow mode (WithShadow)
		steps  []step
		// counted are the decisions counted at the end, by rule and outcome, at the
		// front door; countedRefused, when set, those of the entry points that cannot
		// park instead (a 429 is counted rejected wherever it is answered).
		counted, countedRefused map[string]map[string]float64
	}{
		{name: "a reject rule: allowed to its limit, then 429 until the window ends", steps: []step{
			{"/plain", "a", allow("2", "1", plainPolicy, `"plain";r=1;t=60`)},
			{"/plain", "a", allow("2", "0", plainPolicy, `"plain";r=0;t=60`)},
			{"/plain", "a", reject("2", "0", plainPolicy, `"plain";r=0;t=60`, "60", "plain")},
			{"/plain", "b", allow("2", "1", plainPolicy, `"plain";r=1;t=60`)},
		}, counted: map[string]map[string]float64{"plain": {decide.OutcomeAllowed: 3, decide.OutcomeRejected: 1}}},
		{name: "two limits: the closest is described, the one over decides", steps: []step{
			{"/multi", "a", allow("2", "1", `"multi";q=2;w=30`, `"multi";r=1;t=30`)},
			{"/multi", "a", allow("2", "0", `"multi";q=2;w=30`, `"multi";r=0;t=30`)},
			{"/multi", "a", reject("2", "0", `"multi";q=2;w=30`, `"multi";r=0;t=30`, "30", "multi")},
		}, counted: map[string]map[string]float64{"multi": {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 1}}},
		{name: "a shadow rule over its limit passes and is counted; the enforced rule beside it still decides", steps: []step{
			{"/soft", "a", allow("1", "0", `"soft";q=1;w=60`, `"soft";r=0;t=60`)},
			{"/soft", "a", allow("1", "0", `"soft";q=1;w=60`, `"soft";r=0;t=60`)},
			{"/soft", "a", reject("1", "0", `"soft";q=1;w=60`, `"soft";r=0;t=60`, "60", "plain")},
		}, counted: map[string]map[string]float64{
			"soft":  {decide.OutcomeAllowed: 1, decide.OutcomeShadowDenied: 2},
			"plain": {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 1},
		}},
		{name: "global shadow: nothing is enforced, everything is counted", shadow: true, steps: []step{
			{"/plain", "a", allow("2", "1", plainPolicy, `"plain";r=1;t=60`)},
			{"/plain", "a", allow("2", "0", plainPolicy, `"plain";r=0;t=60`)},
			{"/plain", "a", allow("2", "0", plainPolicy, `"plain";r=0;t=60`)},
			{"/blocked", "a", allow("", "", "", "")},
			{"/quota", "", allow("1", "0", `"q1";q=1;w=60`, `"q1";r=0;t=60`)},
			{"/quota", "", allow("1", "0", `"q1";q=1;w=60`, `"q1";r=0;t=60`)},
			{"/quota", "", allow("2", "0", `"q2";q=2;w=3600`, `"q2";r=0;t=3600`)},
		}, counted: map[string]map[string]float64{
			"plain":   {decide.OutcomeAllowed: 2, decide.OutcomeShadowDenied: 1},
			"blocked": {decide.OutcomeShadowDenied: 1},
			"q1":      {decide.OutcomeAllowed: 1, decide.OutcomeQuotaExhausted: 1, decide.OutcomeShadowDenied: 1},
			"q2":      {decide.OutcomeAllowed: 2, decide.OutcomeShadowDenied: 1},
		}},
		{name: "a block-list rule refuses everything for an hour", steps: []step{
			{"/blocked", "a", reject("", "", "", "", "3600", "blocked")},
		}, counted: map[string]map[string]float64{"blocked": {decide.OutcomeRejected: 1}}},
		{name: "quota_mode: one quota exhausted passes; every quota exhausted is refused until the first has room", steps: []step{
			{"/quota", "", allow("1", "0", `"q1";q=1;w=60`, `"q1";r=0;t=60`)},
			{"/quota", "", allow("1", "0", `"q1";q=1;w=60`, `"q1";r=0;t=60`)},
			// Both over, q2 for longer: q2 is the closest; q1 has room first.
			{"/quota", "", reject("2", "0", `"q2";q=2;w=3600`, `"q2";r=0;t=3600`, "60", "q1,q2")},
		}, counted: map[string]map[string]float64{
			"q1": {decide.OutcomeAllowed: 1, decide.OutcomeQuotaExhausted: 1, decide.OutcomeRejected: 1},
			"q2": {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 1},
		}},
		{name: "quota_mode beside a rule without it: that rule over its limit refuses whatever the quota", steps: []step{
			{"/mixed", "a", allow("2", "1", `"q2";q=2;w=3600`, `"q2";r=1;t=3600`)},
			{"/mixed", "a", allow("2", "0", `"q2";q=2;w=3600`, `"q2";r=0;t=3600`)},
			{"/mixed", "a", reject("2", "0", `"q2";q=2;w=3600`, `"q2";r=0;t=3600`, "3600", "plain,q2")},
			{"/mixed", "b", reject("2", "0", `"q2";q=2;w=3600`, `"q2";r=0;t=3600`, "3600", "q2")},
		}, counted: map[string]map[string]float64{
			"q2":    {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 2},
			"plain": {decide.OutcomeAllowed: 3, decide.OutcomeRejected: 1},
		}},
		{name: "a defer rule over its limit parks where the entry point can, refuses elsewhere", steps: []step{
			{"/orders", "a", allow("1", "0", `"orders";q=1;w=3600`, `"orders";r=0;t=3600`)},
			{"/orders", "a", deferred("1", "0", `"orders";q=1;w=3600`, `"orders";r=0;t=3600`, "3600", "orders")},
		}, counted: map[string]map[string]float64{"orders": {decide.OutcomeAllowed: 1, decide.OutcomeDeferred: 1}},
			countedRefused: map[string]map[string]float64{"orders": {decide.OutcomeAllowed: 1, decide.OutcomeRejected: 1}}},
		{name: "a wait rule holds for the slot where the entry point can, refuses with the wait elsewhere", steps: []step{
			// Four slots within max_wait (now, +100, +200 and +300ms).
			{"/pace", "a", allow("10", "3", `"pace";q=10;w=1`, `"pace";r=3;t=1`)},
			{"/pace", "a", seen{outcome: "wait 100ms", limit: "10", remaining: "2", policy: `"pace";q=10;w=1`, status: `"pace";r=2;t=1`}},
		}, counted: map[string]map[string]float64{"pace": {decide.OutcomeAllowed: 1, decide.OutcomeWaited: 1}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, ep := range entryPoints(t, set, store, tc.shadow) {
				if ep.rls && strings.HasPrefix(tc.steps[len(tc.steps)-1].path, "/pace") {
					continue // the rate limit service cannot hold a request
				}
				for i, st := range tc.steps {
					want := st.want
					switch {
					case want.outcome == "defer" && !ep.parks:
						want.outcome = "reject"
					case strings.HasPrefix(want.outcome, "wait ") && !ep.holds:
						// Refused with the wait rounded up, the slot given back.
						want.outcome, want.retry, want.refused = "reject", "1", "pace"
					}
					if want.outcome != "reject" {
						want.retry, want.refused = "", ""
					}
					if got := ep.ask(t, st.path, st.user); got != want {
						t.Errorf("%s, request %d (%s as %q):\n got %v\nwant %v", ep.name, i+1, st.path, st.user, got, want)
					}
				}
				counted := tc.counted
				switch {
				case !ep.parks && tc.countedRefused != nil:
					counted = tc.countedRefused
				case strings.HasPrefix(tc.steps[len(tc.steps)-1].path, "/pace") && !ep.holds:
					counted = map[string]map[string]float64{"pace": {decide.OutcomeAllowed: 1, decide.OutcomeRejected: 1}}
				}
				if got := decisiontest.Counted(t, ep.reg); !equalCounts(got, counted) {
					t.Errorf("%s counted %v, want %v", ep.name, got, counted)
				}
			}
		})
	}
}

// entryPoints are the entry points on set (ext_authz twice: with the request's body
// and without), each on its own memory store whose
// clock stands still at one instant (so every remaining and reset is exact) and its
// own registry; the front door and ext_authz park in store's queues.
func entryPoints(t *testing.T, set *rules.Set, store *queue.Store, shadow bool) []entryPoint {
	t.Helper()
	now := time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	mw := func(reg *prometheus.Registry) *ingress.Middleware {
		return newMiddleware(t, set, limiter.NewMemory(limiter.WithClock(clock)), ingress.WithShadow(shadow),
			ingress.WithRegisterer(reg), ingress.WithDeferrer(deferral.New(store)))
	}
	front, checks, authz, bare, rls := prometheus.NewRegistry(), prometheus.NewRegistry(), prometheus.NewRegistry(),
		prometheus.NewRegistry(), prometheus.NewRegistry()
	frontDoor := mw(front).Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) }))
	checkEndpoint := mw(checks).CheckHandler()
	conn := serve(t, NewServer(newRLS(t, set, limiter.NewMemory(limiter.WithClock(clock)), WithShadow(shadow), WithRegisterer(rls)),
		NewAuthService(mw(authz))))
	authzClient, rlsClient := authv3.NewAuthorizationClient(conn), rlsv3.NewRateLimitServiceClient(conn)
	bareClient := authv3.NewAuthorizationClient(serve(t, NewServer(nil, NewAuthService(mw(bare)))))
	authzAsk := func(c authv3.AuthorizationClient, body string) func(t *testing.T, path, u string) seen {
		return func(t *testing.T, path, u string) seen {
			resp := check(t, c, checkReq{method: http.MethodPost, path: path, source: "192.0.2.1", body: body,
				headers: map[string]string{"x-user": u, "content-length": "2"}})
			if ok := resp.GetOkResponse(); ok != nil {
				return seenHeaders("allow", func(k string) string { return headerOf(ok.ResponseHeadersToAdd, k) })
			}
			code, h, body := denied(t, resp)
			s := seenHeaders(outcomeOf(code), func(k string) string { return headerOf(h, k) })
			if s.outcome == "reject" {
				s.refused = refusedOf(body["violated-policies"])
			}
			return s
		}
	}
	return []entryPoint{
		{name: "front door", parks: true, holds: true, reg: front, ask: func(t *testing.T, path, u string) seen {
			r := httptest.NewRequest(http.MethodPost, path, strings.NewReader("{}"))
			r.Header.Set("X-User", u)
			w := httptest.NewRecorder()
			frontDoor.ServeHTTP(w, r)
			return seenHTTP(t, w.Code, w.Header(), w.Body.String())
		}},
		{name: "check endpoint", reg: checks, ask: func(t *testing.T, path, u string) seen {
			r := httptest.NewRequest(http.MethodGet, ingress.CheckPath, nil)
			r.Header.Set("X-Forwarded-Method", http.MethodPost)
			r.Header.Set("X-Forwarded-Uri", path)
			r.Header.Set("X-User", u)
			w := httptest.NewRecorder()
			checkEndpoint.ServeHTTP(w, r)
			return seenHTTP(t, w.Code, w.Header(), w.Body.String())
		}},
		{name: "ext_authz", parks: true, reg: authz, ask: authzAsk(authzClient, "{}")},
		{name: "ext_authz without the body", reg: bare, ask: authzAsk(bareClient, "")},
		{name: "rate limit service", rls: true, reg: rls, ask: func(t *testing.T, path, u string) seen {
			req := &rlsv3.RateLimitRequest{Domain: "same"}
			for _, r := range sameRoutes {
				if r.path != path {
					continue
				}
				for _, d := range r.descs {
					desc := &rlcommon.RateLimitDescriptor{}
					for _, e := range d {
						v := e[1]
						if v == user {
							v = u
						}
						desc.Entries = append(desc.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: e[0], Value: v})
					}
					req.Descriptors = append(req.Descriptors, desc)
				}
			}
			resp := ask(t, rlsClient, req)
			s := seenHeaders("allow", func(k string) string { return headerValue(resp.ResponseHeadersToAdd, k) })
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				var names []any
				for _, st := range resp.Statuses {
					if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
						names = append(names, st.CurrentLimit.GetName())
					}
				}
				s.outcome, s.refused = "reject", refusedOf(names)
			}
			return s
		}},
	}
}

// seenHTTP is what an HTTP answer says.
func seenHTTP(t *testing.T, code int, h http.Header, body string) seen {
	t.Helper()
	outcome := outcomeOf(code)
	if w := h.Get(ingress.HeaderWaited); outcome == "allow" && w != "" && w != "0" {
		d, err := time.ParseDuration(w + "s")
		if err != nil {
			t.Fatalf("%s: %q", ingress.HeaderWaited, w)
		}
		outcome = "wait " + d.String()
	}
	s := seenHeaders(outcome, func(k string) string { return h.Get(k) })
	if outcome == "reject" {
		var p map[string]any
		if err := json.Unmarshal([]byte(body), &p); err != nil {
			t.Fatalf("429 body %q: %v", body, err)
		}
		s.refused = refusedOf(p["violated-policies"])
	}
	return s
}

// refusedOf is the sorted names of a problem's violated-policies (v from JSON).
func refusedOf(v any) string {
	list, _ := v.([]any)
	names := make([]string, 0, len(list))
	for _, n := range list {
		names = append(names, fmt.Sprint(n))
	}
	slices.Sort(names)
	return strings.Join(names, ",")
}

func outcomeOf(code int) string {
	switch code {
	case http.StatusOK:
		return "allow"
	case http.StatusAccepted:
		return "defer"
	case http.StatusTooManyRequests:
		return "reject"
	}
	return "status " + fmt.Sprint(code)
}

// seenHeaders is what the rate-limit headers that get (by lower-case name) gives say.
func seenHeaders(outcome string, get func(string) string) seen {
	return seen{outcome: outcome, limit: get("x-ratelimit-limit"), remaining: get("x-ratelimit-remaining"),
		policy: get("ratelimit-policy"), status: get("ratelimit"), retry: get("retry-after")}
}

// headerValue is the value of header k in Envoy's list h.
func headerValue(h []*corev3.HeaderValue, k string) string {
	for _, v := range h {
		if v.Key == k {
			return v.Value
		}
	}
	return ""
}

func equalCounts(a, b map[string]map[string]float64) bool {
	return fmt.Sprint(a) == fmt.Sprint(b) // fmt prints maps sorted by key
}
