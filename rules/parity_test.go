package rules

import (
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
)

// The parity table restates, in files and cases written here, what envoyproxy/ratelimit's
// own material pins down: its test configs and config tests, its examples, its
// integration-test configs and its README examples. Each case says whether Envoy's
// service loads the files and, for descriptors sent to it, which limit Envoy applies.
// sluice must agree, except where a case names a deliberate difference (each is in the
// package documentation's table of differences). TestEnvoyParity reports the agreement counts.

// parityLookup is one RateLimitRequest: its descriptors, and what applies, one item per
// descriptor that reaches a limit: "20/1m", "unlimited", "deny", with " shadow" when
// the rule is in shadow mode and " quota" when in quota mode; "" when nothing applies.
type parityLookup struct {
	domain string
	descs  [][]Entry
	want   string
	// counter, when set, compares the counters of the first two descriptors' checks:
	// "same" (one counter, as Envoy's cache key is equal) or "apart".
	counter string
}

type parityCase struct {
	name  string
	from  string // the Envoy material the case restates
	files []string
	merge bool
	// envoyLoads is Envoy's verdict; differs, when set, names the deliberate
	// difference: sluice then gives the opposite verdict.
	envoyLoads bool
	differs    string
	lookups    []parityLookup
}

func one(domain string, want string, kv ...string) parityLookup {
	return parityLookup{domain: domain, descs: [][]Entry{ents(kv...)}, want: want}
}

func twoDescs(domain, counter string, a, b []Entry) parityLookup {
	return parityLookup{domain: domain, descs: [][]Entry{a, b}, counter: counter}
}

// treeFile is a two-level tree with key-only defaults and value overrides, an
// allow-listed value, several units, an unlimited key and a detailed_metric key.
const treeFile = `domain: tree
descriptors:
  - key: k1
    value: v1
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: sub
        value: special
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: k2
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: k2
    value: v2
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: k2
    value: allowed          # no limit, no children: this value is never limited
  - key: k3
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: k4
    rate_limit: {unit: day, requests_per_unit: 1}
  - key: k5
    value: v5
    rate_limit: {unit: day, requests_per_unit: 15}
    descriptors:
      - key: sub5
        value: s5
        rate_limit: {unit: day, requests_per_unit: 25}
  - key: k6
    rate_limit: {unlimited: true}
  - key: k7
    detailed_metric: true
    rate_limit: {unit: minute, requests_per_unit: 70}
`

const wildFile = `domain: wild
descriptors:
  - key: trailing
    value: foo*
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: plain
    value: foo
    rate_limit: {unit: minute, requests_per_unit: 21}
  - key: anyvalue
    rate_limit: {unit: minute, requests_per_unit: 22}
  - key: middle
    value: bar*b
    rate_limit: {unit: minute, requests_per_unit: 23}
  - key: path
    value: /api/*/action
    rate_limit: {unit: minute, requests_per_unit: 24}
  - key: host
    value: "*.example.com"
    rate_limit: {unit: minute, requests_per_unit: 25}
  - key: campaign
    value: spring-sale
    rate_limit: {unit: minute, requests_per_unit: 30}
  - key: campaign
    value: spring-*
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: campaign
    rate_limit: {unit: hour, requests_per_unit: 7}
  - key: tenant
    value: t-*
    descriptors:
      - key: user
        rate_limit: {unit: second, requests_per_unit: 2}
`

const shareFile = `domain: share
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: outer
    value: parent
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 200}
  - key: files
    value: top/*
    share_threshold: true
    descriptors:
      - key: files
        value: nested/*
        share_threshold: true
        rate_limit: {unit: minute, requests_per_unit: 300}
  - key: route
    value: api/*
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: method
        rate_limit: {unit: minute, requests_per_unit: 60}
  - key: service
    value: svc/*
    share_threshold: true
    descriptors:
      - key: endpoint
        detailed_metric: true
        rate_limit: {unit: minute, requests_per_unit: 80}
  - key: path
    value: path/*
    share_threshold: true
    descriptors:
      - key: file
        value: file/*
        share_threshold: false
        descriptors:
          - key: type
            rate_limit: {unit: minute, requests_per_unit: 120}
  - key: file
    value: test1
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: file
    value: test*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: unshared
    value: unshared/*
    rate_limit: {unit: hour, requests_per_unit: 10}
`

var parityCases = []parityCase{
	{name: "tree", from: "test/config basic config and its config_test lookups", files: []string{treeFile}, envoyLoads: true,
		lookups: []parityLookup{
			one("tree", "", "k1", "other"),
			one("tree", "", "k1", "v1"),
			one("tree", "", "k2", "v2", "sub", "x"),
			one("tree", "", "k5", "v5", "sub5", "other"),
			one("tree", "5/1s", "k1", "v1", "sub", "anything"),
			one("tree", "10/1s", "k1", "v1", "sub", "special"),
			one("tree", "20/1m", "k2", "anything"),
			one("tree", "30/1m", "k2", "v2"),
			one("tree", "", "k2", "allowed"),
			one("tree", "1/1h", "k3", "x"),
			one("tree", "1/1d", "k4", "x"),
			one("tree", "15/1d", "k5", "v5"),
			one("tree", "25/1d", "k5", "v5", "sub5", "s5"),
			one("tree", "unlimited", "k6", "x"),
			one("tree", "70/1m", "k7", "unlisted"),
			one("other-domain", "", "k2", "anything"),
			{domain: "tree", descs: [][]Entry{{}}, want: ""},
			twoDescs("tree", "apart", ents("k2", "a"), ents("k2", "b")),
			twoDescs("tree", "apart", ents("k7", "a"), ents("k7", "b")),
		}},
	{name: "empty domain", from: "config_test empty domain", files: []string{"domain: ''\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}},
	{name: "no domain", from: "config_test empty domain", files: []string{"descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}},
	{name: "empty key", from: "config_test empty key", files: []string{"domain: d\ndescriptors:\n  - key: ''\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}},
	{name: "duplicate key and value", from: "test/config duplicate key", files: []string{"domain: d\ndescriptors:\n  - {key: a, value: b, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: a, value: b, rate_limit: {unit: second, requests_per_unit: 2}}\n"}},
	{name: "unknown unit", from: "config_test bad limit unit", files: []string{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n"}},
	{name: "broken yaml", from: "config_test bad yaml", files: []string{"domain: d\ndescriptors: [\n"}},
	{name: "misspelled rate_limit", from: "test/config misspelled key", files: []string{"domain: d\ndescriptors:\n  - key: a\n    ratelimit: {unit: second, requests_per_unit: 1}\n"}},
	{name: "misspelled requests_per_unit", from: "test/config misspelled key 2", files: []string{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: day, requestsperunit: 5}\n"}},
	{name: "key that is not a string", from: "test/config non-string key", files: []string{"1.5: d\ndescriptors:\n  - key: a\n"}},
	{name: "descriptors that are not mappings", from: "test/config non-map list", files: []string{"domain: d\ndescriptors:\n  - x\n  - y\n"}},
	{name: "unlimited with a unit", from: "test/config unlimited with unit", files: []string{"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n"}},
	{name: "replaces itself", from: "test/config replaces self", files: []string{"domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit: {name: me, replaces: [{name: me}], unit: second, requests_per_unit: 5}\n"}},
	{name: "replaces with an empty name", from: "test/config replaces empty", files: []string{"domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - key: b\n        rate_limit:\n          name: me\n          replaces:\n            - name:\n          unit: second\n          requests_per_unit: 5\n"}},
	{name: "two files, one domain", from: "config_test duplicate domain", files: []string{
		"domain: same\ndescriptors:\n  - {key: a, value: x, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
		"domain: same\ndescriptors:\n  - {key: b, value: y, rate_limit: {unit: minute, requests_per_unit: 20}}\n"}},
	{name: "two files, one domain, merged", from: "test/config merge domain files (MERGE_DOMAIN_CONFIG)", merge: true, envoyLoads: true, files: []string{
		"domain: same\ndescriptors:\n  - {key: a, value: x, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
		"domain: same\ndescriptors:\n  - {key: b, value: y, rate_limit: {unit: minute, requests_per_unit: 20}}\n"},
		lookups: []parityLookup{one("same", "10/1m", "a", "x"), one("same", "20/1m", "b", "y"), one("same", "", "a", "y")}},
	{name: "merged files repeating a descriptor", from: "config_test duplicate key with domain merge", merge: true, files: []string{
		"domain: same\ndescriptors:\n  - {key: a, value: x, rate_limit: {unit: minute, requests_per_unit: 10}}\n",
		"domain: same\ndescriptors:\n  - {key: a, value: x, rate_limit: {unit: minute, requests_per_unit: 10}}\n"}},
	{name: "domains without descriptors", from: "test/config multiple default / multiple 1-3", envoyLoads: true, files: []string{
		"domain: default\ndescriptors:\n", "domain: d1\ndescriptors:\n", "domain: d2\n"},
		lookups: []parityLookup{one("default", "", "a", "b")}},
	{name: "shadow mode", from: "test/config shadow mode config", envoyLoads: true, files: []string{`domain: shadowed
descriptors:
  - key: k1
    value: v1
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: sub
        value: s1
        shadow_mode: true
        rate_limit: {unit: second, requests_per_unit: 10}
  - key: k2
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 20}
  - key: k2
    value: v2
    rate_limit: {unit: minute, requests_per_unit: 30}
`}, lookups: []parityLookup{
		one("shadowed", "5/1s", "k1", "v1", "sub", "x"),
		one("shadowed", "10/1s shadow", "k1", "v1", "sub", "s1"),
		one("shadowed", "20/1m shadow", "k2", "x"),
		one("shadowed", "30/1m", "k2", "v2"),
	}},
	{name: "wildcards", from: "test/config wildcard config and its config_test; README wildcard values", files: []string{wildFile}, envoyLoads: true,
		lookups: []parityLookup{
			one("wild", "22/1m", "anyvalue", "foo1"),
			twoDescs("wild", "apart", ents("anyvalue", "foo1"), ents("anyvalue", "foo2")),
			one("wild", "20/1m", "trailing", "foo1"),
			one("wild", "20/1m", "trailing", "foo"),
			twoDescs("wild", "apart", ents("trailing", "foo1"), ents("trailing", "foo2")),
			one("wild", "", "trailing", "bar"),
			one("wild", "", "plain", "foo1"),
			one("wild", "23/1m", "middle", "barab"),
			one("wild", "23/1m", "middle", "barb"),
			one("wild", "", "middle", "barbx"),
			one("wild", "", "middle", "bar"),
			one("wild", "24/1m", "path", "/api/v1/action"),
			one("wild", "24/1m", "path", "/api/v1/v2/action"),
			one("wild", "", "path", "/api/v1/other"),
			one("wild", "25/1m", "host", "a.example.com"),
			one("wild", "", "host", "example.com"),
			one("wild", "", "host", "a.example.com.evil"),
			one("wild", "30/1m", "campaign", "spring-sale"),
			one("wild", "3/1m", "campaign", "spring-x"),
			one("wild", "7/1h", "campaign", "autumn"),
			one("wild", "2/1s", "tenant", "t-1", "user", "u"),
			one("wild", "", "tenant", "x-1", "user", "u"),
		}},
	{name: "share_threshold", from: "test/config share threshold config and its cases", files: []string{shareFile}, envoyLoads: true,
		lookups: []parityLookup{
			one("share", "100/1m", "files", "files/a.pdf"),
			twoDescs("share", "same", ents("files", "files/a.pdf"), ents("files", "files/b.csv")),
			one("share", "200/1m", "outer", "parent", "files", "nested/x"),
			twoDescs("share", "same", ents("outer", "parent", "files", "nested/x"), ents("outer", "parent", "files", "nested/y")),
			one("share", "300/1m", "files", "top/a", "files", "nested/b"),
			twoDescs("share", "same", ents("files", "top/a", "files", "nested/b"), ents("files", "top/c", "files", "nested/d")),
			one("share", "60/1m", "route", "api/v1", "method", "GET"),
			twoDescs("share", "same", ents("route", "api/v1", "method", "GET"), ents("route", "api/v2", "method", "GET")),
			twoDescs("share", "apart", ents("route", "api/v1", "method", "GET"), ents("route", "api/v1", "method", "POST")),
			one("share", "80/1m", "service", "svc/a", "endpoint", "e"),
			twoDescs("share", "same", ents("service", "svc/a", "endpoint", "e"), ents("service", "svc/b", "endpoint", "e")),
			one("share", "120/1m", "path", "path/a", "file", "file/x", "type", "t"),
			twoDescs("share", "same", ents("path", "path/a", "file", "file/x", "type", "t"), ents("path", "path/b", "file", "file/x", "type", "t")),
			twoDescs("share", "apart", ents("path", "path/a", "file", "file/x", "type", "t"), ents("path", "path/a", "file", "file/y", "type", "t")),
			one("share", "50/1m", "file", "test1"),
			one("share", "100/1m", "file", "test2"),
			twoDescs("share", "same", ents("file", "test2"), ents("file", "test3")),
			twoDescs("share", "apart", ents("file", "test1"), ents("file", "test2")),
			twoDescs("share", "apart", ents("unshared", "unshared/a"), ents("unshared", "unshared/b")),
		}},
	{name: "share_threshold without a wildcard", from: "share threshold validation", files: []string{"domain: d\ndescriptors:\n  - key: a\n    value: exact\n    share_threshold: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"}},
	{name: "metadata", from: "test/config metadata config", envoyLoads: true, files: []string{`domain: meta
descriptors:
  - key: k1
    value: v1
    descriptors:
      - key: sub
        rate_limit: {unit: second, requests_per_unit: 5}
        metadata:
          name: service_1
  - key: k2
    rate_limit: {unit: minute, requests_per_unit: 20}
    metadata:
      backend:
        name: service_2
        weight: 3
`}, lookups: []parityLookup{one("meta", "5/1s", "k1", "v1", "sub", "x"), one("meta", "20/1m", "k2", "y")}},
	{name: "quota_mode", from: "examples ratelimit config (rl domain, the quota-mode services) and the quota integration tests", envoyLoads: true,
		files: []string{`domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2}
    metadata:
      service_with_quota: {name: service_2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: free
    quota_mode: true
    rate_limit: {unlimited: true}
`}, lookups: []parityLookup{
			one("rl", "1/1m quota", "service", "service_1"),
			one("rl", "2/1m quota", "service", "service_2"),
			one("rl", "", "service", "service_3"),
			{domain: "rl", descs: [][]Entry{ents("service", "service_1"), ents("service", "service_2")}, want: "1/1m quota, 2/1m quota"},
			{domain: "rl", descs: [][]Entry{ents("service", "service_1"), ents("plain", "x")}, want: "1/1m quota, 3/1m"},
			one("rl", "unlimited", "free", "x"), // unlimited: never in the quota count
		}},
	{name: "unit_multiplier", from: "test/config unit multiplier", envoyLoads: true, files: []string{
		"domain: mult\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 20, unit_multiplier: 5}\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 25}\n"},
		lookups: []parityLookup{one("mult", "20/5m", "k1", "x"), one("mult", "25/1m", "k2", "x")}},
	{name: "unit_multiplier zero", from: "test/config zero unit multiplier", files: []string{
		"domain: mult\ndescriptors:\n  - key: k1\n    rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: 0}\n"}},
	{name: "example service config", from: "examples ratelimit config (rl domain)", envoyLoads: true, files: []string{`domain: rl
descriptors:
  - key: source_cluster
    value: proxy
    descriptors:
      - key: destination_cluster
        value: mock
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - key: bar
        rate_limit: {unit: minute, requests_per_unit: 3}
      - key: bar
        value: banned
        rate_limit: {unit: minute, requests_per_unit: 0}
      - key: baz
        rate_limit: {unit: second, requests_per_unit: 1}
      - key: bay
        rate_limit: {unlimited: true}
      - key: baz
        value: shady
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 1}
  - key: qux
    rate_limit: {unlimited: true}
`}, lookups: []parityLookup{
		one("rl", "1/1m", "source_cluster", "proxy", "destination_cluster", "mock"),
		one("rl", "2/1m", "foo", "x"),
		one("rl", "3/1m", "foo", "x", "bar", "y"),
		one("rl", "deny", "foo", "x", "bar", "banned"),
		one("rl", "1/1s", "foo", "x", "baz", "y"),
		one("rl", "1/1m shadow", "foo", "x", "baz", "shady"),
		one("rl", "unlimited", "foo", "x", "bay", "z"),
		one("rl", "unlimited", "qux", "a"),
		{domain: "rl", descs: [][]Entry{ents("foo", "x"), ents("foo", "x", "bar", "y")}, want: "2/1m, 3/1m"},
	}},
	{name: "example database config", from: "examples ratelimit config (mongo_cps)", envoyLoads: true, files: []string{
		"domain: mongo_cps\ndescriptors:\n  - {key: database, value: users, rate_limit: {unit: minute, requests_per_unit: 5}}\n  - {key: database, value: default, rate_limit: {unit: minute, requests_per_unit: 5}}\n"},
		lookups: []parityLookup{one("mongo_cps", "5/1m", "database", "users"), one("mongo_cps", "", "database", "other")}},
	{name: "integration configs", from: "test/integration runtime configs (basic, another, headers)", envoyLoads: true, files: []string{
		"domain: basic\ndescriptors:\n  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n  - {key: one_per_minute, rate_limit: {unit: minute, requests_per_unit: 1}}\n",
		"domain: another\ndescriptors:\n  - {key: key2, rate_limit: {unit: minute, requests_per_unit: 20}}\n  - {key: key3, rate_limit: {unit: hour, requests_per_unit: 10}}\n  - {key: key4, rate_limit: {unit: day, requests_per_unit: 20}}\n",
		"domain: headers\ndescriptors:\n  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n"},
		lookups: []parityLookup{one("basic", "50/1s", "key1", "x"), one("basic", "1/1m", "one_per_minute", "x"),
			one("another", "20/1d", "key4", "x"), one("headers", "50/1s", "key1", "x"), one("basic", "", "key4", "x")}},
	{name: "metric-only fields", from: "test/integration sanitize config", envoyLoads: true, files: []string{
		"domain: sanitize\ndescriptors:\n  - key: grpc_path\n    value_to_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 50}\n  - key: detailed_path\n    detailed_metric: true\n    rate_limit: {unit: minute, requests_per_unit: 50}\n"},
		lookups: []parityLookup{one("sanitize", "50/1m", "grpc_path", "/svc/Method"), one("sanitize", "50/1m", "detailed_path", "/p")}},
	{name: "shared-threshold integration config", from: "test/integration share threshold config", envoyLoads: true, files: []string{
		"domain: st\ndescriptors:\n  - key: files\n    value: files/*\n    share_threshold: true\n    rate_limit: {unit: hour, requests_per_unit: 10}\n  - key: files_no_share\n    value: files_no_share/*\n    rate_limit: {unit: hour, requests_per_unit: 10}\n"},
		lookups: []parityLookup{
			twoDescs("st", "same", ents("files", "files/a"), ents("files", "files/b")),
			twoDescs("st", "apart", ents("files_no_share", "files_no_share/a"), ents("files_no_share", "files_no_share/b")),
		}},
	{name: "block list reload", from: "test/integration reload config", envoyLoads: true, files: []string{
		"domain: reload\ndescriptors:\n  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n  - {key: block, rate_limit: {unit: second, requests_per_unit: 0}}\n"},
		lookups: []parityLookup{one("reload", "deny", "block", "x")}},
	{name: "reload adding an existing domain", from: "test/integration existing-domain reload", files: []string{
		"domain: basic\ndescriptors:\n  - {key: key1, rate_limit: {unit: second, requests_per_unit: 50}}\n",
		"domain: basic\ndescriptors:\n  - {key: key11, rate_limit: {unit: second, requests_per_unit: 50}}\n"}},
	{name: "README example 2: nested descriptors", from: "README example 2", envoyLoads: true, files: []string{`domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    rate_limit: {unit: day, requests_per_unit: 100}
`}, lookups: []parityLookup{
		{domain: "messaging", descs: [][]Entry{ents("message_type", "marketing", "to_number", "2061111111"), ents("to_number", "2061111111")}, want: "5/1d, 100/1d"},
		one("messaging", "", "message_type", "marketing"),
	}},
	{name: "README example 3: matching order", from: "README example 3", envoyLoads: true, files: []string{
		"domain: edge_proxy_per_ip\ndescriptors:\n  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 10}}\n  - {key: remote_address, value: 50.0.0.5, rate_limit: {unit: second, requests_per_unit: 0}}\n"},
		lookups: []parityLookup{one("edge_proxy_per_ip", "10/1s", "remote_address", "50.0.0.1"), one("edge_proxy_per_ip", "deny", "remote_address", "50.0.0.5")}},
	{name: "README example 4: depth", from: "README example 4", envoyLoads: true, files: []string{
		"domain: example4\ndescriptors:\n  - {key: key, value: value, rate_limit: {requests_per_unit: 300, unit: second}}\n",
		"domain: example4b\ndescriptors:\n  - key: key\n    value: value\n    descriptors:\n      - {key: subkey, rate_limit: {requests_per_unit: 300, unit: second}}\n"},
		lookups: []parityLookup{one("example4", "", "key", "value", "subkey", "subvalue"), one("example4b", "300/1s", "key", "value", "subkey", "subvalue")}},
	{name: "README example 5: unlimited", from: "README example 5", envoyLoads: true, files: []string{
		"domain: internal\ndescriptors:\n  - {key: ldap, rate_limit: {unlimited: true}}\n  - {key: azure, rate_limit: {unit: minute, requests_per_unit: 100}}\n"},
		lookups: []parityLookup{one("internal", "unlimited", "ldap", "x"), one("internal", "100/1m", "azure", "x")}},
	{name: "README example 6: shadow mode", from: "README example 6", envoyLoads: true, files: []string{`domain: example6
descriptors:
  - key: service
    descriptors:
      - key: user
        value: user-a
        shadow_mode: true
        rate_limit: {requests_per_unit: 10, unit: second}
      - key: user
        value: user-b
        rate_limit: {requests_per_unit: 20, unit: second}
`}, lookups: []parityLookup{one("example6", "10/1s shadow", "service", "auth", "user", "user-a"), one("example6", "20/1s", "service", "auth", "user", "user-b")}},
	{name: "README example 7: replaces", from: "README example 7", envoyLoads: true, files: []string{`domain: example7
descriptors:
  - key: key_1
    value: value_1
    descriptors:
      - key: user
        value: bob
        rate_limit: {name: specific_limit, requests_per_unit: 5, unit: second}
  - key: key_2
    value: value_2
    descriptors:
      - key: user
        value: bob
        rate_limit:
          replaces: [{name: specific_limit}]
          requests_per_unit: 10
          unit: second
`}, lookups: []parityLookup{
		one("example7", "5/1s", "key_1", "value_1", "user", "bob"),
		one("example7", "10/1s", "key_2", "value_2", "user", "bob"),
		{domain: "example7", descs: [][]Entry{ents("key_1", "value_1", "user", "bob"), ents("key_2", "value_2", "user", "bob")}, want: "10/1s"},
	}},
	{name: "the same descriptor twice", from: "service: every descriptor of a request is counted (redis cache INCRBY per descriptor)", envoyLoads: true, files: []string{
		"domain: twice\ndescriptors:\n  - {key: user, rate_limit: {unit: second, requests_per_unit: 1}}\n"},
		lookups: []parityLookup{
			{domain: "twice", descs: [][]Entry{ents("user", "u1"), ents("user", "u1")}, want: "1/1s, 1/1s", counter: "same"},
		}},
	{name: "top-level shadow_mode", from: "validKeys: shadow_mode accepted at any level, read only on descriptors", envoyLoads: true,
		differs: "a top-level shadow_mode: true is refused", files: []string{
			"domain: top\nshadow_mode: true\ndescriptors:\n  - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n"},
		lookups: []parityLookup{one("top", "1/1s", "a", "x")}},
	{name: "name beside rate_limit", from: "validKeys: name accepted at any level, read only inside rate_limit", envoyLoads: true,
		differs: "name or replaces beside an Envoy rate_limit is refused", files: []string{`domain: side
descriptors:
  - key: a
    name: a_limit
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b
    rate_limit: {unit: second, requests_per_unit: 5, replaces: [{name: a_limit}]}
`}, lookups: []parityLookup{{domain: "side", descs: [][]Entry{ents("a", "x"), ents("b", "y")}, want: "1/1s, 5/1s"}}},
}

// parseParity loads a case's files, merging domains when the case asks.
func parseParity(c parityCase) (*Set, error) {
	files := make([]File, len(c.files))
	for i, src := range c.files {
		files[i] = File{Name: fmt.Sprintf("%s-%d.yaml", strings.ReplaceAll(c.name, " ", "_"), i), Data: []byte(src)}
	}
	if c.merge {
		return ParseWith(files, MergeDomains())
	}
	return Parse(files...)
}

// describeLimits writes what a request's checks apply, as parityLookup.want does.
func describeLimits(cs []Check) string {
	var out []string
	for _, c := range cs {
		r := c.Rule
		var s string
		switch {
		case r.Unlimited:
			s = "unlimited"
		case r.Deny:
			s = "deny"
		default:
			var ls []string
			for _, l := range r.Limits {
				ls = append(ls, fmt.Sprintf("%d/%s", l.Rate, limiter.FormatDuration(l.Period)))
			}
			s = strings.Join(ls, "+")
		}
		if r.Shadow {
			s += " shadow"
		}
		if r.Quota {
			s += " quota"
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

func TestEnvoyParity(t *testing.T) {
	var loads, loadsAgree, lookups, lookupsAgree int
	for _, c := range parityCases {
		t.Run(c.name, func(t *testing.T) {
			s, err := parseParity(c)
			loaded := err == nil
			loads++
			if loaded == c.envoyLoads {
				loadsAgree++
			}
			lookups += len(c.lookups)
			wantLoaded := c.envoyLoads != (c.differs != "")
			if loaded != wantLoaded {
				t.Errorf("%s: loaded = %v, want %v (Envoy: %v; %s); problems: %v", c.from, loaded, wantLoaded, c.envoyLoads, c.differs, err)
			}
			if !loaded {
				if c.differs == "" && len(c.lookups) > 0 {
					t.Errorf("%s: lookups not checked, the files did not load", c.from)
				}
				return
			}
			for _, l := range c.lookups {
				cs := s.Evaluate(l.domain, l.descs, nil)
				ok := true
				if got := describeLimits(cs); l.want != "" || l.counter == "" {
					if got != l.want {
						ok = false
						t.Errorf("%s: %v: got %q, want %q", c.from, l.descs, got, l.want)
					}
				}
				if l.counter != "" {
					got := counterRelation(cs)
					if got != l.counter {
						ok = false
						t.Errorf("%s: %v: counters %s, want %s", c.from, l.descs, got, l.counter)
					}
				}
				if ok {
					lookupsAgree++
				}
			}
		})
	}
	t.Logf("agreement with envoyproxy/ratelimit: %d of %d load verdicts, %d of %d matching cases", loadsAgree, loads, lookupsAgree, lookups)
}

// counterRelation says whether the first two checks count on one counter.
func counterRelation(cs []Check) string {
	if len(cs) < 2 || len(cs[0].Rule.Limits) == 0 || len(cs[1].Rule.Limits) == 0 {
		return fmt.Sprintf("not comparable (%d checks)", len(cs))
	}
	if cs[0].Key(0) == cs[1].Key(0) {
		return "same"
	}
	return "apart"
}
