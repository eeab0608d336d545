package rules

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
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

func TestGlobalShadowMode(t *testing.T) {
	s := mustParse(t, "domain: d\nshadow_mode: true\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	if !s.Rules()[0].Shadow {
		t.Error("file-wide shadow_mode not applied")
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
	if a.Outflow != (limiter.Rate{Count: 5, Period: time.Second}) || a.MaxDepth != queue.DefaultMaxDepth || a.MaxBytes != 0 || a.MaxAge != 0 ||
		a.MaxAttempts != queue.DefaultMaxAttempts || a.MaxInFlight != queue.DefaultMaxInFlight ||
		a.Backoff != (queue.Backoff{Initial: queue.DefaultBackoffInitial, Max: queue.DefaultBackoffMax}) ||
		a.NATSSubject() != "work.a" || a.Downstream != "nats:work.a" ||
		a.MaxBody != queue.DefaultMaxBody || a.DropHeaders != nil || a.DeadLetterMaxAge != 14*24*time.Hour {
		t.Errorf("a = %+v", a)
	}
	if b.Outflow != (limiter.Rate{Count: 3000, Period: 10 * time.Minute}) || b.MaxDepth != 7 || b.MaxBytes != 512<<20 || b.MaxAge != 48*time.Hour ||
		b.MaxAttempts != 3 || b.MaxInFlight != 2 || b.Backoff != (queue.Backoff{Initial: 250 * time.Millisecond, Max: time.Minute}) ||
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
