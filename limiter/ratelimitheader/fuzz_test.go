package ratelimitheader

import (
	"errors"
	"reflect"
	"testing"
)

var fuzzFields = []string{
	`"a";r=42;t=17`, `"a";q=100;w=60, "b";q=5;w=1;pk=:YWJj:`, `(1 2);x, ?0, @1700000000`,
	`%"caf%c3%a9"`, `tok/en:x;r=1.5;flag`, `"q\"uo\\te";r=1;q=2`, `"a",`, `-`, `(`, `"`, `:`,
	`"a";r=1;pk=:YWI:`, `"a";r=999999999999999;t=0`, `"a";q=1;w=1;r=1;t=1;pk=::`,
}

// FuzzParseRateLimit: no input panics; a field that parses, written back, is read back
// to the same items, and writing those again gives the same bytes (the encoder's output
// is the canonical form of what the parser accepts); a field that does not parse fails
// with ErrSyntax and returns nothing.
func FuzzParseRateLimit(f *testing.F) {
	for _, s := range fuzzFields {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkParse(t, s, ParseRateLimit, FormatRateLimit, func(st Status) bool {
			return 0 <= st.Remaining && st.Remaining <= maxInteger && NoReset <= st.Reset && st.Reset <= maxInteger
		})
	})
}

// FuzzParsePolicy: as FuzzParseRateLimit, for RateLimit-Policy.
func FuzzParsePolicy(f *testing.F) {
	for _, s := range fuzzFields {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkParse(t, s, ParsePolicy, FormatPolicy, func(p Policy) bool {
			return 0 <= p.Quota && p.Quota <= maxInteger && 0 <= p.Window && p.Window <= maxInteger
		})
	})
}

// checkParse holds what parse makes of s to the properties of the parse fuzzers: each
// item inRange, and a round trip through format to the same items and bytes.
func checkParse[T any](t *testing.T, s string, parse func(string) ([]T, error), format func(...T) (string, error), inRange func(T) bool) {
	got, err := parse(s)
	if err != nil {
		if !errors.Is(err, ErrSyntax) || got != nil {
			t.Fatalf("%q: %+v, %v", s, got, err)
		}
		return
	}
	for _, v := range got {
		if !inRange(v) {
			t.Fatalf("%q: %+v out of range", s, v)
		}
	}
	out, err := format(got...)
	if err != nil {
		t.Fatalf("%q parsed to %+v, which does not write: %v", s, got, err)
	}
	again, err := parse(out)
	if err != nil || !reflect.DeepEqual(again, got) {
		t.Fatalf("%q parsed to %+v, written %q, read back %+v, %v", s, got, out, again, err)
	}
	if out2, _ := format(again...); out2 != out {
		t.Fatalf("%q: written %q, then %q", s, out, out2)
	}
}

// FuzzFormatRoundTrip: any two policies and statuses write, unless a name holds a
// byte a String cannot carry, and are read back as written once the values are
// clamped to what the fields carry.
func FuzzFormatRoundTrip(f *testing.F) {
	f.Add("a", `b"\`, int64(100), int64(60), int64(42), int64(17), []byte("k"), false)
	f.Add("", "x", int64(-1), int64(-1), int64(1<<62), int64(-7), []byte{}, true)
	f.Add("é", "\x00", int64(0), int64(0), int64(0), int64(0), []byte(nil), false)
	f.Fuzz(func(t *testing.T, name1, name2 string, q, w, r, reset int64, pk []byte, nilKey bool) {
		if nilKey {
			pk = nil
		}
		clamp := func(v int64) int64 { return min(max(v, 0), maxInteger) }
		printable := func(s string) bool {
			for i := 0; i < len(s); i++ {
				if s[i] < 0x20 || s[i] > 0x7e {
					return false
				}
			}
			return true
		}
		policies := []Policy{{name1, q, w, pk}, {name2, r, reset, nil}}
		statuses := []Status{{name1, r, reset, pk}, {name2, q, w, nil}}
		wantP := []Policy{{name1, clamp(q), max(min(w, maxInteger), 0), pk}, {name2, clamp(r), max(min(reset, maxInteger), 0), nil}}
		resetOf := func(v int64) int64 {
			if v < 0 {
				return NoReset
			}
			return min(v, maxInteger)
		}
		wantS := []Status{{name1, clamp(r), resetOf(reset), pk}, {name2, clamp(q), resetOf(w), nil}}
		ok := printable(name1) && printable(name2)

		fp, err := FormatPolicy(policies...)
		if (err == nil) != ok {
			t.Fatalf("FormatPolicy(%+v) = %q, %v", policies, fp, err)
		}
		if err == nil {
			if got, err := ParsePolicy(fp); err != nil || !reflect.DeepEqual(got, wantP) {
				t.Fatalf("%+v written %q read back %+v, %v; want %+v", policies, fp, got, err, wantP)
			}
		}
		fr, err := FormatRateLimit(statuses...)
		if (err == nil) != ok {
			t.Fatalf("FormatRateLimit(%+v) = %q, %v", statuses, fr, err)
		}
		if err == nil {
			if got, err := ParseRateLimit(fr); err != nil || !reflect.DeepEqual(got, wantS) {
				t.Fatalf("%+v written %q read back %+v, %v; want %+v", statuses, fr, got, err, wantS)
			}
		}
	})
}
