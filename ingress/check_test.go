package ingress

import (
	"testing"
)

func TestParseOriginForm(t *testing.T) {
	for _, tc := range []struct {
		in, path, query string
		ok              bool
	}{
		{"/v1/orders?x=1", "/v1/orders", "x=1", true},
		{"//evil.example/v1/pay", "//evil.example/v1/pay", "", true}, // a path, not a host
		{"/a%2Fb", "/a/b", "", true},
		{"http://evil.example/v1/pay", "", "", false},
		{"v1/orders", "", "", false},
		{"/a b", "", "", false},
		{"/a#frag", "", "", false},
		{"", "", "", false},
	} {
		u, err := ParseOriginForm(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if tc.ok && (u.Path != tc.path || u.RawQuery != tc.query || u.Host != "") {
			t.Errorf("%q: path %q query %q host %q", tc.in, u.Path, u.RawQuery, u.Host)
		}
	}
}
