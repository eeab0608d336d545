package pace

import (
	"fmt"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
)

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"2":                             2 * time.Second,
		"0":                             0,
		" 120 ":                         120 * time.Second,
		"99999999999":                   (1 << 31) * time.Second,
		"Sun, 01 Mar 2026 12:00:30 GMT": 30 * time.Second,
		"Sun, 01 Mar 2026 11:00:00 GMT": 0,
	} {
		got, ok := RetryAfter(http.Header{"Retry-After": {v}}, now)
		if !ok || got != want {
			t.Errorf("Retry-After %q: %v %v, want %v", v, got, ok, want)
		}
	}
	for _, v := range []string{"", "soon", "-3", "1.5"} {
		if _, ok := RetryAfter(http.Header{"Retry-After": {v}}, now); ok {
			t.Errorf("Retry-After %q accepted", v)
		}
	}
}

func TestParseSFList(t *testing.T) {
	type m = sfMember
	type p = sfParam
	for in, want := range map[string][]sfMember{
		``:                          nil,
		`  "a";r=1;t=2  `:           {{name: "a", isName: true, params: []p{{"r", 1, true}, {"t", 2, true}}}},
		`"a";q=100;w=60,"b";q=5`:    {{name: "a", isName: true, params: []p{{"q", 100, true}, {"w", 60, true}}}, {name: "b", isName: true, params: []p{{"q", 5, true}}}},
		"\"a\" ,\t\"b\"":            {{name: "a", isName: true}, {name: "b", isName: true}},
		`"q\"uo\\te";r=-4`:          {{name: `q"uo\te`, isName: true, params: []p{{"r", -4, true}}}},
		`tok/en:x;r=1.5;flag;s="x"`: {{params: []p{{"r", 0, false}, {"flag", 0, false}, {"s", 0, false}}}},
		`(1 "x";a=1 ?1);r=3, :aGk=:, @1700000000, %"caf%c3%a9", ?0;z=*t`: {
			{params: []p{{"r", 3, true}}}, {}, {}, {}, {params: []p{{"z", 0, false}}},
		},
		`"a";r=1;r=2`:               {{name: "a", isName: true, params: []p{{"r", 1, true}, {"r", 2, true}}}},
		`"a"; r=999999999999999`:    {{name: "a", isName: true, params: []p{{"r", 999999999999999, true}}}},
		`"a";r=123456789012.123`:    {{name: "a", isName: true, params: []p{{"r", 0, false}}}},
		`*x;y=-0`:                   {{params: []p{{"y", 0, true}}}},
		`"a", ("b" "c"), "d";w=0`:   {{name: "a", isName: true}, {}, {name: "d", isName: true, params: []p{{"w", 0, true}}}},
		`"policy";q=10;w=1;pk=:x:`:  {{name: "policy", isName: true, params: []p{{"q", 10, true}, {"w", 1, true}, {"pk", 0, false}}}},
		`("a");x, (), ( "b"  "c" )`: {{params: []p{{"x", 0, false}}}, {}, {}},
	} {
		got, err := parseSFList(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %+v\nwant %+v", in, got, want)
		}
	}
	for _, in := range []string{
		`"a",`, `,"a"`, `"a",,"b"`, `"a" "b"`, `"unterminated`, `"bad\escape"`, "\"tab\there\"",
		`"a";R=1`, `"a";=1`, `"a";r=`, `"a";r=1234567890123456`, `"a";r=1.`, `"a";r=1.2345`,
		`"a";r=1234567890123.1`, `-`, `"a";r=--1`, `(1 2`, `(1 2)x`, `(1,2)`, `?2`, `:a^:`, `:abc`,
		`@1.5`, `%"caf%C3"`, `%x`, `"a"x`, `é`, `"a";r=1;`, "\"a\"\t,\t\"b\"\t;r=1",
	} {
		if got, err := parseSFList(in); err == nil {
			t.Errorf("%q parsed: %+v", in, got)
		}
	}
}

// The fields ingress writes (its tested encoder) are what pace reads.
func TestParseQuotaReadsIngressFields(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	policy, err := ingress.FormatPolicy(
		ingress.Policy{Name: "per-minute", Quota: 100, Window: time.Minute},
		ingress.Policy{Name: `burst "b"`, Quota: 10, Window: 10 * time.Second, PartitionKey: []byte{1, 2, 3}},
	)
	if err != nil {
		t.Fatal(err)
	}
	status, err := ingress.FormatRateLimit(
		ingress.Status{Name: "per-minute", Remaining: 40, Reset: 30 * time.Second},
		ingress.Status{Name: `burst "b"`, Remaining: 3, Reset: 1500 * time.Millisecond, PartitionKey: []byte("k")},
	)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Ratelimit-Policy": {policy}, "Ratelimit": {status}}
	q, ok := ParseQuota(h, now)
	// 40 in 30 s is 1.33/s; 3 in 2 s (1.5 s rounded up) is 1.5/s.
	want := Quota{Policy: "per-minute", Remaining: 40, Reset: 30 * time.Second}
	if !ok || q != want {
		t.Errorf("%s / %s: %+v %v, want %+v", status, policy, q, ok, want)
	}
}

func TestParseQuota(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	epoch := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).Unix(), 10) }
	epochMS := func(d time.Duration) string { return strconv.FormatInt(now.Add(d).UnixMilli(), 10) }
	type hdr = map[string][]string
	for _, tc := range []struct {
		name string
		h    hdr
		want Quota
		ok   bool
	}{
		{"draft", hdr{"Ratelimit": {`"a";r=42;t=17`}}, Quota{"a", 42, 17 * time.Second}, true},
		{"draft, two field lines, tightest", hdr{"Ratelimit": {`"a";r=42;t=17`, `"b";r=1;t=1`}}, Quota{"b", 1, time.Second}, true},
		{"draft, t from the policy's window", hdr{"Ratelimit": {`"a";r=5`}, "Ratelimit-Policy": {`"z";q=1;w=1, "a";q=100;w=60`}}, Quota{"a", 5, time.Minute}, true},
		{"draft, no t and no policy", hdr{"Ratelimit": {`"a";r=5`}}, Quota{}, false},
		{"draft, nothing left wins", hdr{"Ratelimit": {`"a";r=0;t=2, "b";r=0;t=9, "c";r=1;t=100`}}, Quota{"b", 0, 9 * time.Second}, true},
		{"draft, token name skipped", hdr{"Ratelimit": {`a;r=0;t=2, "b";r=7;t=9`}}, Quota{"b", 7, 9 * time.Second}, true},
		{"draft, decimal skipped", hdr{"Ratelimit": {`"a";r=0.5;t=2`}}, Quota{}, false},
		{"draft, negative skipped", hdr{"Ratelimit": {`"a";r=-1;t=2, "b";r=1;t=-2`}}, Quota{}, false},
		{"draft, t=0 skipped", hdr{"Ratelimit": {`"a";r=0;t=0`}}, Quota{}, false},
		{"draft, malformed field ignored whole", hdr{"Ratelimit": {`"a";r=0;t=2,`}}, Quota{}, false},
		{"draft, huge t saturates", hdr{"Ratelimit": {`"a";r=1;t=999999999999999`}}, Quota{"a", 1, 1<<63 - 1}, true},
		{"x-, seconds", hdr{"X-Ratelimit-Remaining": {"10"}, "X-Ratelimit-Reset": {"60"}}, Quota{"", 10, time.Minute}, true},
		{"x-, fractional seconds", hdr{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1.25"}}, Quota{"", 1, 1250 * time.Millisecond}, true},
		{"x-, epoch", hdr{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {epoch(90 * time.Second)}}, Quota{"", 0, 90 * time.Second}, true},
		{"x-, epoch ms", hdr{"X-Ratelimit-Remaining": {"3"}, "X-Ratelimit-Reset": {epochMS(1500 * time.Millisecond)}}, Quota{"", 3, 1500 * time.Millisecond}, true},
		{"x-, epoch past", hdr{"X-Ratelimit-Remaining": {"0"}, "X-Ratelimit-Reset": {epoch(-time.Second)}}, Quota{}, false},
		{"x-, no reset", hdr{"X-Ratelimit-Remaining": {"0"}}, Quota{}, false},
		{"x-, no remaining", hdr{"X-Ratelimit-Reset": {"5"}}, Quota{}, false},
		{"x-, bad", hdr{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"0x10"}}, Quota{}, false},
		{"x-, exponent", hdr{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1e3"}}, Quota{}, false},
		{"x-, NaN", hdr{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"NaN"}}, Quota{}, false},
		{"x-, just below epoch", hdr{"X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"999999999"}}, Quota{"", 1, 999999999 * time.Second}, true},
		{"both: the tighter", hdr{"Ratelimit": {`"a";r=50;t=10`}, "X-Ratelimit-Remaining": {"2"}, "X-Ratelimit-Reset": {"10"}}, Quota{"", 2, 10 * time.Second}, true},
		{"none", hdr{"Content-Type": {"text/plain"}}, Quota{}, false},
	} {
		got, ok := ParseQuota(http.Header(tc.h), now)
		if ok != tc.ok || got != tc.want {
			t.Errorf("%s: %+v %v, want %+v %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
}

// formatSF writes members back (String names and Integer parameters only) for the
// round trip of FuzzParseSFList.
func formatSF(ms []sfMember) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		if m.isName {
			b.WriteString(strconv.Quote(m.name)) // printable ASCII: the same escapes
		} else {
			b.WriteString("?1")
		}
		for _, p := range m.params {
			if p.isInt {
				fmt.Fprintf(&b, ";%s=%d", p.key, p.val)
			} else {
				fmt.Fprintf(&b, ";%s", p.key)
			}
		}
	}
	return b.String()
}

// FuzzParseSFList: no input panics; what parses, written back, parses to the same.
func FuzzParseSFList(f *testing.F) {
	for _, s := range []string{
		`"a";r=42;t=17`, `"a";q=100;w=60, "b";q=5;w=1;pk=:YWJj:`, `(1 2);x, ?0, @1700000000`,
		`%"caf%c3%a9"`, `tok/en:x;r=1.5;flag`, `"q\"uo\\te"`, `"a",`, `-`, `(`, `"`, `:`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := parseSFList(s)
		if err != nil {
			return
		}
		for _, m := range ms {
			for _, p := range m.params {
				if p.isInt && (p.val > maxSFInt || p.val < -maxSFInt) {
					t.Fatalf("%q: integer %d out of range", s, p.val)
				}
			}
		}
		again, err := parseSFList(formatSF(ms))
		if err != nil {
			t.Fatalf("%q parsed to %+v, written back %q fails: %v", s, ms, formatSF(ms), err)
		}
		for i := range ms {
			if !ms[i].isName { // written back as ?1: only its parameters survive
				ms[i].name = ""
			}
		}
		if len(ms) != len(again) || !reflect.DeepEqual(ms, again) && len(ms) > 0 {
			t.Fatalf("%q: %+v, round trip %+v", s, ms, again)
		}
	})
}

const maxSFInt = 999_999_999_999_999

// FuzzParseQuota: no header panics the reader, and a quota it returns is usable.
func FuzzParseQuota(f *testing.F) {
	f.Add(`"a";r=42;t=17`, `"a";q=100;w=60`, "10", "60")
	f.Add(`"a";r=0`, `"a";q=1;w=999999999999999`, "0", "1700000000.5")
	f.Add(``, ``, "1", "99999999999999999999")
	f.Fuzz(func(t *testing.T, rl, policy, rem, reset string) {
		now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
		h := http.Header{"Ratelimit": {rl}, "Ratelimit-Policy": {policy}, "X-Ratelimit-Remaining": {rem}, "X-Ratelimit-Reset": {reset}}
		q, ok := ParseQuota(h, now)
		if ok && (q.Remaining < 0 || q.Reset <= 0) {
			t.Fatalf("%+v: unusable quota %+v", h, q)
		}
		if !ok && q != (Quota{}) {
			t.Fatalf("not ok but %+v", q)
		}
	})
}
