package rules

import (
	"crypto/sha256"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

const idemBase = `domain: d
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: second, requests_per_unit: 1}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {path_pattern: "/v1/{tenant}/orders"}
%s    descriptors:
      - [{key: route, value: orders}]
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: http://orders:8080
%s`

func TestIdempotencyFieldsProblems(t *testing.T) {
	tests := []struct {
		name, route, queue string
		want               string // FILE:LINE:COL: substring
	}{
		{"Set-Cookie in result_headers", "", "    result_headers: [X-Order-Id, set-cookie]\n", "t.yaml:17:21: result_headers: Set-Cookie is never kept"},
		{"not a header name", "", "    result_headers: [\"X Order\"]\n", `t.yaml:17:21: result_headers: "X Order" is not a header name`},
		{"zero key cap", "", "    max_idempotency_keys: 0\n", "t.yaml:17:27: max_idempotency_keys must be at least 1"},
		{"key cap too large", "", "    max_idempotency_keys: 20000000\n", "t.yaml:17:27: max_idempotency_keys must be between 1 and 10000000"},
		{"bad scope source", "    idempotency_scope: [header:X-Api-Key, cookie:session]\n", "", `t.yaml:11:43: idempotency_scope "cookie:session": must be header:NAME`},
		{"unknown path param", "    idempotency_scope: [\"path:{shop}\"]\n", "", `t.yaml:11:25: idempotency_scope "path:{shop}": path_pattern "/v1/{tenant}/orders" has no {shop}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := problems(t, fmt.Sprintf(idemBase, tt.route, tt.queue))
			if !slices.ContainsFunc(got, func(p string) bool { return strings.HasPrefix(p, tt.want) }) {
				t.Errorf("problems %q, want one starting %q", got, tt.want)
			}
		})
	}
}

func TestIdempotencyFields(t *testing.T) {
	s := mustParse(t, fmt.Sprintf(idemBase, "", "    result_headers: [x-order-id]\n    max_idempotency_keys: 5\n"))
	q := s.Queue("orders")
	if !slices.Equal(q.ResultHeaders, []string{"X-Order-Id"}) || q.MaxIdempotencyKeys != 5 {
		t.Errorf("queue: result headers %v, key cap %d", q.ResultHeaders, q.MaxIdempotencyKeys)
	}
	if d := mustParse(t, fmt.Sprintf(idemBase, "", "")).Queue("orders"); d.MaxIdempotencyKeys != 10_000 {
		t.Errorf("default key cap %d", d.MaxIdempotencyKeys)
	}
}

// WriteScope: what tells callers apart. Default: Authorization and Cookie (every value);
// a route may name its own sources instead.
func TestWriteScope(t *testing.T) {
	def := mustParse(t, fmt.Sprintf(idemBase, "", ""))
	own := mustParse(t, fmt.Sprintf(idemBase, "    idempotency_scope: [header:X-Api-Key, \"path:{tenant}\"]\n", ""))
	scope := func(s *Set, path string, h ...string) string {
		r := httptest.NewRequest("POST", path, nil)
		for i := 0; i+1 < len(h); i += 2 {
			r.Header.Add(h[i], h[i+1])
		}
		rt, _ := s.Match(r, netip.MustParseAddr("192.0.2.1"), nil)
		if rt == nil {
			t.Fatalf("no route for %s", path)
		}
		sum := sha256.New()
		rt.WriteScope(sum, r, netip.MustParseAddr("192.0.2.1"))
		return fmt.Sprintf("%x", sum.Sum(nil))
	}
	p := "/v1/acme/orders"
	base := scope(def, p)
	for _, c := range []struct {
		name string
		h    []string
		same bool
	}{
		{"no credentials again", nil, true},
		{"unrelated header", []string{"X-Trace", "1"}, true},
		{"Authorization", []string{"Authorization", "Bearer a"}, false},
		{"Cookie", []string{"Cookie", "s=1"}, false},
		{"second Cookie value", []string{"Cookie", "", "Cookie", "s=1"}, false},
	} {
		if got := scope(def, p, c.h...); (got == base) != c.same {
			t.Errorf("default scope, %s: same=%v, want %v", c.name, got == base, c.same)
		}
	}
	if scope(def, p, "Authorization", "Bearer a") == scope(def, p, "Authorization", "Bearer b") {
		t.Error("two bearer tokens, one scope")
	}
	// Field boundaries: "ab"+"" and "a"+"b" differ.
	if scope(def, p, "Authorization", "ab") == scope(def, p, "Authorization", "a", "Cookie", "b") {
		t.Error("values run into each other")
	}
	ownBase := scope(own, p, "Authorization", "Bearer a")
	if scope(own, p, "Authorization", "Bearer b") != ownBase {
		t.Error("a route's own scope still depends on Authorization")
	}
	if scope(own, p, "X-Api-Key", "k1") == ownBase || scope(own, "/v1/other/orders") == scope(own, p) {
		t.Error("X-Api-Key or the tenant segment do not change the scope")
	}
}
