package ingress

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func TestFormatPolicy(t *testing.T) {
	cases := []struct {
		name     string
		policies []Policy
		want     string
	}{
		// The draft's examples.
		{"one policy", []Policy{{Name: "default", Quota: 100, Window: 10 * time.Second}},
			`"default";q=100;w=10`},
		{"two policies", []Policy{
			{Name: "permin", Quota: 50, Window: time.Minute},
			{Name: "perhr", Quota: 1000, Window: time.Hour}},
			`"permin";q=50;w=60, "perhr";q=1000;w=3600`},
		{"partition key", []Policy{{Name: "peruser", Quota: 100, Window: 60 * time.Second, PartitionKey: []byte("user123")}},
			`"peruser";q=100;w=60;pk=:dXNlcjEyMw==:`},
		{"no window", []Policy{{Name: "bucket", Quota: 4}}, `"bucket";q=4`},
		{"window rounded up", []Policy{{Name: "w", Quota: 1, Window: 1500 * time.Millisecond}}, `"w";q=1;w=2`},
		{"quote and backslash escaped", []Policy{{Name: `a"b\c`, Quota: 1}}, `"a\"b\\c";q=1`},
		{"integer clamped to 15 digits", []Policy{{Name: "x", Quota: 1 << 62}}, `"x";q=999999999999999`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatPolicy(tc.policies...)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestFormatRateLimit(t *testing.T) {
	cases := []struct {
		name     string
		statuses []Status
		want     string
	}{
		{"draft example", []Status{{Name: "default", Remaining: 50, Reset: 30 * time.Second}}, `"default";r=50;t=30`},
		{"reset rounded up", []Status{{Name: "a", Remaining: 0, Reset: 1}}, `"a";r=0;t=1`},
		{"two with partition key", []Status{
			{Name: "a", Remaining: 1, Reset: 2 * time.Second, PartitionKey: []byte{0xff}},
			{Name: "b", Remaining: 3}},
			`"a";r=1;t=2;pk=:/w==:, "b";r=3;t=0`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatRateLimit(tc.statuses...)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestFormatRejectsNonASCIINames(t *testing.T) {
	for _, name := range []string{"café", "tab\there", "nl\n"} {
		if got, err := FormatPolicy(Policy{Name: name, Quota: 1}); err == nil {
			t.Errorf("FormatPolicy(%q) = %q, want an error", name, got)
		}
		if got, err := FormatRateLimit(Status{Name: name}); err == nil {
			t.Errorf("FormatRateLimit(%q) = %q, want an error", name, got)
		}
	}
}

func TestRetryAfterSecondsRoundsUpWithoutOverflow(t *testing.T) {
	for d, want := range map[time.Duration]int64{
		-time.Second:                   0,
		0:                              0,
		1:                              1,
		time.Second:                    1,
		time.Second + 1:                2,
		limiter.Never - 1:              int64(limiter.Never/time.Second) + 1,
		limiter.Never:                  int64(limiter.Never/time.Second) + 1,
		time.Duration(math.MinInt64):   0,
		999_999_999 * time.Millisecond: 1_000_000,
	} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%d) = %d, want %d", d, got, want)
		}
	}
}
