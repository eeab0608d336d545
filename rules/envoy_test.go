package rules

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// envoyFile is written in the Envoy / Lyft rate limit service's syntax only.
const envoyFile = `
domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit:
          unit: day
          requests_per_unit: 5
  - key: to_number
    rate_limit:
      unit: day
      requests_per_unit: 100
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
  - key: ldap
    rate_limit:
      unlimited: true
  - key: service
    descriptors:
      - key: user
        value: user-a
        rate_limit:
          requests_per_unit: 10
          unit: second
        shadow_mode: true
      - key: user
        value: user-b
        rate_limit:
          requests_per_unit: 20
          unit: SECOND
        detailed_metric: true
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bob
        rate_limit:
          name: specific_limit
          requests_per_unit: 5
          unit: second
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bob
        rate_limit:
          replaces:
            - name: specific_limit
          requests_per_unit: 10
          unit: second
  - key: campaign
    value: spring-*
    rate_limit:
      unit: minute
      requests_per_unit: 3
  - key: campaign
    value: spring-sale
    rate_limit:
      unit: minute
      requests_per_unit: 30
  - key: campaign
    rate_limit:
      unit: hour
      requests_per_unit: 7
  - key: path
    value: /a
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
`

func ents(kv ...string) []Entry {
	var es []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// describeChecks writes checks as "descriptor limit" strings.
func describeChecks(cs []Check) []string {
	var out []string
	for _, c := range cs {
		r := c.Rule
		s := r.Descriptor + " "
		switch {
		case r.Unlimited:
			s += "unlimited"
		case r.Deny:
			s += "deny"
		default:
			var ls []string
			for _, l := range r.Limits {
				ls = append(ls, DescribeLimit(l))
			}
			s += strings.Join(ls, "+")
		}
		if r.Shadow {
			s += " shadow"
		}
		out = append(out, s)
	}
	return out
}

func TestEnvoySemantics(t *testing.T) {
	s := mustParse(t, envoyFile)
	tests := []struct {
		name  string
		descs [][]Entry
		want  []string
	}{
		{"nested key without value", [][]Entry{ents("message_type", "marketing", "to_number", "2061111111")},
			[]string{"message_type=marketing/to_number fixed_window 5/1d"}},
		{"several descriptors, all checked", [][]Entry{ents("message_type", "marketing", "to_number", "1"), ents("to_number", "1")},
			[]string{"message_type=marketing/to_number fixed_window 5/1d", "to_number fixed_window 100/1d"}},
		{"exact value before key only", [][]Entry{ents("remote_address", "50.0.0.5")}, []string{"remote_address=50.0.0.5 deny"}},
		{"key only for other values", [][]Entry{ents("remote_address", "50.0.0.1")}, []string{"remote_address fixed_window 10/1s"}},
		{"depth must match: request longer", [][]Entry{ents("remote_address", "50.0.0.1", "x", "y")}, nil},
		{"depth must match: request shorter", [][]Entry{ents("message_type", "marketing")}, nil},
		{"unknown key", [][]Entry{ents("nope", "1")}, nil},
		{"unknown value without key-only fallback", [][]Entry{ents("message_type", "other", "to_number", "1")}, nil},
		{"unlimited", [][]Entry{ents("ldap", "x")}, []string{"ldap unlimited"}},
		{"shadow mode", [][]Entry{ents("service", "auth", "user", "user-a")}, []string{"service/user=user-a fixed_window 10/1s shadow"}},
		{"unit in upper case", [][]Entry{ents("service", "auth", "user", "user-b")}, []string{"service/user=user-b fixed_window 20/1s"}},
		{"no limit for an unknown user", [][]Entry{ents("service", "auth", "user", "user-c")}, nil},
		{"replaces: alone the named limit applies", [][]Entry{ents("key_1", "value_1", "user", "bob")}, []string{"key_1=value_1/user=bob fixed_window 5/1s"}},
		{"replaces: the other alone", [][]Entry{ents("key_2", "value_2", "user", "bob")}, []string{"key_2=value_2/user=bob fixed_window 10/1s"}},
		{"replaces: together only the replacing limit", [][]Entry{ents("key_1", "value_1", "user", "bob"), ents("key_2", "value_2", "user", "bob")},
			[]string{"key_2=value_2/user=bob fixed_window 10/1s"}},
		{"exact before wildcard", [][]Entry{ents("campaign", "spring-sale")}, []string{"campaign=spring-sale fixed_window 30/1m"}},
		{"wildcard before key only", [][]Entry{ents("campaign", "spring-x")}, []string{"campaign=spring-* fixed_window 3/1m"}},
		{"key only after wildcard", [][]Entry{ents("campaign", "autumn")}, []string{"campaign fixed_window 7/1h"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := describeChecks(s.Evaluate("messaging", tc.descs, nil))
			if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
				t.Errorf("got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(tc.want, "\n  "))
			}
		})
	}
	if got := s.Evaluate("other-domain", [][]Entry{ents("ldap", "x")}, nil); len(got) != 0 {
		t.Errorf("unknown domain gave %v", got)
	}
}

func TestEnvoyDefaultsAndUnits(t *testing.T) {
	s := mustParse(t, `domain: d
descriptors:
  - {key: s, rate_limit: {unit: second, requests_per_unit: 1}}
  - {key: m, rate_limit: {unit: minute, requests_per_unit: 1}}
  - {key: h, rate_limit: {unit: hour, requests_per_unit: 1}}
  - {key: d, rate_limit: {unit: day, requests_per_unit: 1}}
  - {key: w, rate_limit: {unit: week, requests_per_unit: 1}}
  - {key: mo, rate_limit: {unit: month, requests_per_unit: 1}}
  - {key: y, rate_limit: {unit: year, requests_per_unit: 1}}
  - {key: win, rate_limit: {window: 1d12h, requests_per_unit: 1}}
`)
	want := map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour, "d": 24 * time.Hour,
		"w": 7 * 24 * time.Hour, "mo": 30 * 24 * time.Hour, "y": 365 * 24 * time.Hour, "win": 36 * time.Hour}
	for _, r := range s.Rules() {
		l := r.Limits[0]
		if l.Period != want[r.Descriptor] || l.Algorithm != limiter.FixedWindow || l.FailureMode != limiter.FailLocal || l.Rate != 1 || r.OnLimit != Reject {
			t.Errorf("%s: %+v %v", r.Descriptor, l, r.OnLimit)
		}
	}
}

func TestSluiceExtensions(t *testing.T) {
	s := mustParse(t, `domain: shop
shadow_mode: false
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
    algorithm: token_bucket
    burst: 4
    on_limit: defer
    queue: orders
    failure_mode: closed
  - key: ip
    algorithm: sliding_window_log
    forgive_rejected: true
    rate_limits:
      - {unit: second, requests_per_unit: 20}
      - {window: 10m, requests_per_unit: 3000, algorithm: sliding_window_counter, failure_mode: open}
      - {window: 90s, requests_per_unit: 100, algorithm: leaky_bucket, burst: 10}
queues:
  orders:
    outflow: {unit: minute, requests_per_unit: 600}
    downstream: https://orders.example/api
`)
	rules := map[string]*Rule{}
	for _, r := range s.Rules() {
		rules[r.Descriptor] = r
	}
	u := rules["user"]
	if want := (limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Second, Burst: 4, FailureMode: limiter.FailClosed}); u.Limits[0] != want {
		t.Errorf("user limit = %+v", u.Limits[0])
	}
	if u.OnLimit != Defer || u.Queue == nil || u.Queue.Name != "orders" || u.Queue.Outflow != (limiter.Rate{Count: 600, Period: time.Minute}) {
		t.Errorf("user rule = %+v", u)
	}
	ip := rules["ip"].Limits
	want := []limiter.Limit{
		{Algorithm: limiter.SlidingWindowLog, Rate: 20, Period: time.Second, ForgiveRejected: true, FailureMode: limiter.FailLocal},
		{Algorithm: limiter.SlidingWindowCounter, Rate: 3000, Period: 10 * time.Minute, ForgiveRejected: true, FailureMode: limiter.FailOpen},
		{Algorithm: limiter.LeakyBucket, Rate: 100, Period: 90 * time.Second, Burst: 10, ForgiveRejected: true, FailureMode: limiter.FailLocal},
	}
	if len(ip) != len(want) {
		t.Fatalf("ip limits = %+v", ip)
	}
	for i := range want {
		if ip[i] != want[i] {
			t.Errorf("ip limit %d = %+v, want %+v", i, ip[i], want[i])
		}
		if err := ip[i].Validate(); err != nil {
			t.Error(err)
		}
	}
}

// A top-level shadow_mode is accepted by Envoy's service and ignored (every rule stays
// enforced): true is refused rather than shadow the file; false means the same in both.
func TestTopLevelShadowMode(t *testing.T) {
	got := problems(t, "domain: d\nshadow_mode: true\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	if len(got) != 1 || !strings.HasPrefix(got[0], "t.yaml:2:14: shadow_mode at the top of the file: Envoy's rate limit service ignores it") {
		t.Errorf("problems = %q", got)
	}
	s := mustParse(t, "domain: d\nshadow_mode: false\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	if s.Rules()[0].Shadow {
		t.Error("shadow_mode: false at the top shadowed a rule")
	}
}

// Keys of the first wildcards (one final *), exact values and keys without value are
// the ones sluice computed before wildcards anywhere: counters survive the upgrade.
func TestWildcardKeysUnchanged(t *testing.T) {
	s := mustParse(t, "domain: k\ndescriptors:\n  - {key: w, value: foo*, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: a, value: '*', rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: e, value: x, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: n, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: g, value: 'a*b', rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: g, value: 'a*', rate_limit: {unit: minute, requests_per_unit: 5}}\n")
	tests := []struct {
		desc      []Entry
		key, name string
	}{
		{ents("w", "foo1"), "sl:k:cb18d455e8bd6aa3:fw1m:vCMlSWUFRxqxNZjnaOEk3Q", "k.w_foo*"},
		{ents("a", "z"), "sl:k:701bae474717686a:fw1m:t7_iYbDvL6NXzS8dPvHXWQ", "k.a_*"},
		{ents("e", "x"), "sl:k:d50120a10c6690d2:fw1m", "k.e_x"},
		{ents("n", "v"), "sl:k:f99a40afe5339134:fw1m:4984-10WWgm10me30OJE_w", "k.n"},
	}
	for _, tc := range tests {
		cs := s.Evaluate("k", [][]Entry{tc.desc}, nil)
		if len(cs) != 1 || cs[0].Key(0) != tc.key || cs[0].Rule.Name != tc.name {
			t.Errorf("%v: got %v", tc.desc, cs)
			continue
		}
	}
	// a*b and a* are different rules with different counters.
	ab := s.Evaluate("k", [][]Entry{ents("g", "axb")}, nil)
	a := s.Evaluate("k", [][]Entry{ents("g", "axc")}, nil)
	if len(ab) != 1 || len(a) != 1 || ab[0].Rule == a[0].Rule || strings.HasPrefix(ab[0].Key(0), a[0].Key(0)[:30]) {
		t.Errorf("a*b and a* share a rule or counter: %v %v", ab, a)
	}
}

func TestWildcardPatterns(t *testing.T) {
	tests := []struct {
		pattern string
		yes, no []string
	}{
		{"foo*", []string{"foo", "foobar"}, []string{"fo", "xfoo"}},
		{"*", []string{"", "anything"}, nil},
		{"bar*b", []string{"barb", "barab", "bar-b-b"}, []string{"bar", "barbx", "xbarb"}},
		{"*.example.com", []string{"a.example.com", "a.b.example.com", ".example.com"}, []string{"example.com", "a.example.com.evil", "aexample.com"}},
		{"/api/*/action", []string{"/api/v1/action", "/api//action", "/api/v1/v2/action"}, []string{"/api/v1/actions", "/api/action", "api/v1/action"}},
		{"a*b*c", []string{"abc", "aXbYc", "abbc", "abcbc"}, []string{"ab", "acb", "aXbY", "bc"}},
		{"**", []string{"", "x"}, nil},
		{"a**b", []string{"ab", "axxb"}, []string{"a", "ba"}},
		{"*ab*ab*", []string{"abab", "xabyabz"}, []string{"aba", "ab"}},
	}
	for _, tc := range tests {
		w := newWildNode(tc.pattern, nil)
		for _, v := range tc.yes {
			if !w.matches(v) {
				t.Errorf("%q does not match %q", tc.pattern, v)
			}
		}
		for _, v := range tc.no {
			if w.matches(v) {
				t.Errorf("%q matches %q", tc.pattern, v)
			}
		}
	}
	// A hostile value: long, almost matching. Linear work, right answer.
	long := strings.Repeat("a", 1<<20)
	if newWildNode("*a*b*", nil).matches(long) || !newWildNode("*a*a*", nil).matches(long) {
		t.Error("long value matched wrongly")
	}
}

// Wildcards anywhere apply to values routes take from requests, client addresses
// included (which are matched without building a string unless a pattern needs one).
func TestWildcardsOnRoutes(t *testing.T) {
	s := mustParse(t, `domain: edge
descriptors:
  - key: ip
    value: "10.*.0.1"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ip
    value: "192.168.*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: second, requests_per_unit: 3}
routes:
  - name: all
    descriptors:
      - [{key: ip, from: client_ip}]
      - [{key: host, from: host}]
`)
	tests := []struct {
		ip, host string
		want     string
	}{
		{"10.7.0.1", "a.example.com", "1/1s, 3/1s"},
		{"10.7.0.2", "example.com", ""},
		{"192.168.4.4", "x.example.com", "2/1s, 3/1s"},
		{"::ffff:192.168.4.4", "evil.com", "2/1s"},
	}
	for _, tc := range tests {
		r := req("GET", "/", "Host", tc.host)
		_, cs := s.Match(r, netip.MustParseAddr(tc.ip), nil)
		if got := describeLimits(cs); got != tc.want {
			t.Errorf("%s %s: got %q, want %q", tc.ip, tc.host, got, tc.want)
		}
	}
	// Each address and host counts on its own counter.
	_, a := s.Match(req("GET", "/", "Host", "a.example.com"), netip.MustParseAddr("10.1.0.1"), nil)
	_, b := s.Match(req("GET", "/", "Host", "b.example.com"), netip.MustParseAddr("10.2.0.1"), nil)
	if len(a) != 2 || len(b) != 2 || a[0].Key(0) == b[0].Key(0) || a[1].Key(0) == b[1].Key(0) {
		t.Errorf("values share counters: %v %v", a, b)
	}
}

func TestMetadataAndMetricFields(t *testing.T) {
	s := mustParse(t, `domain: m
descriptors:
  - key: route
    value: api/*
    value_to_metric: true
    share_threshold: true
    descriptors:
      - key: user
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 5}
        metadata:
          backend: {name: svc-a, weight: 3, tags: [x, y], ratio: 0.5, on: true, none: null}
`)
	r := s.Rules()[0]
	want := map[string]any{"backend": map[string]any{"name": "svc-a", "weight": 3, "tags": []any{"x", "y"}, "ratio": 0.5, "on": true, "none": nil}}
	if fmt.Sprint(r.Metadata) != fmt.Sprint(want) || !r.DetailedMetric {
		t.Errorf("metadata = %#v, detailed = %v", r.Metadata, r.DetailedMetric)
	}
	// Request values never reach the rule name (the metric label).
	cs := s.Evaluate("m", [][]Entry{ents("route", "api/secret-token", "user", "alice")}, nil)
	if len(cs) != 1 || strings.Contains(cs[0].Rule.Name, "secret") || strings.Contains(cs[0].Rule.Name, "alice") {
		t.Errorf("checks %v", cs)
	}
}

func TestUnitMultiplier(t *testing.T) {
	s := mustParse(t, "domain: d\ndescriptors:\n  - {key: a, rate_limit: {unit: minute, unit_multiplier: 5, requests_per_unit: 20}}\n  - {key: b, rate_limits: [{unit: second, unit_multiplier: 30, requests_per_unit: 2}]}\n")
	if got := s.Rules()[0].Limits[0].Period; got != 5*time.Minute {
		t.Errorf("a period = %v", got)
	}
	if got := s.Rules()[1].Limits[0].Period; got != 30*time.Second {
		t.Errorf("b period = %v", got)
	}
}

// With MergeDomains, files sharing a domain form one tree: descriptors, routes and
// replaces see each other; a descriptor repeated across them is a problem, as Envoy's.
func TestMergeDomains(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {name: per_user, unit: second, requests_per_unit: 5}\n")}
	b := File{Name: "b.yaml", Data: []byte(`domain: shop
descriptors:
  - key: plan
    value: gold
    descriptors:
      - key: user
        rate_limit: {replaces: [{name: per_user}], unit: second, requests_per_unit: 50}
routes:
  - name: gold
    descriptors:
      - [{key: user, from: "header:X-User"}]
      - [{key: plan, from: "header:X-Plan"}, {key: user, from: "header:X-User"}]
`)}
	if _, err := Parse(a, b); err == nil {
		t.Fatal("two files of one domain loaded without MergeDomains")
	}
	s, err := ParseWith([]File{a, b}, MergeDomains())
	if err != nil {
		t.Fatal(err)
	}
	if got := s.Domains(); len(got) != 1 || got[0] != "shop" {
		t.Errorf("domains = %v", got)
	}
	_, cs := s.Match(req("GET", "/", "X-User", "u", "X-Plan", "gold"), netip.Addr{}, nil)
	if got := describeLimits(cs); got != "50/1s" {
		t.Errorf("gold user: %q (the rule of b.yaml must replace the one of a.yaml)", got)
	}
	_, cs = s.Match(req("GET", "/", "X-User", "u"), netip.Addr{}, nil)
	if got := describeLimits(cs); got != "5/1s" {
		t.Errorf("user: %q", got)
	}
	dup := File{Name: "c.yaml", Data: []byte("domain: shop\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 1}\n")}
	_, err = ParseWith([]File{a, dup}, MergeDomains())
	if err == nil || !strings.Contains(err.Error(), `c.yaml:3:10: duplicate descriptor: key "user" without value`) {
		t.Errorf("repeated descriptor across merged files: %v", err)
	}

	dir := t.TempDir()
	write(t, dir, "a.yaml", string(a.Data))
	write(t, dir, "b.yaml", string(b.Data))
	if _, err := LoadWith([]string{dir}); err == nil {
		t.Error("LoadWith without MergeDomains loaded a shared domain")
	}
	if _, err := LoadWith([]string{dir}, MergeDomains()); err != nil {
		t.Error(err)
	}
}

// Match counts a rule once per request however many lists reach it with the same
// values (sluice's routes); Evaluate charges every descriptor it is sent, as Envoy.
func TestDuplicateDescriptors(t *testing.T) {
	s := mustParse(t, `domain: d
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
routes:
  - name: r
    descriptors:
      - [{key: user, from: "header:X-User"}]
      - [{key: user, from: "query:user"}]
`)
	_, cs := s.Match(req("GET", "/?user=u", "X-User", "u"), netip.Addr{}, nil)
	if len(cs) != 1 {
		t.Errorf("Match: %d checks, want 1", len(cs))
	}
	cs = s.Evaluate("d", [][]Entry{ents("user", "u"), ents("user", "v"), ents("user", "u")}, nil)
	if len(cs) != 3 || cs[0].Key(0) != cs[2].Key(0) || cs[0].Key(0) == cs[1].Key(0) || cs[2].Descriptor != 2 {
		t.Errorf("Evaluate: %v", cs)
	}
}

func TestQueueDefaults(t *testing.T) {
	s := mustParse(t, `domain: d
queues:
  a: {outflow: 5/s, downstream: 'nats:work.a'}
  b:
    outflow: {rate: 3000/10m}
    max_depth: 7
    max_bytes: 512MiB
    max_age: 2d
    max_attempts: 3
    max_in_flight: 2
    backoff: {initial: 250ms, max: 1m}
    downstream: http://b.internal:9000/base
    max_body: 8MiB
    drop_headers: [Authorization, cookie]
    dead_letter_max_age: 30d
`)
	a, b := s.Queue("a"), s.Queue("b")
	if a.Outflow != (limiter.Rate{Count: 5, Period: time.Second}) || a.MaxDepth != queueconfig.DefaultMaxDepth || a.MaxBytes != 0 || a.MaxAge != 0 ||
		a.MaxAttempts != queueconfig.DefaultMaxAttempts || a.MaxInFlight != queueconfig.DefaultMaxInFlight ||
		a.Backoff != (queueconfig.Backoff{Initial: queueconfig.DefaultBackoffInitial, Max: queueconfig.DefaultBackoffMax}) ||
		a.NATSSubject() != "work.a" || a.Downstream != "nats:work.a" ||
		a.MaxBody != queueconfig.DefaultMaxBody || a.DropHeaders != nil || a.DeadLetterMaxAge != 14*24*time.Hour {
		t.Errorf("a = %+v", a)
	}
	if b.Outflow != (limiter.Rate{Count: 3000, Period: 10 * time.Minute}) || b.MaxDepth != 7 || b.MaxBytes != 512<<20 || b.MaxAge != 48*time.Hour ||
		b.MaxAttempts != 3 || b.MaxInFlight != 2 || b.Backoff != (queueconfig.Backoff{Initial: 250 * time.Millisecond, Max: time.Minute}) ||
		b.NATSSubject() != "" || b.Downstream != "http://b.internal:9000/base" ||
		b.MaxBody != 8<<20 || !slices.Equal(b.DropHeaders, []string{"Authorization", "cookie"}) || b.DeadLetterMaxAge != 30*24*time.Hour {
		t.Errorf("b = %+v", b)
	}
	if got := b.Outflow.Interval(); got != 200*time.Millisecond {
		t.Errorf("interval = %v", got)
	}
	if got := len(s.Queues()); got != 2 {
		t.Errorf("queues = %d", got)
	}
}
