package rules

import (
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

const routesFile = `
domain: api
descriptors:
  - key: route
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: ip
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: ip
    value: 10.9.9.9
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: tenant
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: order
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: method
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: host
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: page
    rate_limit: {unit: second, requests_per_unit: 7}
routes:
  - name: exact
    match: {path: /v1/orders}
    descriptors: [[{key: route, value: exact}, {key: user, from: "header:X-User"}]]
  - name: exact-post
    match: {method: [POST], path: /v1/orders}
    descriptors: [[{key: route, value: never}, {key: user, from: "header:X-User"}]]
  - name: pattern
    match: {path_pattern: "/v1/orders/{order}"}
    descriptors: [[{key: order, from: "path:{order}"}]]
  - name: pattern-literal
    match: {path_pattern: "/v1/orders/special"}
    descriptors: [[{key: route, value: special}, {key: user, from: "header:X-User"}]]
  - name: pattern-deep
    match: {path_pattern: "/v1/{a}/{b}/items"}
    descriptors: [[{key: page, from: "path:b"}]]
  - name: prefix-long
    match: {path_prefix: /v1/orders/x}
    descriptors: [[{key: route, value: long}, {key: user, from: "header:X-User"}]]
  - name: prefix-short
    match: {path_prefix: /v1/}
    descriptors: [[{key: ip, from: client_ip}]]
  - name: host-only
    match: {host: "*.example.com", headers: [{name: X-Tenant, present: true}]}
    descriptors:
      - [{key: tenant, from: "header:X-Tenant"}]
      - [{key: host, from: host}]
  - name: query
    match: {path_prefix: /search, method: [GET, HEAD]}
    descriptors:
      - [{key: page, from: "query:page", default: first}]
      - [{key: method, from: method}]
  - name: ipv6-host
    match: {host: "[2001:db8::1]", path: /v6}
    descriptors: [[{key: ip, from: client_ip}]]
  - name: header-value
    match: {headers: [{name: X-Env, value: canary}, {name: X-Debug, present: false}]}
    descriptors: [[{key: ip, from: client_ip}]]
  - name: catch-all
    descriptors: [[{key: ip, from: client_ip}], [{key: ip, from: client_ip}]]
`

func req(method, target string, headers ...string) *http.Request {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i] == "Host" {
			r.Host = headers[i+1]
			continue
		}
		r.Header.Add(headers[i], headers[i+1])
	}
	return r
}

func TestRouteSelection(t *testing.T) {
	s := mustParse(t, routesFile)
	tests := []struct {
		r    *http.Request
		want string
	}{
		{req("GET", "/v1/orders"), "exact"},
		{req("POST", "/v1/orders"), "exact"}, // first in file order wins among equal paths
		{req("GET", "/v1/orders/"), "exact"}, // cleaned
		{req("GET", "/v1//orders"), "exact"},
		{req("GET", "/v1/x/../orders"), "exact"},
		{req("GET", "/v1/orders/7"), "pattern"},
		{req("GET", "/v1/orders/special"), "pattern-literal"}, // literal segment before {param}
		{req("GET", "/v1/a/b/items"), "pattern-deep"},
		{req("GET", "/v1/orders/7/lines"), "prefix-short"}, // patterns match whole paths only
		{req("GET", "/v1/orders/x/y"), "prefix-long"},      // longest prefix
		{req("GET", "/v1/orders/xy/z"), "prefix-short"},    // prefixes end on a segment
		{req("GET", "/v1"), "prefix-short"},
		{req("GET", "/v2", "Host", "a.example.com", "X-Tenant", "t1"), "host-only"},
		{req("GET", "/v2", "Host", "A.EXAMPLE.COM:8443", "X-Tenant", "t1"), "host-only"},
		{req("GET", "/v2", "Host", "example.com", "X-Tenant", "t1"), "catch-all"}, // *.x needs a subdomain
		{req("GET", "/v2", "Host", "a.example.com"), "catch-all"},                 // header must be present
		{req("GET", "/search?q=1"), "query"},
		{req("GET", "/v6", "Host", "[2001:DB8::1]:8080"), "ipv6-host"},
		{req("GET", "/v6", "Host", "example.com."), "catch-all"},
		{req("POST", "/search"), "catch-all"},
		{req("GET", "/other", "X-Env", "canary"), "header-value"},
		{req("GET", "/other", "X-Env", "canary", "X-Debug", "1"), "catch-all"},
		{req("GET", "/other", "X-Env", "prod"), "catch-all"},
	}
	for _, tc := range tests {
		rt, _ := s.Match(tc.r, netip.Addr{}, nil)
		got := "<none>"
		if rt != nil {
			got = rt.Name
		}
		if got != tc.want {
			t.Errorf("%s %s (host %q) matched %s, want %s", tc.r.Method, tc.r.URL, tc.r.Host, got, tc.want)
		}
	}
	if s.Route("pattern") == nil || s.Route("nope") != nil || len(s.Routes()) != 12 {
		t.Error("Route/Routes lookups")
	}
}

func TestNoRoute(t *testing.T) {
	s := mustParse(t, "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\nroutes:\n  - name: r\n    match: {path: /x}\n    descriptors: [[{key: a, value: b}]]\n")
	buf := make([]Check, 0, 4)
	rt, cs := s.Match(req("GET", "/y"), netip.Addr{}, buf)
	if rt != nil || len(cs) != 0 {
		t.Errorf("matched %v %v", rt, cs)
	}
}

func TestDescriptorSources(t *testing.T) {
	s := mustParse(t, routesFile)
	ip := netip.MustParseAddr("192.0.2.7")
	tests := []struct {
		name string
		r    *http.Request
		ip   netip.Addr
		want []string // Rule.Descriptor of each check
	}{
		{"header", req("GET", "/v1/orders", "X-User", "42"), ip, []string{"route/user"}},
		{"header absent: list skipped", req("GET", "/v1/orders"), ip, nil},
		{"header empty: list skipped", req("GET", "/v1/orders", "X-User", ""), ip, nil},
		{"path param", req("GET", "/v1/orders/77"), ip, []string{"order"}},
		{"path param by name without braces", req("GET", "/v1/q/r/items"), ip, []string{"page"}},
		{"client ip", req("GET", "/v1/zzz"), ip, []string{"ip"}},
		{"client ip exact value", req("GET", "/v1/zzz"), netip.MustParseAddr("10.9.9.9"), []string{"ip=10.9.9.9"}},
		{"client ip v4-mapped", req("GET", "/v1/zzz"), netip.MustParseAddr("::ffff:10.9.9.9"), []string{"ip=10.9.9.9"}},
		{"client ip unknown: skipped", req("GET", "/v1/zzz"), netip.Addr{}, nil},
		{"tenant and host", req("GET", "/", "Host", "a.example.com", "X-Tenant", "t"), ip, []string{"tenant", "host"}},
		{"query with default", req("GET", "/search"), ip, []string{"page", "method"}},
		{"duplicate lists count once", req("GET", "/zzz"), ip, []string{"ip"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, cs := s.Match(tc.r, tc.ip, nil)
			var got []string
			for _, c := range cs {
				got = append(got, c.Rule.Descriptor)
			}
			if strings.Join(got, ",") != strings.Join(tc.want, ",") {
				t.Errorf("checks %v, want %v", got, tc.want)
			}
		})
	}
}

func TestQueryValue(t *testing.T) {
	tests := []struct {
		raw, name, want string
		ok              bool
	}{
		{"a=1&b=2", "b", "2", true},
		{"a=1&a=2", "a", "1", true},
		{"a=x%20y", "a", "x y", true},
		{"a=x+y", "a", "x y", true},
		{"my%20key=v", "my key", "v", true},
		{"a=", "a", "", false},
		{"a", "a", "", false},
		{"b=1", "a", "", false},
		{"a=%zz", "a", "", false},
		{"", "a", "", false},
	}
	for _, tc := range tests {
		got, ok := queryValue(tc.raw, tc.name)
		if got != tc.want || ok != tc.ok {
			t.Errorf("queryValue(%q, %q) = %q, %v", tc.raw, tc.name, got, ok)
		}
	}
}

func TestKeys(t *testing.T) {
	s := mustParse(t, routesFile)
	key := func(r *http.Request, ip string) string {
		var a netip.Addr
		if ip != "" {
			a = netip.MustParseAddr(ip)
		}
		_, cs := s.Match(r, a, nil)
		if len(cs) != 1 || len(cs[0].Rule.Limits) != 1 {
			t.Fatalf("checks = %v", cs)
		}
		return cs[0].Key(0)
	}
	secret := "sk_live_ABCDEF0123456789"
	k1 := key(req("GET", "/v1/orders", "X-User", secret), "")
	k2 := key(req("GET", "/v1/orders", "X-User", secret), "")
	k3 := key(req("GET", "/v1/orders", "X-User", "someone-else"), "")
	if k1 != k2 || k1 == k3 {
		t.Errorf("same values must share a key, others not: %s %s %s", k1, k2, k3)
	}
	if strings.Contains(k1, secret) || strings.Contains(k1, "ABCDEF") {
		t.Errorf("key %s contains the raw value", k1)
	}
	if !strings.HasPrefix(k1, "sl:api:") || strings.Count(k1, ":") != 4 || len(k1) > 100 {
		t.Errorf("key shape %s", k1)
	}
	ipKey := key(req("GET", "/v1/z"), "203.0.113.9")
	if strings.Contains(ipKey, "203.0.113") {
		t.Errorf("key %s contains the client address", ipKey)
	}
	if key(req("GET", "/v1/z"), "::ffff:203.0.113.9") != ipKey {
		t.Error("v4-mapped and plain IPv4 must share a key")
	}
	// A value read from another source counts on the same counter (Envoy: the
	// descriptor is the identity, not where it came from).
	a := mustParse(t, `domain: d
descriptors:
  - {key: user, rate_limit: {unit: second, requests_per_unit: 1}}
routes:
  - name: by-header
    match: {path: /h}
    descriptors: [[{key: user, from: "header:X-User"}]]
  - name: by-query
    match: {path: /q}
    descriptors: [[{key: user, from: "query:user"}]]
  - name: constant
    match: {path: /c}
    descriptors: [[{key: user, value: "7"}]]
`)
	_, h := a.Match(req("GET", "/h", "X-User", "7"), netip.Addr{}, nil)
	_, q := a.Match(req("GET", "/q?user=7"), netip.Addr{}, nil)
	_, c := a.Match(req("GET", "/c"), netip.Addr{}, nil)
	if h[0].Key(0) != q[0].Key(0) || h[0].Key(0) != c[0].Key(0) {
		t.Errorf("keys differ: %s %s %s", h[0].Key(0), q[0].Key(0), c[0].Key(0))
	}
	// Several limits: a key each, all different, each the right one.
	m := mustParse(t, `domain: d
descriptors:
  - key: ip
    rate_limits:
      - {unit: second, requests_per_unit: 1}
      - {unit: minute, requests_per_unit: 10, algorithm: token_bucket}
      - {window: 10m, requests_per_unit: 100, algorithm: sliding_window_counter}
routes:
  - name: r
    descriptors: [[{key: ip, from: client_ip}]]
`)
	_, cs := m.Match(req("GET", "/"), netip.MustParseAddr("2001:db8::1"), nil)
	keys := []string{cs[0].Key(0), cs[0].Key(1), cs[0].Key(2)}
	for i, suffix := range []string{":fw1s:", ":tb1m:", ":swc10m:"} {
		if !strings.Contains(keys[i], suffix) {
			t.Errorf("key %d = %s, want %s in it", i, keys[i], suffix)
		}
	}
	if keys[0] == keys[1] || keys[1] == keys[2] {
		t.Errorf("keys collide: %v", keys)
	}
	// Keys do not change across a reload of the same rules.
	m2 := mustParse(t, strings.Replace(routesFile, "domain: api", "domain: api\n# edited", 1))
	_, again := m2.Match(req("GET", "/v1/orders", "X-User", secret), netip.Addr{}, nil)
	if again[0].Key(0) != k1 {
		t.Errorf("key changed across reload: %s vs %s", again[0].Key(0), k1)
	}
}

func TestRuleNamesHideRequestValues(t *testing.T) {
	s := mustParse(t, `domain: shop
descriptors:
  - key: api_key
    value: sk_live_0123456789
    rate_limit: {unit: second, requests_per_unit: 100}
  - key: api_key
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: route
    value: orders
    descriptors:
      - key: remote
        value: 203.0.113.5
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: plan
    value: gold
    rate_limit:
      name: "gold plan!"
      unit: second
      requests_per_unit: 1
routes:
  - name: r
    descriptors:
      - [{key: api_key, from: "header:X-Api-Key"}]
      - [{key: route, value: orders}, {key: remote, value: 203.0.113.5}]
      - [{key: plan, value: gold}]
`)
	names := map[string]string{}
	for _, r := range s.Rules() {
		names[r.Descriptor] = r.Name
	}
	if n := names["api_key=sk_live_0123456789"]; strings.Contains(n, "sk_live") || !strings.HasPrefix(n, "shop.api_key_h") {
		t.Errorf("name %q", n)
	}
	if n := names["api_key"]; n != "shop.api_key" {
		t.Errorf("name %q", n)
	}
	if n := names["route=orders/remote=203.0.113.5"]; strings.Contains(n, "203.0") || !strings.HasPrefix(n, "shop.route_orders.remote_h") {
		t.Errorf("name %q", n)
	}
	if n := names["plan=gold"]; n != "gold_plan_" {
		t.Errorf("name %q", n)
	}
	long := mustParse(t, "domain: "+strings.Repeat("d", 200)+"\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	if n := long.Rules()[0].Name; len(n) != maxNameLen {
		t.Errorf("long name %d bytes: %s", len(n), n)
	}
}

func TestReplacesWithinARoute(t *testing.T) {
	s := mustParse(t, `domain: d
descriptors:
  - key: route
    descriptors:
      - key: user
        rate_limit: {name: per_user, unit: second, requests_per_unit: 1}
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 10, replaces: [{name: per_user}]}
routes:
  - name: r
    descriptors:
      - [{key: route, value: x}, {key: user, from: "header:X-User"}]
      - [{key: plan, from: "header:X-Plan"}, {key: user, from: "header:X-User"}]
`)
	_, cs := s.Match(req("GET", "/", "X-User", "u"), netip.Addr{}, nil)
	if got := describeChecks(cs); strings.Join(got, ",") != "route/user fixed_window 1/1s" {
		t.Errorf("without plan: %v", got)
	}
	_, cs = s.Match(req("GET", "/", "X-User", "u", "X-Plan", "gold"), netip.Addr{}, nil)
	if got := describeChecks(cs); strings.Join(got, ",") != "plan=gold/user fixed_window 10/1s" {
		t.Errorf("with gold plan: %v", got)
	}
	ex := s.Explain(req("GET", "/", "X-User", "u", "X-Plan", "gold"), netip.Addr{})
	if ex.Descriptors[0].ReplacedBy != "d.plan_h"+ex.Descriptors[1].Rule.Name[len("d.plan_h"):] || ex.Descriptors[1].Check == nil {
		t.Errorf("explain: %+v", ex.Descriptors)
	}
}

func TestExplain(t *testing.T) {
	s := mustParse(t, routesFile)
	ex := s.Explain(req("GET", "/zzz"), netip.MustParseAddr("192.0.2.1"))
	if ex.Route == nil || ex.Route.Name != "catch-all" || len(ex.Descriptors) != 2 || len(ex.Checks) != 1 {
		t.Fatalf("explain: %+v", ex)
	}
	d0, d1 := ex.Descriptors[0], ex.Descriptors[1]
	if d0.Check == nil || d0.Entries[0] != (Entry{"ip", "192.0.2.1"}) || !d1.Duplicate || d1.Check != nil {
		t.Errorf("descriptors: %+v", ex.Descriptors)
	}
	ex = s.Explain(req("GET", "/v1/orders"), netip.Addr{})
	if ex.Descriptors[0].Missing != "header:X-User" {
		t.Errorf("missing = %q", ex.Descriptors[0].Missing)
	}
	if ex := s.Explain(req("GET", "/x"), netip.Addr{}); ex.Route == nil || ex.Route.Name != "catch-all" || ex.Descriptors[0].Missing != "client_ip" {
		t.Errorf("explain without ip: %+v", ex)
	}
}

func TestMatchAllocations(t *testing.T) {
	s := mustParse(t, routesFile)
	ip := netip.MustParseAddr("192.0.2.1")
	buf := make([]Check, 0, 8)
	tests := []struct {
		name string
		r    *http.Request
		want float64
	}{
		{"no route", req("GET", "/v1/orders/special"), 0}, // header absent: nothing to key
		{"exact value, precomputed key", req("GET", "/v1/zzz"), 0},
		{"client ip", req("GET", "/v1/zzz"), 1},
		{"header", req("GET", "/v1/orders", "X-User", "u-1"), 1},
		{"long header", req("GET", "/v1/orders", "X-User", strings.Repeat("k", 200)), 1},
		{"two lists", req("GET", "/search?page=3"), 2},
	}
	for _, tc := range tests {
		addr := ip
		if tc.name == "exact value, precomputed key" {
			addr = netip.MustParseAddr("10.9.9.9") // ip=10.9.9.9 denies: no keys at all
		}
		got := testing.AllocsPerRun(200, func() { s.Match(tc.r, addr, buf[:0]) })
		if got > tc.want {
			t.Errorf("%s: %v allocations per Match, want at most %v", tc.name, got, tc.want)
		}
	}
}

// TestMatchWalksPastLeadingConstants: a route's descriptor list whose leading
// constants Match walks once, at compile time, yields the rule and the key that
// Evaluate, which walks every level for each request, gives for the same values:
// constants matched exactly, by a wildcard (whose value goes into the key), under a
// share_threshold wildcard (whose value does not), by a descriptor without value, on
// two levels, and a value hashed below them.
func TestMatchWalksPastLeadingConstants(t *testing.T) {
	s := mustParse(t, `domain: k
descriptors:
  - key: route
    value: orders
    descriptors:
      - {key: user, rate_limit: {unit: second, requests_per_unit: 1, name: exact}}
  - key: plan
    value: gold*
    descriptors:
      - {key: user, rate_limit: {unit: second, requests_per_unit: 2, name: wild}}
  - key: region
    value: eu*
    share_threshold: true
    descriptors:
      - {key: user, rate_limit: {unit: second, requests_per_unit: 3, name: shared}}
  - key: tenant
    descriptors:
      - {key: user, rate_limit: {unit: second, requests_per_unit: 4, name: any}}
  - key: a
    value: x
    descriptors:
      - key: b
        value: y
        descriptors:
          - key: user
            descriptors:
              - {key: item, rate_limit: {unit: second, requests_per_unit: 5, name: deep}}
routes:
  - {name: exact, match: {path: /exact}, descriptors: [[{key: route, value: orders}, {key: user, from: "header:X-User"}]]}
  - {name: wild, match: {path: /wild}, descriptors: [[{key: plan, value: gold-1}, {key: user, from: "header:X-User"}]]}
  - {name: shared, match: {path: /shared}, descriptors: [[{key: region, value: eu-west}, {key: user, from: "header:X-User"}]]}
  - {name: any, match: {path: /any}, descriptors: [[{key: tenant, value: t1}, {key: user, from: "header:X-User"}]]}
  - name: deep
    match: {path: /deep}
    descriptors: [[{key: a, value: x}, {key: b, value: y}, {key: user, from: "header:X-User"}, {key: item, value: i}]]
`)
	for _, tc := range []struct {
		path string
		desc []Entry
	}{
		{"/exact", []Entry{{"route", "orders"}, {"user", "u"}}},
		{"/wild", []Entry{{"plan", "gold-1"}, {"user", "u"}}},
		{"/shared", []Entry{{"region", "eu-west"}, {"user", "u"}}},
		{"/any", []Entry{{"tenant", "t1"}, {"user", "u"}}},
		{"/deep", []Entry{{"a", "x"}, {"b", "y"}, {"user", "u"}, {"item", "i"}}},
	} {
		_, got := s.Match(req("GET", tc.path, "X-User", "u"), netip.Addr{}, nil)
		want := s.Evaluate("k", [][]Entry{tc.desc}, nil)
		if len(got) != 1 || len(want) != 1 {
			t.Fatalf("%s: Match %v, Evaluate %v", tc.path, got, want)
		}
		if got[0].Rule != want[0].Rule || got[0].Key(0) != want[0].Key(0) {
			t.Errorf("%s: Match %s %s, Evaluate %s %s", tc.path, got[0].Rule.Name, got[0].Key(0), want[0].Rule.Name, want[0].Key(0))
		}
	}
}
