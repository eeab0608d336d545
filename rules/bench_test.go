package rules

import (
	"fmt"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// bigRoutes is a domain with n routes: a third each exact paths, path patterns and
// path prefixes, each with a per-user descriptor of its own and a shared per-IP one.
func bigRoutes(n int) string {
	var b strings.Builder
	b.WriteString("domain: big\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 100}\n  - key: route\n    descriptors:\n      - key: user\n        rate_limit: {unit: second, requests_per_unit: 10}\n")
	b.WriteString("routes:\n")
	for i := range n {
		var match string
		switch i % 3 {
		case 0:
			match = fmt.Sprintf("{method: [GET, POST], path: /api/v1/svc%d/items}", i)
		case 1:
			match = fmt.Sprintf("{path_pattern: \"/api/v2/svc%d/items/{id}\"}", i)
		default:
			match = fmt.Sprintf("{path_prefix: /api/v3/svc%d}", i)
		}
		fmt.Fprintf(&b, "  - name: route-%d\n    match: %s\n    descriptors:\n      - [{key: route, value: svc%d}, {key: user, from: \"header:X-User-ID\"}]\n      - [{key: ip, from: client_ip}]\n", i, match, i)
	}
	return b.String()
}

// bigTree is a domain with 100 tenants × 100 endpoints = 10,000 leaf descriptors.
func bigTree() string {
	var b strings.Builder
	b.WriteString("domain: tree\ndescriptors:\n")
	for t := range 100 {
		fmt.Fprintf(&b, "  - key: tenant\n    value: t%d\n    descriptors:\n", t)
		for e := range 100 {
			fmt.Fprintf(&b, "      - {key: endpoint, value: e%d, rate_limit: {unit: minute, requests_per_unit: %d}}\n", e, 100+e)
		}
		b.WriteString("      - {key: endpoint, rate_limit: {unit: minute, requests_per_unit: 50}, algorithm: token_bucket, burst: 10}\n")
	}
	b.WriteString(`routes:
  - name: tenant-endpoint
    match: {path_pattern: "/t/{tenant}/{endpoint}"}
    descriptors:
      - [{key: tenant, from: "path:tenant"}, {key: endpoint, from: "path:endpoint"}]
`)
	return b.String()
}

func benchMatch(b *testing.B, s *Set, r *http.Request, wantRoute string, wantChecks int) {
	ip := netip.MustParseAddr("198.51.100.23")
	buf := make([]Check, 0, 8)
	rt, cs := s.Match(r, ip, buf)
	if rt == nil || rt.Name != wantRoute || len(cs) != wantChecks {
		b.Fatalf("matched %v with %d checks", rt, len(cs))
	}
	b.ReportAllocs()
	for b.Loop() {
		_, buf = s.Match(r, ip, buf[:0])
	}
}

// BenchmarkMatch1000Routes finds one route among 1,000 and builds its two checks (a
// per-user and a per-IP key, both hashed from request values).
func BenchmarkMatch1000Routes(b *testing.B) {
	s, err := parse(bigRoutes(1000))
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name, method, path, route string
	}{
		{"exact", "POST", "/api/v1/svc999/items", "route-999"},
		{"pattern", "GET", "/api/v2/svc997/items/12345", "route-997"},
		{"prefix", "GET", "/api/v3/svc998/a/b/c", "route-998"},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			benchMatch(b, s, req(c.method, c.path, "X-User-ID", "user-4711"), c.route, 2)
		})
	}
}

// BenchmarkMatch10000Descriptors looks a request up in a tree of 10,000 descriptors:
// an exact descriptor (its key precomputed) and a per-value one (hashed).
func BenchmarkMatch10000Descriptors(b *testing.B) {
	s, err := parse(bigTree())
	if err != nil {
		b.Fatal(err)
	}
	if got := s.Summary().Descriptors; got != 10_200 {
		b.Fatalf("%d descriptors", got)
	}
	b.Run("exact", func(b *testing.B) {
		benchMatch(b, s, req("GET", "/t/t77/e42"), "tenant-endpoint", 1)
	})
	b.Run("any-value", func(b *testing.B) {
		benchMatch(b, s, req("GET", "/t/t77/other"), "tenant-endpoint", 1)
	})
}

// BenchmarkLoad10000Descriptors parses, validates and compiles the big tree.
func BenchmarkLoad10000Descriptors(b *testing.B) {
	src := []byte(bigTree())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(File{Name: "tree.yaml", Data: src}); err != nil {
			b.Fatal(err)
		}
	}
}
