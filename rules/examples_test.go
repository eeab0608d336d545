package rules

import (
	"net/http"
	"net/netip"
	"path/filepath"
	"testing"
)

// TestDeployExamples loads every example rules file, one by one and all together as
// `sluice serve` would load the directory, and requires no problems.
func TestDeployExamples(t *testing.T) {
	dir := filepath.Join("..", "deploy", "rules")
	files, err := filepath.Glob(filepath.Join(dir, "*.y*ml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("examples: %v %v", files, err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			if _, err := Load(f); err != nil {
				t.Errorf("problems:\n%v", err)
			}
		})
	}
	s, err := Load(dir)
	if err != nil {
		t.Fatalf("problems:\n%v", err)
	}
	// The examples do what their comments say.
	ip := netip.MustParseAddr("203.0.113.7")
	cases := []struct {
		name     string
		r        *http.Request
		route    string
		outcomes []string // per check: on_limit and the queue's downstream
	}{
		{"orders over the limit are deferred", req("POST", "/v1/orders", "X-User-ID", "42"), "create-order",
			[]string{"defer http://orders-api:8080", "reject"}},
		{"payments are rejected", req("POST", "/v1/payments/charge", "X-User-ID", "42"), "payments",
			[]string{"reject", "reject"}},
		{"geocoding calls are paced", req("GET", "/geocode?q=x", "Host", "paced.internal", "X-Tenant", "acme"), "geocode",
			[]string{"defer https://api.geocoder.example/v3", "reject"}},
		{"notifications go to NATS", req("POST", "/v1/notify/sms"), "notify",
			[]string{"defer nats:notifications.sms.paced"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rt, cs := s.Match(tc.r, ip, nil)
			if rt == nil || rt.Name != tc.route {
				t.Fatalf("route %v, want %s", rt, tc.route)
			}
			var got []string
			for _, c := range cs {
				o := string(c.Rule.OnLimit)
				if q := c.Rule.Queue; q != nil {
					o += " " + q.Downstream
				}
				got = append(got, o)
			}
			if len(got) != len(tc.outcomes) {
				t.Fatalf("outcomes %v, want %v", got, tc.outcomes)
			}
			for i := range got {
				if got[i] != tc.outcomes[i] {
					t.Errorf("outcomes %v, want %v", got, tc.outcomes)
				}
			}
		})
	}
	// The Envoy files mean what they mean in Envoy.
	if cs := s.Evaluate("edge_proxy", [][]Entry{ents("remote_address", "198.51.100.66")}, nil); len(cs) != 1 || !cs[0].Rule.Deny {
		t.Errorf("blocked address: %v", describeChecks(cs))
	}
	if cs := s.Evaluate("messaging", [][]Entry{ents("message_type", "marketing", "to_number", "555")}, nil); len(cs) != 1 || cs[0].Rule.Limits[0].Rate != 5 {
		t.Errorf("marketing: %v", describeChecks(cs))
	}
}
