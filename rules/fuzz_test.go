package rules

import (
	"bytes"
	"errors"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"unicode/utf8"
)

// FuzzLoad feeds arbitrary bytes to the parser and validator: they must never panic or
// hang, must either return a set or problems with positions inside the file, and a set
// they return must be usable on requests. The seed corpus is in testdata/fuzz/FuzzLoad
// and the example rules in deploy/rules.
func FuzzLoad(f *testing.F) {
	examples, _ := filepath.Glob(filepath.Join("..", "deploy", "rules", "*.yaml"))
	for _, name := range examples {
		if data, err := os.ReadFile(name); err == nil {
			f.Add(data)
		}
	}
	f.Add([]byte(envoyFile))
	f.Add([]byte(routesFile))
	f.Add([]byte(lanesYAML))
	f.Add([]byte("domain: w\ndescriptors:\n  - {key: u, on_limit: wait, max_wait: 2s, max_waiting: 9, then: defer, queue: orders, rate_limit: {unit: second, requests_per_unit: 4}}\n" + queueYAML))
	f.Add([]byte("domain: d\nqueues:\n  q:\n    outflow: 10/s\n    downstream: http://o:1\n    flow_by: {from: \"header:X-Merchant\", rate: 5/s, max_in_flight: 2}\n"))
	f.Add([]byte("domain: q\ndescriptors:\n  - {key: s, value: a, quota_mode: true, rate_limit: {unit: minute, requests_per_unit: 1}}\n  - {key: s, quota_mode: true, shadow_mode: true, rate_limit: {unlimited: true}}\nroutes:\n  - {name: q, descriptors: [[{key: s, value: a}], [{key: s, from: 'header:X'}]]}\n"))
	requests := []*http.Request{
		req("GET", "/"),
		req("POST", "/v1/orders", "X-User-ID", "42", "X-Tenant", "t"),
		req("GET", "/v1/orders/7?page=2&user=x", "Host", "a.example.com"),
		req("DELETE", "/a/b/c/d/e/f"),
	}
	ips := []netip.Addr{{}, netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("2001:db8::1")}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(File{Name: "f.yaml", Data: data})
		if err != nil {
			var ps Problems
			if !errors.As(err, &ps) || len(ps) == 0 || s != nil {
				t.Fatalf("Parse = %v, %v: want problems and no set", s, err)
			}
			// YAML breaks lines at \n, \r and three Unicode characters, and reads
			// UTF-16 when the file starts with its byte order mark.
			lines := 1 + bytes.Count(data, []byte("\n")) + bytes.Count(data, []byte("\r")) +
				bytes.Count(data, []byte("\u0085")) + bytes.Count(data, []byte("\u2028")) + bytes.Count(data, []byte("\u2029"))
			if bytes.HasPrefix(data, []byte{0xfe, 0xff}) || bytes.HasPrefix(data, []byte{0xff, 0xfe}) {
				lines = len(data)
			}
			for _, p := range ps {
				if p.File != "f.yaml" || p.Msg == "" || p.Line < 0 || p.Col < 0 || p.Line > lines+1 {
					t.Errorf("bad problem %+v (file has %d lines)", p, lines)
				}
			}
			return
		}
		_ = s.Summary().String()
		for _, r := range s.Rules() {
			if len(r.Name) > maxNameLen || !utf8.ValidString(r.Name) {
				t.Errorf("rule name %q", r.Name)
			}
			for _, l := range r.Limits {
				if err := l.Validate(); err != nil {
					t.Errorf("rule %s: compiled an invalid limit: %v", r.Name, err)
				}
			}
		}
		for _, r := range requests {
			for _, ip := range ips {
				_, cs := s.Match(r, ip, nil)
				for _, c := range cs {
					for i := range c.Rule.Limits {
						if k := c.Key(i); len(k) > 120 {
							t.Errorf("key %q too long", k)
						}
					}
				}
				s.Explain(r, ip)
				for _, q := range s.Queues() {
					if f := q.FlowBy; f.Enabled() && !f.Rate.IsZero() && f.Limit().Validate() != nil {
						t.Errorf("queue %s: compiled an invalid flow_by %+v", q.Name, q.FlowBy)
					}
					_ = q.FlowKey(r, ip)
				}
			}
		}
		for _, d := range s.Domains() {
			s.Evaluate(d, [][]Entry{ents("a", "b"), ents("key", "value", "k2", "v2")}, nil)
		}
	})
}
