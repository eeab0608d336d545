package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func runRulesForTest(args ...string) (code int, stdout, stderr string) {
	var out, errb bytes.Buffer
	code = run(context.Background(), append([]string{"rules"}, args...), &out, &errb)
	return code, out.String(), errb.String()
}

func TestRulesCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte(`domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 2}
    algorithm: token_bucket
    burst: 4
    on_limit: defer
    queue: orders
  - key: ip
    rate_limits:
      - {unit: second, requests_per_unit: 20}
      - {window: 10m, requests_per_unit: 3000, algorithm: sliding_window_counter}
routes:
  - name: create-order
    match: {method: [POST], path_prefix: /v1/orders}
    descriptors:
      - [{key: user, from: "header:X-User-ID"}]
      - [{key: ip, from: client_ip}]
queues:
  orders: {outflow: 50/s, downstream: "http://orders:8080"}
`), 0o644)
	os.WriteFile(bad, []byte("domain: shop2\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: -1}\n    on_limit: defer\n"), 0o644)
	// Two files of one domain: refused unless --merge-domains (Envoy's MERGE_DOMAIN_CONFIG).
	part1 := filepath.Join(dir, "part1.yaml")
	part2 := filepath.Join(dir, "part2.yaml")
	os.WriteFile(part1, []byte("domain: split\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644)
	quota := filepath.Join(dir, "quota.yaml")
	os.WriteFile(quota, []byte("domain: q\ndescriptors:\n  - key: service\n    quota_mode: true\n    rate_limit: {unit: minute, requests_per_unit: 1}\nroutes:\n  - name: q\n    match: {path: /q}\n    descriptors: [[{key: service, value: s1}]]\n"), 0o644)
	wait := filepath.Join(dir, "wait.yaml")
	os.WriteFile(wait, []byte("domain: w\ndescriptors:\n  - key: account\n    rate_limit: {unit: second, requests_per_unit: 10}\n    on_limit: wait\n    max_wait: 2s\nroutes:\n  - name: w\n    match: {path: /w}\n    descriptors: [[{key: account, value: a}]]\n"), 0o644)
	os.WriteFile(part2, []byte("domain: split\ndescriptors:\n  - key: b\n    value: 'x*y'\n    share_threshold: true\n    rate_limit: {unit: second, requests_per_unit: 2}\n"), 0o644)

	tests := []struct {
		name   string
		args   []string
		code   int
		stdout []string // substrings, in order
		stderr string
	}{
		{"valid file", []string{"check", good}, 0, []string{"ok: 1 domain, 2 descriptors, 1 route, 1 queue\n"}, ""},
		{"problems", []string{"check", good, bad}, 1, []string{
			bad + ":4:24: unknown unit \"fortnight\"",
			bad + ":4:54: requests_per_unit must not be negative",
			bad + ":5:15: on_limit: defer needs a queue",
		}, "3 problems"},
		{"missing file", []string{"check", filepath.Join(dir, "nope.yaml")}, 1, []string{"nope.yaml: cannot read"}, "1 problem"},
		{"the shipped examples", []string{"check", filepath.Join("..", "..", "deploy", "rules")}, 0, []string{"ok: ", " domains, "}, ""},
		{"explain", []string{"check", "--explain", "post", "/v1/orders/9?x=1", good, "-H", "X-User-ID: u-1", "--ip=192.0.2.4"}, 0, []string{
			"request: POST /v1/orders/9?x=1 (host none, client ip 192.0.2.4)",
			"route: create-order", "match: method POST, path_prefix /v1/orders",
			"descriptor 1: [user<-header:X-User-Id]", "values: [user=u-1]",
			"limit: token_bucket 2/1s burst 4  key sl:shop:", "over the limit: defer to queue orders (outflow 50/s, to http://orders:8080)",
			"descriptor 2: [ip<-client_ip]", "limit: fixed_window 20/1s", "limit: sliding_window_counter 3000/10m", "over the limit: reject with 429",
		}, ""},
		{"explain a skipped list", []string{"check", good, "--explain", "POST", "/v1/orders"}, 0, []string{
			"skipped: the request has no header:X-User-Id", "skipped: the request has no client_ip"}, ""},
		{"explain a repeated key", []string{"check", good, "--explain", "POST", "/v1/orders", "-H", "X-User-ID: r4nd0m", "-H", "X-User-ID: u-1"}, 0, []string{
			"refused with 400: header:X-User-Id: more than one value (sent more than once); no limit is decided"}, ""},
		{"explain a quota-mode rule", []string{"check", quota, "--explain", "GET", "/q"}, 0, []string{
			"rule: q.service", "quota mode: over the limit, denies only when every quota-mode rule of the request is over its limit"}, ""},
		{"explain a wait rule", []string{"check", wait, "--explain", "GET", "/w"}, 0, []string{
			"over the limit: wait for a slot every 100ms, at most 2s and 1000 held at once, else reject with 429"}, ""},
		{"explain without route", []string{"check", good, "--explain", "GET", "/health"}, 0, []string{"route: none matches"}, ""},
		{"explain invalid rules", []string{"check", bad, "--explain", "GET", "/"}, 1, []string{"unknown unit"}, ""},
		{"one domain in two files", []string{"check", part1, part2}, 1, []string{
			part2 + `:1:9: domain "split" is already defined in ` + part1 + " (to merge files of one domain, as Envoy's MERGE_DOMAIN_CONFIG, use --merge-domains)"}, "1 problem"},
		{"merged domains", []string{"check", "--merge-domains", part1, part2}, 0, []string{"ok: 1 domain, 2 descriptors, 0 routes, 0 queues\n"}, ""},
		{"merged domains, explicit true", []string{"check", part1, part2, "--merge-domains=true"}, 0, []string{"ok: 1 domain"}, ""},
		{"merged domains, false", []string{"check", part1, part2, "--merge-domains=false"}, 1, []string{"already defined"}, "1 problem"},
		{"merged domains, bad value", []string{"check", part1, "--merge-domains=maybe"}, 2, nil, `invalid value "maybe" for --merge-domains: want true or false`},
		{"help", []string{"check", "-h"}, 0, []string{"Usage:", "--merge-domains"}, ""},
		{"rules help", []string{"--help"}, 0, []string{"sluice rules check"}, ""},
		{"no command", nil, 2, nil, "Usage:"},
		{"unknown command", []string{"lint", good}, 2, nil, `unknown command "lint"`},
		{"no paths", []string{"check"}, 2, nil, "no rules files"},
		{"unknown flag", []string{"check", "--verbose", good}, 2, nil, "unknown flag --verbose"},
		{"explain needs two arguments", []string{"check", good, "--explain", "GET"}, 2, nil, "--explain needs METHOD and PATH"},
		{"bad path", []string{"check", good, "--explain", "GET", "health"}, 2, nil, "PATH must start with /"},
		{"bad header", []string{"check", good, "--explain", "GET", "/", "-H", "nocolon"}, 2, nil, "want 'Name: value'"},
		{"bad ip", []string{"check", good, "--explain", "GET", "/", "--ip", "300.1.1.1"}, 2, nil, "not an IP address"},
		{"-H without explain", []string{"check", good, "-H", "A: b"}, 2, nil, "only with --explain"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := runRulesForTest(tc.args...)
			if code != tc.code {
				t.Errorf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tc.code, stdout, stderr)
			}
			rest := stdout
			for _, want := range tc.stdout {
				i := strings.Index(rest, want)
				if i < 0 {
					t.Errorf("stdout lacks %q (in order)\nstdout:\n%s", want, stdout)
					break
				}
				rest = rest[i+len(want):]
			}
			if !strings.Contains(stderr, tc.stderr) {
				t.Errorf("stderr lacks %q\nstderr:\n%s", tc.stderr, stderr)
			}
		})
	}
}
