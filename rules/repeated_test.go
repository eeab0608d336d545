package rules

import (
	"errors"
	"net/http"
	"net/netip"
	"testing"
)

func TestRepeatedRefusesSecondValues(t *testing.T) {
	s := mustParse(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: ua
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: page
    rate_limit: {unit: second, requests_per_unit: 1}
routes:
  - name: r
    match: {path_prefix: /v1}
    descriptors:
      - [{key: user, from: "header:X-User-ID"}]
      - [{key: ua, from: "header:User-Agent"}]
      - [{key: page, from: "query:page", default: first}]
`)
	tests := []struct {
		name   string
		target string
		hdr    []string
		source string // "" when accepted
		comma  bool
	}{
		{"one header", "/v1/x", []string{"X-User-ID", "alice"}, "", false},
		{"no header", "/v1/x", nil, "", false},
		{"random then victim", "/v1/x", []string{"X-User-ID", "r4nd0m", "X-User-ID", "alice"}, "header:X-User-Id", false},
		{"empty then victim", "/v1/x", []string{"X-User-ID", "", "X-User-ID", "alice"}, "header:X-User-Id", false},
		{"list in one line", "/v1/x", []string{"X-User-ID", "r4nd0m, alice"}, "header:X-User-Id", true},
		{"ext_authz merged", "/v1/x", []string{"X-User-ID", "r4nd0m,alice"}, "header:X-User-Id", true},
		{"user agent comma", "/v1/x", []string{"User-Agent", "Mozilla/5.0 (KHTML, like Gecko)"}, "", false},
		{"user agent twice", "/v1/x", []string{"User-Agent", "a", "User-Agent", "b"}, "header:User-Agent", false},
		{"unrelated header twice", "/v1/x", []string{"Accept", "a", "Accept", "b"}, "", false},
		{"one query", "/v1/x?page=2", nil, "", false},
		{"query twice", "/v1/x?page=1&page=2", nil, "query:page", false},
		{"query empty then value", "/v1/x?page=&page=2", nil, "query:page", false},
		{"query encoded name", "/v1/x?page=1&pag%65=2", nil, "query:page", false},
		{"query bare twice", "/v1/x?page&page", nil, "query:page", false},
		{"query comma", "/v1/x?page=1,2", nil, "", false},
		{"other query twice", "/v1/x?q=1&q=2&page=1", nil, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			wantRepeated(t, s, req("GET", tc.target, tc.hdr...), tc.source, tc.comma)
		})
	}
}

// wantRepeated checks what Repeated and Explain say of r: nil for source "", else a
// *RepeatedError of source and comma.
func wantRepeated(t *testing.T, s *Set, r *http.Request, source string, comma bool) {
	t.Helper()
	rt, _ := s.Match(r, netip.Addr{}, nil)
	err := s.Repeated(r, rt)
	var re *RepeatedError
	switch {
	case source == "" && err != nil:
		t.Errorf("%s %v: Repeated = %v, want nil", r.URL, r.Header, err)
	case source != "" && (!errors.As(err, &re) || !errors.Is(err, ErrRepeatedValue) || re.Source != source || re.Comma != comma):
		t.Errorf("%s %v: Repeated = %v, want source %s comma %v", r.URL, r.Header, err, source, comma)
	case source != "" && s.Explain(r, netip.Addr{}).Repeated == nil:
		t.Errorf("%s %v: Explain does not report the repeated value", r.URL, r.Header)
	}
}

func TestRepeatedDoesNotAllocate(t *testing.T) {
	s := mustParse(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1}
routes:
  - name: r
    descriptors: [[{key: user, from: "header:X-User-ID"}], [{key: user, from: "query:u"}]]
`)
	r := req("GET", "/x?a=1&u=2&b=3", "X-User-ID", "alice")
	rt, _ := s.Match(r, netip.Addr{}, nil)
	if n := testing.AllocsPerRun(100, func() {
		if s.Repeated(r, rt) != nil {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Errorf("Repeated allocates %v times per accepted request", n)
	}
}

// TestRepeatedRefusesSecondValuesOfMatchHeaders: a client without the plan "premium"
// sends it and then its own: on the first value it would take the premium route's
// limits (or none) while the upstream reads its own plan.
func TestRepeatedRefusesSecondValuesOfMatchHeaders(t *testing.T) {
	s := mustParse(t, `
domain: api
descriptors:
  - key: plan
    rate_limit: {unit: second, requests_per_unit: 1}
routes:
  - name: premium
    match: {path: /v1/x, headers: [{name: X-Plan, value: premium}, {name: X-Debug, present: false}]}
    descriptors: [[{key: plan, value: premium}]]
  - name: listed
    match: {path: /v1/y, headers: [{name: X-Formats, value: "a, b"}]}
    descriptors: [[{key: plan, value: listed}]]
`)
	tests := []struct {
		target string
		hdr    []string
		source string // "" when accepted
		comma  bool
	}{
		{"/v1/x", []string{"X-Plan", "premium"}, "", false},
		{"/v1/x", []string{"X-Plan", "premium", "X-Plan", "free"}, "header:X-Plan", false},
		{"/v1/x", []string{"X-Plan", "free", "X-Plan", "premium"}, "header:X-Plan", false}, // no route matches
		{"/v1/other", []string{"X-Plan", "a", "X-Plan", "b"}, "header:X-Plan", false},
		{"/v1/x", []string{"X-Plan", "premium,free"}, "header:X-Plan", true},
		{"/v1/x", []string{"X-Plan", "premium", "X-Debug", "1", "X-Debug", "2"}, "", false}, // presence only
		{"/v1/y", []string{"X-Formats", "a, b"}, "", false},                                 // a value of the rules
		{"/v1/y", []string{"X-Formats", "a, b", "X-Formats", "c"}, "header:X-Formats", false},
	}
	for _, tc := range tests {
		wantRepeated(t, s, req("GET", tc.target, tc.hdr...), tc.source, tc.comma)
	}
}
