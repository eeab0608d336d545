package limiter_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

func TestParseRate(t *testing.T) {
	const day = 24 * time.Hour
	for _, tc := range []struct {
		in      string
		count   int64
		period  time.Duration
		wantErr string
	}{
		{"2/s", 2, time.Second, ""},
		{"4/m", 4, time.Minute, ""},
		{"50/second", 50, time.Second, ""},
		{"100/H", 100, time.Hour, ""},
		{"1000/d", 1000, day, ""},
		{"7/week", 7, 7 * day, ""},
		{"30/month", 30, 30 * day, ""},
		{"1/year", 1, 365 * day, ""},
		{"10/30s", 10, 30 * time.Second, ""},
		{"10/1m30s", 10, 90 * time.Second, ""},
		{"3000/10m", 3000, 10 * time.Minute, ""},
		{"1/2d", 1, 2 * day, ""},
		{"1/1d12h", 1, 36 * time.Hour, ""},
		{"5/ms", 5, time.Millisecond, ""},
		{"5/250ms", 5, 250 * time.Millisecond, ""},
		{"1/µs", 1, time.Microsecond, ""},
		{" 3 / s ", 3, time.Second, ""},
		{"", 0, 0, "must look like"},
		{"10", 0, 0, "must look like"},
		{"10/", 0, 0, "unknown unit"},
		{"/s", 0, 0, "whole number of at least 1"},
		{"0/s", 0, 0, "whole number of at least 1"},
		{"-1/s", 0, 0, "whole number of at least 1"},
		{"1.5/s", 0, 0, "whole number of at least 1"},
		{"99999999999999999999/s", 0, 0, "whole number of at least 1"},
		{"1/x", 0, 0, `unknown unit "x"`},
		{"1/0s", 0, 0, "unknown unit"},
		{"1/-1s", 0, 0, "unknown unit"},
		{"1/s/s", 0, 0, `unknown unit "s/s"`},
	} {
		r, err := limiter.ParseRate(tc.in)
		switch {
		case tc.wantErr == "" && err != nil:
			t.Errorf("ParseRate(%q): %v", tc.in, err)
		case tc.wantErr == "" && (r.Count != tc.count || r.Period != tc.period):
			t.Errorf("ParseRate(%q) = %v, want %d per %v", tc.in, r, tc.count, tc.period)
		case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
			t.Errorf("ParseRate(%q) error %v, want one containing %q", tc.in, err, tc.wantErr)
		}
	}
}

func TestRateString(t *testing.T) {
	for _, tc := range []struct {
		r    limiter.Rate
		want string
	}{
		{limiter.PerSecond(50), "50/s"},
		{limiter.Rate{Count: 3000, Period: 10 * time.Minute}, "3000/10m"},
		{limiter.Rate{Count: 1, Period: 24 * time.Hour}, "1/1d"},
		{limiter.Rate{Count: 3, Period: 500 * time.Millisecond}, "3/500ms"},
	} {
		if got := tc.r.String(); got != tc.want {
			t.Errorf("%#v.String() = %q, want %q", tc.r, got, tc.want)
		}
	}
}

func FuzzParseRate(f *testing.F) {
	for _, s := range []string{"2/s", "4/m", "1/h", "9/d", "10/30s", "10/1m30s", "5/ms", "1/µs", "0/s", "1/ns", "1/", "/s", "1/2d", "-3/s", "1/1d12h", "7/week"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := limiter.ParseRate(s)
		if err != nil {
			return
		}
		if !r.Valid() {
			t.Fatalf("ParseRate(%q) = %v: not a valid rate", s, r)
		}
		// What was accepted prints back to a rate that reads the same.
		again, err := limiter.ParseRate(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRate(%q) = %v, which reads back as %v, %v", s, r, again, err)
		}
	})
}
