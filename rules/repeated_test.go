package rules

import (
	"errors"
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
			r := req("GET", tc.target, tc.hdr...)
			rt, _ := s.Match(r, netip.Addr{}, nil)
			if rt == nil {
				t.Fatal("no route")
			}
			err := rt.Repeated(r)
			if tc.source == "" {
				if err != nil {
					t.Fatalf("Repeated = %v, want nil", err)
				}
				return
			}
			var re *RepeatedError
			if !errors.As(err, &re) || !errors.Is(err, ErrRepeatedValue) {
				t.Fatalf("Repeated = %v, want a *RepeatedError", err)
			}
			if re.Source != tc.source || re.Comma != tc.comma {
				t.Errorf("Repeated = %+v, want source %s comma %v", re, tc.source, tc.comma)
			}
			if ex := s.Explain(r, netip.Addr{}); ex.Repeated == nil {
				t.Error("Explain does not report the repeated value")
			}
		})
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
		if rt.Repeated(r) != nil {
			t.Fatal("refused")
		}
	}); n != 0 {
		t.Errorf("Repeated allocates %v times per accepted request", n)
	}
}
