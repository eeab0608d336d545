package ingress

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

const scopeRules = `domain: d
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: second, requests_per_unit: 1}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {path_pattern: "/v1/{tenant}/orders"}
    descriptors:
      - [{key: route, value: orders}]
  - name: own
    match: {path_pattern: "/v2/{tenant}/orders"}
    idempotency_scope: [header:X-Api-Key, "path:{tenant}"]
    descriptors:
      - [{key: route, value: orders}]
queues:
  orders:
    outflow: {rate: 50/s}
    downstream: http://orders:8080
`

// TestIdempotencyScopeIsStable: the scopes the middleware names, with and without a
// scope key, are those of the stored orders (a scope is part of what NATS holds: an
// order parked before an upgrade is found by its key after it) — the hash of the
// prefix, the route's scope sources and the client's address group, one request after
// another on the reused hashes.
func TestIdempotencyScopeIsStable(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "s.yaml", Data: []byte(scopeRules)})
	if err != nil {
		t.Fatal(err)
	}
	want := func(key []byte, rt *rules.Route, r *http.Request, client netip.Prefix) string {
		h := sha256.New()
		if len(key) > 0 {
			h = hmac.New(sha256.New, key)
		}
		b, _ := client.MarshalText()
		_, _ = io.WriteString(h, "sluice idempotency scope v1\x00")
		rt.WriteScope(h, r, client.Addr())
		h.Write(b)
		return hex.EncodeToString(h.Sum(nil)[:16])
	}
	for _, key := range [][]byte{nil, []byte("0123456789abcdef0123456789abcdef")} {
		m := mustNew(t, StaticRules{set}, limiter.NewMemory(), WithIdempotencyScopeKey(key))
		for range 2 { // the second time on hashes used before
			for _, tc := range []struct {
				path, apiKey, auth string
				client             netip.Prefix
			}{
				{"/v1/acme/orders", "", "Bearer a", netip.MustParsePrefix("198.51.100.7/32")},
				{"/v1/acme/orders", "", "Bearer b", netip.MustParsePrefix("2001:db8::/64")},
				{"/v1/acme/orders", "", "Bearer " + strings.Repeat("long-", 100), netip.MustParsePrefix("2001:db8::/64")},
				{"/v2/acme/orders", "k-1", "", netip.MustParsePrefix("198.51.100.7/32")},
				{"/v2/other/orders", "k-1", "", netip.MustParsePrefix("198.51.100.7/32")},
			} {
				r := httptest.NewRequest("POST", tc.path, nil)
				if tc.apiKey != "" {
					r.Header.Set("X-Api-Key", tc.apiKey)
				}
				if tc.auth != "" {
					r.Header.Set("Authorization", tc.auth)
				}
				rt, _ := set.Match(r, tc.client.Addr(), nil)
				if rt == nil {
					t.Fatalf("%s: no route", tc.path)
				}
				if got, w := m.idempotencyScope(rt, r, tc.client), want(key, rt, r, tc.client); got != w {
					t.Errorf("key %q, %s %s: scope %s, want %s", key, tc.path, tc.client, got, w)
				}
			}
		}
	}
}
