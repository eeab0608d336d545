package envoy

import (
	"net/http"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
)

// quotaRules restate envoyproxy/ratelimit's example quota services (1 and 2 per
// minute), beside a rule without quota mode and quota rules that never exhaust.
const quotaRules = `
domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: service_1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: service_2}
    metadata:
      service_with_quota: {name: service_2, zone: b}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1, name: plain}
  - key: shadowed
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: shadowed}
  - key: free
    quota_mode: true
    rate_limit: {unlimited: true}
`

// TestShouldRateLimitQuotaMode: Envoy's quota_mode over gRPC. A quota descriptor over
// its limit keeps its status OVER_LIMIT while the request is OK as long as another
// quota has room; every quota exhausted, or a descriptor without quota mode over its
// limit, is OVER_LIMIT.
func TestShouldRateLimitQuotaMode(t *testing.T) {
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	type call struct {
		descs    [][]string
		overall  rlsv3.RateLimitResponse_Code
		statuses []rlsv3.RateLimitResponse_Code
		// remaining of the first descriptor; retry says whether Retry-After is set.
		remaining uint32
		retry     bool
	}
	svc1, svc2 := []string{"service", "service_1"}, []string{"service", "service_2"}
	plain := []string{"plain", "p"}
	cases := []struct {
		name  string
		calls []call
		// outcomes counted at the end, by rule.
		outcomes map[string]map[string]float64
	}{
		{name: "one quota exhausted, another not: OK (quota.sh, first two requests)", calls: []call{
			{[][]string{svc1, svc2}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, svc2}, ok, []rlsv3.RateLimitResponse_Code{over, ok}, 0, false},
		}, outcomes: map[string]map[string]float64{
			"service_1": {decide.OutcomeAllowed: 1, decide.OutcomeQuotaExhausted: 1},
			"service_2": {decide.OutcomeAllowed: 2},
		}},
		{name: "every quota exhausted: OVER_LIMIT (quota.sh, third request)", calls: []call{
			{[][]string{svc1, svc2}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, svc2}, ok, []rlsv3.RateLimitResponse_Code{over, ok}, 0, false},
			{[][]string{svc1, svc2}, over, []rlsv3.RateLimitResponse_Code{over, over}, 0, true},
		}, outcomes: map[string]map[string]float64{
			"service_1": {decide.OutcomeQuotaExhausted: 1, decide.OutcomeRejected: 1},
			"service_2": {decide.OutcomeAllowed: 2, decide.OutcomeRejected: 1},
		}},
		{name: "the only quota exhausted: OVER_LIMIT", calls: []call{
			{[][]string{svc1}, ok, []rlsv3.RateLimitResponse_Code{ok}, 0, false},
			{[][]string{svc1}, over, []rlsv3.RateLimitResponse_Code{over}, 0, true},
		}},
		{name: "a quota with room and a normal descriptor over its limit: OVER_LIMIT", calls: []call{
			{[][]string{svc2, plain}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 1, false},
			{[][]string{svc2, plain}, over, []rlsv3.RateLimitResponse_Code{ok, over}, 0, true},
		}, outcomes: map[string]map[string]float64{
			"service_2": {decide.OutcomeAllowed: 2},
			"plain":     {decide.OutcomeAllowed: 1, decide.OutcomeRejected: 1},
		}},
		{name: "every quota exhausted beside a normal descriptor with room: OVER_LIMIT", calls: []call{
			{[][]string{svc1, {"plain", "a"}}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, {"plain", "b"}}, over, []rlsv3.RateLimitResponse_Code{over, ok}, 0, true},
		}},
		{name: "a quota in shadow mode never exhausts", calls: []call{
			{[][]string{svc1, {"shadowed", "x"}}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, {"shadowed", "x"}}, ok, []rlsv3.RateLimitResponse_Code{over, ok}, 0, false},
		}, outcomes: map[string]map[string]float64{
			"service_1": {decide.OutcomeQuotaExhausted: 1},
			"shadowed":  {decide.OutcomeShadowDenied: 1},
		}},
		{name: "an unlimited quota descriptor is left out of the count", calls: []call{
			{[][]string{svc1, {"free", "x"}}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, {"free", "x"}}, over, []rlsv3.RateLimitResponse_Code{over, ok}, 0, true},
		}},
		{name: "a descriptor that reaches no rule is left out of the count", calls: []call{
			{[][]string{svc1, {"service", "service_3"}}, ok, []rlsv3.RateLimitResponse_Code{ok, ok}, 0, false},
			{[][]string{svc1, {"service", "service_3"}}, over, []rlsv3.RateLimitResponse_Code{over, ok}, 0, true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			c := rlsClient(t, parseRules(t, quotaRules), limiter.NewMemory(), WithRegisterer(reg))
			for i, cl := range tc.calls {
				req := &rlsv3.RateLimitRequest{Domain: "rl"}
				for _, kv := range cl.descs {
					req.Descriptors = append(req.Descriptors, desc(kv...))
				}
				resp := ask(t, c, req)
				if resp.OverallCode != cl.overall {
					t.Errorf("call %d: overall %v, want %v", i, resp.OverallCode, cl.overall)
				}
				for j, want := range cl.statuses {
					if got := resp.Statuses[j].Code; got != want {
						t.Errorf("call %d: status %d %v, want %v", i, j, got, want)
					}
				}
				if got := resp.Statuses[0].LimitRemaining; got != cl.remaining {
					t.Errorf("call %d: limit_remaining %d, want %d", i, got, cl.remaining)
				}
				if ra := header(resp, "retry-after"); (ra != "") != cl.retry || cl.retry && ra == "0" {
					t.Errorf("call %d: Retry-After %q, want one: %v", i, ra, cl.retry)
				}
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

// TestShouldRateLimitQuotaModeDetails: what an exhausted quota reports, the
// global shadow mode over quotas, and limit overrides, which Envoy counts without
// quota mode.
func TestShouldRateLimitQuotaModeDetails(t *testing.T) {
	req := func(kv ...[]string) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "rl"}
		for _, e := range kv {
			r.Descriptors = append(r.Descriptors, desc(e...))
		}
		return r
	}
	svc1, svc2 := []string{"service", "service_1"}, []string{"service", "service_2"}

	t.Run("headers describe the exhausted quota on an OK answer", func(t *testing.T) {
		c := rlsClient(t, parseRules(t, quotaRules), limiter.NewMemory())
		ask(t, c, req(svc1, svc2))
		resp := ask(t, c, req(svc1, svc2))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("overall %v", resp.OverallCode)
		}
		if got := header(resp, "x-ratelimit-remaining"); got != "0" {
			t.Errorf("X-Ratelimit-Remaining %q, want 0 (service_1 is exhausted)", got)
		}
		if l := resp.Statuses[0].CurrentLimit; l.GetName() != "service_1" || l.GetRequestsPerUnit() != 1 {
			t.Errorf("current_limit %v", l)
		}
	})

	t.Run("global shadow mode: every quota exhausted is OK, counted shadow_rejected", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		c := rlsClient(t, parseRules(t, quotaRules), limiter.NewMemory(), WithShadow(true), WithRegisterer(reg))
		ask(t, c, req(svc1))
		resp := ask(t, c, req(svc1))
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("%v", resp)
		}
		if got := decisiontest.Count(t, reg, "service_1", decide.OutcomeShadowDenied); got != 1 {
			t.Errorf("shadow_rejected = %v, want 1", got)
		}
	})

	t.Run("a limit override is not in quota mode", func(t *testing.T) {
		c := rlsClient(t, parseRules(t, quotaRules), limiter.NewMemory())
		o := func() *rlsv3.RateLimitRequest {
			r := req(svc1, svc2)
			r.Descriptors[0].Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
			return r
		}
		ask(t, c, o())
		// The override of service_1 is over its limit while service_2, a quota, has
		// room: were the override a quota, the request would pass on service_2.
		if resp := ask(t, c, o()); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
			resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%v", resp)
		}
	})
}

// TestShouldRateLimitDynamicMetadata: with WithDynamicMetadata the response names
// the quotas that still have room, by their rules' metadata, as Envoy's service does
// with RESPONSE_DYNAMIC_METADATA (its multiservice quota test: a proxy routes to the
// service the metadata names). Off by default.
func TestShouldRateLimitDynamicMetadata(t *testing.T) {
	const metaRules = quotaRules + `  - key: nested
    rate_limit: {unit: minute, requests_per_unit: 5}
    metadata:
      service_with_quota: {name: nested, weight: 2}
      other: [1, two]
`
	reqOf := func(hits uint32, kv ...[]string) *rlsv3.RateLimitRequest {
		r := &rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: hits}
		for _, e := range kv {
			r.Descriptors = append(r.Descriptors, desc(e...))
		}
		return r
	}
	svc1, svc2, nested := []string{"service", "service_1"}, []string{"service", "service_2"}, []string{"nested", "n"}

	if resp := ask(t, rlsClient(t, parseRules(t, metaRules), limiter.NewMemory()), reqOf(0, svc1)); resp.DynamicMetadata != nil {
		t.Fatalf("dynamic metadata while off: %v", resp.DynamicMetadata)
	}

	set := parseRules(t, metaRules)
	c := rlsClient(t, set, limiter.NewMemory(), WithDynamicMetadata(true))
	name := func(resp *rlsv3.RateLimitResponse) string {
		return resp.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
	}
	// Both quotas have room: the first descriptor's metadata wins.
	resp := ask(t, c, reqOf(0, svc1, svc2))
	if got := name(resp); got != "service_1" {
		t.Fatalf("first call: service_with_quota.name %q, want service_1\n%v", got, resp.DynamicMetadata)
	}
	md := resp.DynamicMetadata.GetFields()
	if md["domain"].GetStringValue() != "rl" || len(md["descriptors"].GetListValue().GetValues()) != 2 {
		t.Fatalf("domain and descriptors: %v", resp.DynamicMetadata)
	}
	if e := md["descriptors"].GetListValue().GetValues()[1].GetStructValue().GetFields()["entries"].GetListValue().GetValues(); len(e) != 1 || e[0].GetStringValue() != "service=service_2" {
		t.Fatalf("entries of the second descriptor: %v", e)
	}
	if _, ok := md["hitsAddend"]; ok {
		t.Fatalf("hitsAddend without one in the request: %v", md)
	}
	// service_1 is exhausted: the metadata names service_2, where a proxy routes.
	if resp = ask(t, c, reqOf(0, svc1, svc2)); resp.OverallCode != rlsv3.RateLimitResponse_OK || name(resp) != "service_2" {
		t.Fatalf("second call: %v, service_with_quota.name %q, want service_2", resp.OverallCode, name(resp))
	}
	// Every quota exhausted: no metadata of theirs; a passing rule's is merged.
	resp = ask(t, c, reqOf(1, svc1, svc2, nested))
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || name(resp) != "nested" {
		t.Fatalf("third call: %v, service_with_quota.name %q, want nested", resp.OverallCode, name(resp))
	}
	meta := resp.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()
	if w := meta["service_with_quota"].GetStructValue().GetFields()["weight"].GetNumberValue(); w != 2 {
		t.Errorf("weight %v, want 2", w)
	}
	if l := meta["other"].GetListValue().GetValues(); len(l) != 2 || l[1].GetStringValue() != "two" {
		t.Errorf("other %v", l)
	}
	if h := resp.DynamicMetadata.GetFields()["hitsAddend"].GetNumberValue(); h != 1 {
		t.Errorf("hitsAddend %v, want 1", h)
	}
	// Mappings under one key merge, the first value of a key staying; the rules'
	// own metadata is never written into.
	c2 := rlsClient(t, set, limiter.NewMemory(), WithDynamicMetadata(true))
	resp = ask(t, c2, reqOf(0, nested, svc2))
	sq := resp.DynamicMetadata.GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()
	if sq["name"].GetStringValue() != "nested" || sq["zone"].GetStringValue() != "b" || sq["weight"].GetNumberValue() != 2 {
		t.Fatalf("merged service_with_quota %v", sq)
	}
	seen := 0
	for _, r := range set.Rules() {
		m, ok := r.Metadata["service_with_quota"].(map[string]any)
		if !ok {
			continue
		}
		seen++
		if r.Name != "service_2" && m["zone"] != nil {
			t.Fatalf("rule %s's metadata was written into: %v", r.Name, r.Metadata)
		}
	}
	if seen != 3 {
		t.Fatalf("%d rules with service_with_quota, want 3", seen)
	}
}

// TestCheckQuotaModeDefers: quota_mode on ext_authz, with defer rules: an order
// passes while one quota has room, and once every quota is exhausted it is parked
// (202 with a ticket) and delivered.
func TestCheckQuotaModeDefers(t *testing.T) {
	c, got := authFixtureOf(t, `
domain: shop
descriptors:
  - key: svc
    value: a
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1, name: quota_a}
    on_limit: defer
    queue: orders
  - key: svc
    value: b
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2, name: quota_b}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {method: [POST], path: /v1/orders}
    descriptors: [[{key: svc, value: a}], [{key: svc, value: b}]]
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: DOWNSTREAM
`)
	order := func(n string) *authv3.CheckResponse {
		return check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: `{"n":` + n + `}`,
			headers: map[string]string{"content-length": "7"}})
	}
	if resp := order("1"); resp.GetOkResponse() == nil {
		t.Fatalf("first order: %v", resp)
	}
	resp := order("2")
	if resp.GetOkResponse() == nil || headerOf(resp.GetOkResponse().ResponseHeadersToAdd, "x-ratelimit-remaining") != "0" {
		t.Fatalf("second order (quota_a exhausted, quota_b has room): %v", resp)
	}
	code, _, body := denied(t, order("3"))
	ticket, _ := body["ticket"].(string)
	if code != http.StatusAccepted || ticket == "" {
		t.Fatalf("third order (every quota exhausted): %d %v", code, body)
	}
	if b := got.wait(t, ticket); b != `{"n":3}` {
		t.Fatalf("delivered %q", b)
	}
}

// TestShouldRateLimitQuotaModeManyDescriptors: one quota descriptor sent 20 times is
// counted 20 times, as Envoy's service counts it: the first call passes on the one
// that had room, the second finds every one exhausted.
func TestShouldRateLimitQuotaModeManyDescriptors(t *testing.T) {
	c := rlsClient(t, parseRules(t, quotaRules), limiter.NewMemory())
	req := &rlsv3.RateLimitRequest{Domain: "rl"}
	for range 20 {
		req.Descriptors = append(req.Descriptors, desc("service", "service_1"))
	}
	resp := ask(t, c, req)
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[19].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("first call: %v", resp)
	}
	if resp = ask(t, c, req); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("second call: %v", resp.OverallCode)
	}
}
