package pace

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/ratelimitheader"
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

// The fields the front door writes (with the same codec) are what ParseQuota reads.
func TestParseQuotaReadsTheCodecsFields(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	policy, err := ratelimitheader.FormatPolicy(
		ratelimitheader.Policy{Name: "per-minute", Quota: 100, Window: 60},
		ratelimitheader.Policy{Name: `burst "b"`, Quota: 10, Window: 10, PartitionKey: []byte{1, 2, 3}},
	)
	if err != nil {
		t.Fatal(err)
	}
	status, err := ratelimitheader.FormatRateLimit(
		ratelimitheader.Status{Name: "per-minute", Remaining: 40, Reset: 30},
		ratelimitheader.Status{Name: `burst "b"`, Remaining: 3, Reset: 2, PartitionKey: []byte("k")},
		ratelimitheader.Status{Name: "no t", Remaining: 1, Reset: ratelimitheader.NoReset},
	)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{"Ratelimit-Policy": {policy}, "Ratelimit": {status}}
	q, ok := ParseQuota(h, now)
	// 40 in 30 s is 1.33/s; 3 in 2 s is 1.5/s; "no t" has no policy, so no reset.
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
