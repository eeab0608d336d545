package rules

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// parse compiles one file named t.yaml.
func parse(src string) (*Set, error) {
	return Parse(File{Name: "t.yaml", Data: []byte(src)})
}

func mustParse(t testing.TB, src string) *Set {
	t.Helper()
	s, err := parse(src)
	if err != nil {
		t.Fatalf("unexpected problems:\n%v", err)
	}
	return s
}

// problems returns the problems of src as FILE:LINE:COL: msg strings.
func problems(t testing.TB, src string) []string {
	t.Helper()
	s, err := parse(src)
	if err == nil {
		t.Fatalf("no problems; want some (set %v)", s.Summary())
	}
	var ps Problems
	if !errors.As(err, &ps) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("error %T %v is not Problems matching ErrInvalid", err, err)
	}
	if s != nil {
		t.Fatal("a set came back with problems")
	}
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

const queueYAML = `
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: http://orders:8080
`

func TestValidationProblems(t *testing.T) {
	tests := []struct {
		name string
		src  string
		want []string // each a problem, as FILE:LINE:COL: a substring of the message
	}{
		{"unknown top-level field", "domain: d\ndescriptor: []\n",
			[]string{`t.yaml:2:1: unknown field "descriptor" in the file (did you mean "descriptors"?)`}},
		{"unknown descriptor field", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    algoritm: token_bucket\n",
			[]string{`t.yaml:5:5: unknown field "algoritm" in a descriptor (did you mean "algorithm"?)`}},
		{"unknown field in rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1, bogus: 1}\n",
			[]string{`t.yaml:4:54: unknown field "bogus" in rate_limit`}},
		{"missing domain", "descriptors: []\n", []string{"t.yaml:1:1: missing domain"}},
		{"empty domain", "domain: ''\n", []string{"t.yaml:1:9: domain must not be empty"}},
		{"empty file", "", []string{"t.yaml: empty file"}},
		{"comment-only file", "# nothing\n", []string{"t.yaml: empty file"}},
		{"not a mapping", "- a\n- b\n", []string{"t.yaml:1:1: not a rules file: the top level must be a mapping with a domain, got a list"}},
		// YAML syntax errors where the mistake is (yaml.v3 names the line where the
		// construct around it starts, or the one before, and no column).
		{"yaml syntax: indentation", "domain: d\ndescriptors:\n  - key: a\n   value: b\n", []string{"t.yaml:4:4: invalid YAML: did not find expected '-' indicator"}},
		{"yaml syntax: unclosed flow mapping", "domain: d\ndescriptors:\n  - key: route\n    value: orders\n    rate_limit: {unit: second, requests_per_unit: 2\n  - key: user\n",
			[]string{"t.yaml:5:17: invalid YAML: did not find expected ',' or '}'"}},
		{"yaml syntax: unclosed quote", "domain: d\ndescriptors:\n  - key: a\n    value: \"b\n", []string{"t.yaml:4:12: invalid YAML: found unexpected end of stream"}},
		{"yaml syntax: tab", "domain: d\n\tdescriptors: []\n", []string{"t.yaml:2:1: invalid YAML: found a tab character that violates indentation"}},
		{"yaml syntax: far into a block", "domain: d\ndescriptors:\n" + strings.Repeat("  - key: a\n    value: b\n", 40) + "  - key: c\n   value: d\n",
			[]string{"t.yaml:84:4: invalid YAML: did not find expected '-' indicator"}},
		{"yaml syntax: column in characters", "domain: d\ndescriptors:\n  - key: é\n    value: \"ü\n", []string{"t.yaml:4:12: invalid YAML: found unexpected end of stream"}},
		{"yaml syntax in a second document", "domain: d\n---\ndomain: [e\n", []string{"t.yaml:3:9: invalid YAML"}},
		{"two documents", "domain: d\n---\ndomain: e\n", []string{"more than one YAML document"}},
		{"duplicate field", "domain: d\ndomain: e\n", []string{`t.yaml:2:1: duplicate field "domain" in the file (first at line 1)`}},
		{"unknown unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
			[]string{`t.yaml:4:24: unknown unit "fortnight"`}},
		{"unknown algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n    algorithm: leaky\n",
			[]string{`t.yaml:5:16: unknown algorithm "leaky"`}},
		{"negative limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: -1}\n",
			[]string{"t.yaml:4:51: requests_per_unit must not be negative"}},
		{"zero limit with sluice fields", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 0}\n    algorithm: token_bucket\n",
			[]string{"t.yaml:4:51: requests_per_unit must be at least 1"}},
		{"zero limit in rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 0}\n",
			[]string{"t.yaml:5:43: requests_per_unit must be at least 1"}},
		{"zero window", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {window: 0s, requests_per_unit: 5}\n",
			[]string{"t.yaml:5:18: window must be positive"}},
		{"window without unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {window: 30, requests_per_unit: 5}\n",
			[]string{`t.yaml:5:18: window: duration "30" needs a unit`}},
		{"unit and window", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, window: 2s, requests_per_unit: 5}\n",
			[]string{"t.yaml:4:40: give either unit or window, not both"}},
		{"no unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {requests_per_unit: 5}\n",
			[]string{"t.yaml:4:17: rate limit needs a unit"}},
		{"no requests_per_unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second}\n",
			[]string{"t.yaml:4:17: rate limit needs requests_per_unit"}},
		{"not a number", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: many}\n",
			[]string{`t.yaml:4:51: requests_per_unit must be a whole number, got a string`}},
		{"burst on a window algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 5, burst: 3}\n",
			[]string{"t.yaml:5:53: burst applies only to token_bucket and leaky_bucket"}},
		{"forgive on a bucket", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    algorithm: token_bucket\n    forgive_rejected: true\n",
			[]string{"t.yaml:6:23: forgive_rejected applies only to sliding_window_log"}},
		{"same algorithm and window twice", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 5}\n      - {window: 1s, requests_per_unit: 3}\n",
			[]string{"t.yaml:6:9: two limits with the same algorithm and window (also at line 5)"}},
		{"rate_limit and rate_limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    rate_limits: [{unit: minute, requests_per_unit: 50}]\n",
			[]string{"t.yaml:5:18: use either rate_limit or rate_limits"}},
		{"unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
			[]string{"t.yaml:4:17: an unlimited rate_limit must not have a unit or window"}},
		{"extension without a limit", "domain: d\ndescriptors:\n  - key: a\n    on_limit: defer\n    queue: orders\n" + queueYAML,
			[]string{"t.yaml:4:5: on_limit has no effect on a descriptor without rate_limit", "t.yaml:5:5: queue has no effect"}},
		{"defer without queue", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    on_limit: defer\n",
			[]string{"t.yaml:5:15: on_limit: defer needs a queue"}},
		{"defer with unknown queue", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    on_limit: defer\n    queue: order\n" + queueYAML,
			[]string{`t.yaml:6:12: unknown queue "order" (known: orders)`}},
		{"queue without defer", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    queue: orders\n" + queueYAML,
			[]string{"t.yaml:5:12: queue is used only with on_limit: defer"}},
		{"bad on_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    on_limit: drop\n",
			[]string{`t.yaml:5:15: on_limit must be reject, defer or wait, got "drop"`}},
		{"bad failure_mode", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\n    failure_mode: maybe\n",
			[]string{`t.yaml:5:19: failure_mode must be local, open or closed`}},
		{"duplicate descriptor with value", "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n    value: x\n",
			[]string{`t.yaml:5:10: duplicate descriptor: key "a" with value "x"`}},
		{"duplicate descriptor without value", "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n      - key: b\n",
			[]string{`t.yaml:6:14: duplicate descriptor: key "b" without value`}},
		{"share_threshold without wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: x\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:5:22: share_threshold applies only to a value with a wildcard"}},
		{"share_threshold without value", "domain: d\ndescriptors:\n  - key: a\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:22: share_threshold applies only to a value with a wildcard"}},
		{"quota_mode not a boolean", "domain: d\ndescriptors:\n  - key: a\n    quota_mode: sometimes\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:17: quota_mode must be"}},
		{"name beside rate_limit", "domain: d\ndescriptors:\n  - key: a\n    name: n\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:5: name beside rate_limit: Envoy's rate limit service reads it only inside rate_limit"}},
		{"replaces beside rate_limit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {name: n, unit: second, requests_per_unit: 1}\n  - key: b\n    replaces: [{name: n}]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:6:5: replaces beside rate_limit"}},
		{"unit_multiplier zero", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, unit_multiplier: 0, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:49: unit_multiplier must be at least 1, got 0"}},
		{"unit_multiplier with window", "domain: d\ndescriptors:\n  - key: a\n    rate_limits: [{window: 5s, unit_multiplier: 2, requests_per_unit: 1}]\n",
			[]string{"t.yaml:4:49: unit_multiplier goes with unit"}},
		{"unit_multiplier too large", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: year, unit_multiplier: 1000, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:47: unit_multiplier 1000 makes the period too long"}},
		{"metadata not a mapping", "domain: d\ndescriptors:\n  - key: a\n    metadata: [x]\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:15: metadata must be a mapping, got a list"}},
		{"value_to_metric not a boolean", "domain: d\ndescriptors:\n  - key: a\n    value_to_metric: lots\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
			[]string{"t.yaml:4:22: value_to_metric must be true or false"}},
		{"same key different values is fine, missing key is not", "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n    value: y\n  - value: z\n",
			[]string{"t.yaml:7:5: descriptor has no key"}},
		{"replaces naming nothing", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 5\n      replaces: [{name: ghost}]\n",
			[]string{`t.yaml:7:25: replaces "ghost", but no descriptor of domain "d" has that name`}},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: me\n      unit: second\n      requests_per_unit: 5\n      replaces: [{name: me}]\n",
			[]string{`t.yaml:8:25: a descriptor cannot replace itself`}},
		{"name twice", "domain: d\ndescriptors:\n  - key: a\n    name: one\n    rate_limit: {name: two, unit: second, requests_per_unit: 5}\n",
			[]string{"t.yaml:5:24: name given twice (also at line 4)"}},
		{"nesting too deep", "domain: d\ndescriptors:\n" + deepDescriptors(17),
			[]string{"descriptors nested more than 16 levels deep"}},
		{"malformed from", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors: [[{key: a, from: cookie}]]\n",
			[]string{`t.yaml:7:35: from "cookie": must be header:NAME, query:NAME, client_ip, path:{name}, method or host`}},
		{"from header without name", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors: [[{key: a, from: 'header:'}]]\n",
			[]string{`t.yaml:7:35: from "header:": header:NAME needs a valid header name`}},
		{"from path not in pattern", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    match: {path_pattern: '/v1/{id}'}\n    descriptors: [[{key: a, from: 'path:{user}'}]]\n",
			[]string{`t.yaml:8:35: from "path:{user}": path_pattern "/v1/{id}" has no {user}`}},
		{"value and from", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors: [[{key: a, value: x, from: method}]]\n",
			[]string{`t.yaml:7:20: descriptor entry "a": give value or from, not both`}},
		{"neither value nor from", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors: [[{key: a}]]\n",
			[]string{`t.yaml:7:20: descriptor entry "a" needs a value or a from`}},
		{"route referring to nothing", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors:\n      - [{key: b, from: client_ip}]\n",
			[]string{`t.yaml:8:9: descriptor list [b<-client_ip] matches no descriptor with a rate limit in domain "d"`}},
		{"route too deep for the tree", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors:\n      - [{key: a, value: x}, {key: b, value: y}]\n",
			[]string{`t.yaml:8:9: descriptor list [a=x, b=y] matches no descriptor`}},
		{"route constant reaches a node without limit", "domain: d\ndescriptors:\n  - key: a\n    value: x\n    descriptors: [{key: b, rate_limit: {unit: second, requests_per_unit: 1}}]\nroutes:\n  - name: r\n    descriptors:\n      - [{key: a, value: x}]\n",
			[]string{`t.yaml:9:9: descriptor list [a=x] matches no descriptor`}},
		{"route without name or descriptors", "domain: d\nroutes:\n  - match: {path: /x}\n",
			[]string{"t.yaml:3:5: route has no name", "t.yaml:3:5: route has no descriptors"}},
		{"duplicate route name", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    descriptors: [[{key: a, from: method}]]\n  - name: r\n    descriptors: [[{key: a, from: method}]]\n",
			[]string{`t.yaml:8:11: route "r" is already defined at t.yaml:6`}},
		{"bad route match", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    match: {path: x, path_prefix: /y, method: 'GE T', host: 'a.b:80', headers: [{name: X}]}\n    descriptors: [[{key: a, from: method}]]\n",
			[]string{"t.yaml:6:5: give at most one of path, path_prefix and path_pattern", `t.yaml:7:19: path "x" must start with /`,
				`t.yaml:7:47: method "GE T" is not an HTTP method`, `t.yaml:7:61: host "a.b:80" must not have a port`,
				"t.yaml:7:81: header match needs value (equal to) or present"}},
		{"bad path pattern", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 5}\nroutes:\n  - name: r\n    match: {path_pattern: '/v1/x{id}'}\n    descriptors: [[{key: a, from: method}]]\n",
			[]string{`t.yaml:7:27: path_pattern "/v1/x{id}": a parameter must be a whole segment like {id}`}},
		{"route descriptor not a list", "domain: d\nroutes:\n  - name: r\n    descriptors: [{key: a, value: b}]\n",
			[]string{"t.yaml:4:19: each route descriptor must be a list of entries"}},
		{"queue problems", "domain: d\nqueues:\n  q:\n    outflow: {rate: 0/s}\n    downstream: ftp://x\n    max_depth: 0\n    backoff: {initial: 10s, max: 1s}\n  r:\n    max_age: 5\n",
			[]string{`t.yaml:4:21: rate "0/s": the count must be a whole number of at least 1`, `t.yaml:5:17: downstream: "ftp://x" must be an http:// or https:// URL`,
				"t.yaml:6:16: max_depth must be at least 1", "t.yaml:7:14: backoff max (1s) is shorter than initial (10s)",
				`t.yaml:8:3: queue "r" needs an outflow`, `t.yaml:8:3: queue "r" needs a downstream`, `t.yaml:9:14: max_age: duration "5" needs a unit`}},
		{"queue settings checked by queueconfig.Config.Validate", "domain: d\nqueues:\n  q:\n    outflow: 1/s\n    downstream: 'nats:x'\n    max_body: 9MiB\n    drop_headers: [X-Ok, 'bad header', 'a:b']\n    dead_letter_max_age: 500ms\n",
			[]string{"t.yaml:6:15: max_body must be between 1 byte and 8MiB", `t.yaml:7:19: drop_headers: "bad header" is not a header name`,
				`t.yaml:7:19: drop_headers: "a:b" is not a header name`, "t.yaml:8:26: dead_letter_max_age must be at least 1s"}},
		{"queue list and size types", "domain: d\nqueues:\n  q:\n    outflow: 1/s\n    downstream: 'nats:x'\n    max_body: lots\n    drop_headers: Authorization\n    dead_letter_max_age: 0s\n",
			[]string{`t.yaml:6:15: max_body: "lots" is not a size`, "t.yaml:7:19: drop_headers must be a list", "t.yaml:8:26: dead_letter_max_age must be positive"}},
		{"invalid downstream URLs", "domain: d\nqueues:\n  a: {outflow: 1/s, downstream: 'http://'}\n  b: {outflow: 1/s, downstream: 'https://u:p@x.example'}\n  c: {outflow: 1/s, downstream: 'nats:'}\n  e: {outflow: 1/s, downstream: 'nats:a.*'}\n  f: {outflow: 1/s, downstream: 'orders-api:8080'}\n",
			[]string{`t.yaml:3:33: downstream: URL "http://" has no host`, `t.yaml:4:33: downstream: URL "https://u:xxxxx@x.example" must not carry credentials`,
				"t.yaml:5:33: downstream: nats: needs a subject", `t.yaml:6:33: downstream: NATS subject "a.*" has a wildcard`,
				`t.yaml:7:33: downstream: "orders-api:8080" must be an http:// or https:// URL or nats:SUBJECT`}},
		// What the queue package refuses, rules check refuses, at the setting's position.
		{"downstream URL with a query", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'http://x/?a=1'}\n",
			[]string{`t.yaml:3:33: downstream: URL "http://x/?a=1" must not have a query`}},
		{"downstream URL with an empty query", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'http://x/?'}\n",
			[]string{`t.yaml:3:33: downstream: URL "http://x/?" must not have a query`}},
		{"downstream URL with a port out of range", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'http://x:99999'}\n",
			[]string{`t.yaml:3:33: downstream: URL "http://x:99999" has an invalid port`}},
		{"downstream on the queues' own subjects", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'nats:sluice.q.orders.x'}\n",
			[]string{`t.yaml:3:33: downstream: NATS subject "sluice.q.orders.x" is reserved`}},
		{"downstream on sluice's events", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'nats:sluice.done.orders'}\n",
			[]string{`t.yaml:3:33: downstream: NATS subject "sluice.done.orders" is reserved`}},
		{"downstream on a queue wildcard", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'nats:sluice.q.*'}\n",
			[]string{`t.yaml:3:33: downstream: NATS subject "sluice.q.*" has a wildcard`}},
		{"downstream on the JetStream API", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'nats:$JS.API.STREAM.DELETE.SLUICE_Q_orders'}\n",
			[]string{`t.yaml:3:33: downstream: NATS subject "$JS.API.STREAM.DELETE.SLUICE_Q_orders" is reserved`}},
		{"downstream subject with a partial wildcard", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: 'nats:a.b*'}\n",
			[]string{`t.yaml:3:33: downstream: NATS subject "a.b*" has a wildcard`}},
		{"downstream of the wrong type", "domain: d\nqueues:\n  q: {outflow: 1/s, downstream: [a]}\n",
			[]string{"t.yaml:3:33: downstream must be a string"}},
		{"outflow above 1,000,000/s", "domain: d\nqueues:\n  q: {outflow: 2000000/s, downstream: 'nats:x'}\n  r: {outflow: {unit: second, requests_per_unit: 2000000}, downstream: 'nats:x'}\n",
			[]string{"t.yaml:3:16: outflow rate 2000000/s is above 1,000,000/s", "t.yaml:4:16: outflow rate 2000000/s is above 1,000,000/s"}},
		{"bad delivery", "domain: d\nqueues:\n  a: {outflow: 1/s, downstream: 'nats:x', delivery: exactly_once}\n  b: {outflow: 1/s, downstream: 'http://x', delivery: at_most_once}\n",
			[]string{`t.yaml:3:53: delivery "exactly_once": use at_least_once or at_most_once`, "t.yaml:4:55: delivery: at_most_once applies to nats: downstreams only"}},
		{"bad queue name", "domain: d\nqueues:\n  'a b': {outflow: 1/s, downstream: 'nats:x'}\n",
			[]string{`t.yaml:3:3: queue name "a b"`}},
		{"bad outflow forms", "domain: d\nqueues:\n  a: {outflow: {rate: 5/s, unit: second}, downstream: 'nats:x'}\n  b: {outflow: 5/fortnight, downstream: 'nats:x'}\n  c: {outflow: {unit: second}, downstream: 'nats:x'}\n",
			[]string{"t.yaml:3:16: outflow: give either rate or unit", `t.yaml:4:16: rate "5/fortnight": unknown unit`, "t.yaml:5:16: outflow needs rate"}},
		{"wrong types", "domain: [a]\nshadow_mode: maybe\ndescriptors: {key: a}\n",
			[]string{"t.yaml:1:9: domain must be a string, got a list", "t.yaml:2:14: shadow_mode must be true or false", "t.yaml:3:14: descriptors must be a list, got a mapping"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.src)
			for _, w := range tc.want {
				if !containsPrefix(got, w) {
					t.Errorf("missing problem %q\ngot:\n  %s", w, strings.Join(got, "\n  "))
				}
			}
		})
	}
}

// containsPrefix reports whether some problem starts with want's position and contains
// its message.
func containsPrefix(got []string, want string) bool {
	for _, g := range got {
		if g == want || strings.HasPrefix(g, want) {
			return true
		}
		// want may be FILE:LINE:COL: part-of-message or FILE: part-of-message.
		pos, msg, _ := strings.Cut(want, ": ")
		if strings.Contains(pos, " ") {
			if strings.Contains(g, want) {
				return true
			}
			continue
		}
		if strings.HasPrefix(g, pos+": ") && strings.Contains(g, msg) {
			return true
		}
		if !strings.HasPrefix(want, "t.yaml") && strings.Contains(g, want) {
			return true
		}
	}
	return false
}

func deepDescriptors(n int) string {
	var b strings.Builder
	for i := range n {
		ind := strings.Repeat("    ", i)
		fmt.Fprintf(&b, "%s  - key: k%d\n%s    descriptors:\n", ind, i, ind)
	}
	fmt.Fprintf(&b, "%s  - key: last\n", strings.Repeat("    ", n))
	return b.String()
}

func TestEveryProblemAtOnce(t *testing.T) {
	src := `domain: shop
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 5}
  - key: b
    rate_limit: {unit: second, requests_per_unit: -5}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 5}
    on_limit: defer
  - key: c
    bogus: true
routes:
  - name: r
    descriptors: [[{key: zz, from: client_ip}]]
queues:
  q: {outflow: 5/s, downstream: 'ftp://x'}
`
	got := problems(t, src)
	want := []string{
		"t.yaml:4:24: unknown unit",
		"t.yaml:6:51: requests_per_unit must not be negative",
		"t.yaml:9:15: on_limit: defer needs a queue",
		"t.yaml:10:10: duplicate descriptor",
		"t.yaml:11:5: unknown field \"bogus\"",
		"t.yaml:14:19: descriptor list [zz<-client_ip] matches no descriptor",
		"t.yaml:16:33: downstream:",
	}
	if len(got) != len(want) {
		t.Fatalf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) && !strings.Contains(got[i], want[i]) {
			t.Errorf("problem %d = %q, want %q", i, got[i], want[i])
		}
	}
	// The error text is one problem per line, sorted.
	_, err := parse(src)
	if lines := strings.Split(err.Error(), "\n"); len(lines) != len(want) || !strings.HasPrefix(lines[0], "t.yaml:4:24: ") {
		t.Errorf("Error() = %q", err.Error())
	}
}

func TestCrossFileProblems(t *testing.T) {
	a := File{Name: "a.yaml", Data: []byte("domain: shop\nqueues:\n  q: {outflow: 5/s, downstream: 'nats:a'}\n")}
	b := File{Name: "b.yaml", Data: []byte("domain: shop\nqueues:\n  q: {outflow: 5/s, downstream: 'nats:b'}\n")}
	_, err := Parse(a, b)
	var ps Problems
	if !errors.As(err, &ps) {
		t.Fatalf("err = %v", err)
	}
	want := []string{
		`b.yaml:1:9: domain "shop" is already defined in a.yaml (to merge files of one domain, as Envoy's MERGE_DOMAIN_CONFIG, use --merge-domains)`,
		`b.yaml:3:3: queue "q" is already defined in a.yaml`,
	}
	if got := err.Error(); got != strings.Join(want, "\n") {
		t.Errorf("got\n%s\nwant\n%s", got, strings.Join(want, "\n"))
	}
	// Queues are shared by the whole set: a file may defer into another file's queue.
	c := File{Name: "c.yaml", Data: []byte("domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n    on_limit: defer\n    queue: q\n")}
	if _, err := Parse(a, c); err != nil {
		t.Errorf("cross-file queue: %v", err)
	}
}

func TestLoadPaths(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.yaml", "domain: a\n")
	write(t, dir, "b.yml", "domain: b\n")
	write(t, dir, ".hidden.yaml", "not: valid: yaml: [")
	write(t, dir, "notes.txt", "ignored")
	s, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(s.Domains(), ","); got != "a,b" {
		t.Errorf("domains = %s", got)
	}
	if len(s.Files()) != 2 {
		t.Errorf("files = %v", s.Files())
	}
	_, err = Load(dir, dir+"/missing.yaml", t.TempDir())
	var ps Problems
	if !errors.As(err, &ps) || len(ps) != 2 {
		t.Fatalf("err = %v", err)
	}
	if !strings.Contains(ps[0].String(), "missing.yaml: cannot read") && !strings.Contains(ps[1].String(), "missing.yaml: cannot read") {
		t.Errorf("problems = %v", ps)
	}
	if !strings.Contains(err.Error(), "no *.yaml or *.yml files") {
		t.Errorf("problems = %v", err)
	}
	if _, err := Load(); !errors.Is(err, ErrNoPaths) {
		t.Errorf("Load() = %v, want ErrNoPaths", err)
	}
	// A file named twice, directly and through its directory, is loaded once.
	if _, err := Load(dir, dir+"//a.yaml", dir+"/./b.yml"); err != nil {
		t.Errorf("Load with repeated files = %v", err)
	}
	// A file path is loaded whatever its name.
	write(t, dir, "rules.conf", "domain: c\n")
	if s, err := Load(dir + "/rules.conf"); err != nil || s.Domains()[0] != "c" {
		t.Errorf("Load(rules.conf) = %v", err)
	}
}

func TestAliasBombIsBounded(t *testing.T) {
	// Each level holds the previous one nine times: 9^12 descriptors once expanded.
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - &d0 {key: k}\n")
	for i := 1; i <= 12; i++ {
		fmt.Fprintf(&b, "  - &d%d {key: k%d, descriptors: [", i, i)
		for j := range 9 {
			if j > 0 {
				b.WriteString(", ")
			}
			fmt.Fprintf(&b, "*d%d", i-1)
		}
		b.WriteString("]}\n")
	}
	got := problems(t, b.String())
	if !containsPrefix(got, "file too complex") {
		t.Errorf("problems = %v", got)
	}
}

func TestMergeKeysAndYAML11Booleans(t *testing.T) {
	s := mustParse(t, `domain: d
descriptors:
  - key: a
    rate_limit: &fast {unit: second, requests_per_unit: 5}
  - key: b
    rate_limit:
      <<: *fast
      requests_per_unit: 7
    shadow_mode: yes
`)
	got := map[string]string{}
	for _, r := range s.Rules() {
		got[r.Descriptor] = fmt.Sprintf("%s shadow=%v", DescribeLimit(r.Limits[0]), r.Shadow)
	}
	if got["a"] != "fixed_window 5/1s shadow=false" || got["b"] != "fixed_window 7/1s shadow=true" {
		t.Errorf("rules = %v", got)
	}
}

func TestManyProblemsAreCapped(t *testing.T) {
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n")
	for i := range 2000 {
		fmt.Fprintf(&b, "  - key: k%d\n    bogus: 1\n", i)
	}
	got := problems(t, b.String())
	if len(got) != maxProblems+1 || !strings.Contains(got[len(got)-1], "more problems not shown") {
		t.Errorf("got %d problems, last %q", len(got), got[len(got)-1])
	}
}
