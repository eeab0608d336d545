package ratelimitheader

import (
	"errors"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

func TestFormatPolicy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		policies []Policy
		want     string
	}{
		// The draft's examples.
		{"one policy", []Policy{{Name: "default", Quota: 100, Window: 10}}, `"default";q=100;w=10`},
		{"two policies", []Policy{{Name: "permin", Quota: 50, Window: 60}, {Name: "perhr", Quota: 1000, Window: 3600}},
			`"permin";q=50;w=60, "perhr";q=1000;w=3600`},
		{"partition key", []Policy{{Name: "peruser", Quota: 100, Window: 60, PartitionKey: []byte("user123")}},
			`"peruser";q=100;w=60;pk=:dXNlcjEyMw==:`},
		{"no window", []Policy{{Name: "bucket", Quota: 4}}, `"bucket";q=4`},
		{"negative window left out", []Policy{{Name: "b", Quota: 4, Window: -5}}, `"b";q=4`},
		{"quote and backslash escaped", []Policy{{Name: `a"b\c`, Quota: 1}}, `"a\"b\\c";q=1`},
		{"integer clamped to 15 digits", []Policy{{Name: "x", Quota: 1 << 62}}, `"x";q=999999999999999`},
		{"negative clamped to 0", []Policy{{Name: "x", Quota: -3}}, `"x";q=0`},
		{"empty partition key", []Policy{{Name: "x", Quota: 1, PartitionKey: []byte{}}}, `"x";q=1;pk=::`},
		{"empty name", []Policy{{Quota: 1}}, `"";q=1`},
		{"none", nil, ``},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatPolicy(tc.policies...)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestFormatRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name     string
		statuses []Status
		want     string
	}{
		{"draft example", []Status{{Name: "default", Remaining: 50, Reset: 30}}, `"default";r=50;t=30`},
		{"t=0 written", []Status{{Name: "a", Remaining: 0, Reset: 0}}, `"a";r=0;t=0`},
		{"no reset", []Status{{Name: "a", Remaining: 7, Reset: NoReset}}, `"a";r=7`},
		{"two with partition key", []Status{{Name: "a", Remaining: 1, Reset: 2, PartitionKey: []byte{0xff}}, {Name: "b", Remaining: 3}},
			`"a";r=1;t=2;pk=:/w==:, "b";r=3;t=0`},
		{"huge reset clamped", []Status{{Name: "a", Remaining: 1, Reset: 1 << 62}}, `"a";r=1;t=999999999999999`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := FormatRateLimit(tc.statuses...)
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// TestAppendStatusOfAQuotedName: the item AppendStatus writes with a name QuoteName
// quoted once is byte for byte AppendRateLimit's for the same status.
func TestAppendStatusOfAQuotedName(t *testing.T) {
	for _, s := range []Status{
		{Name: "default", Remaining: 50, Reset: 30},
		{Name: "a", Remaining: 0, Reset: 0},
		{Name: "a", Remaining: 7, Reset: NoReset},
		{Name: `a"b\c`, Remaining: 1, Reset: 2},
		{Name: "", Remaining: -3, Reset: 1 << 62},
		{Name: "x", Remaining: 1 << 62, Reset: -7},
	} {
		quoted, err := QuoteName(s.Name)
		if err != nil {
			t.Fatalf("QuoteName(%q): %v", s.Name, err)
		}
		want, err := AppendRateLimit([]byte("p"), s)
		if got := AppendStatus([]byte("p"), quoted, s.Remaining, s.Reset); err != nil || string(got) != string(want) {
			t.Errorf("%+v: AppendStatus %q, AppendRateLimit %q (%v)", s, got, want, err)
		}
	}
	if quoted, err := QuoteName("café"); err == nil || quoted != "" {
		t.Errorf(`QuoteName("café") = %q, %v; want "" and an error`, quoted, err)
	}
}

func TestFormatRejectsNonASCIINames(t *testing.T) {
	for _, name := range []string{"café", "tab\there", "nl\n", "del\x7f", "\x00"} {
		if got, err := FormatPolicy(Policy{Name: "ok", Quota: 1}, Policy{Name: name, Quota: 1}); err == nil {
			t.Errorf("FormatPolicy(%q) = %q, want an error", name, got)
		}
		if got, err := FormatRateLimit(Status{Name: name}); err == nil {
			t.Errorf("FormatRateLimit(%q) = %q, want an error", name, got)
		}
	}
}

// TestAppendLeavesBufferOnError: a failed append returns b as it was, so that the
// caller's buffer holds no half-written field.
func TestAppendLeavesBufferOnError(t *testing.T) {
	b := []byte("prefix")
	got, err := AppendPolicy(b, Policy{Name: "ok", Quota: 1}, Policy{Name: "bad\n"})
	if err == nil || string(got) != "prefix" {
		t.Errorf("AppendPolicy: %q, %v; want \"prefix\" and an error", got, err)
	}
	got, err = AppendRateLimit(b, Status{Name: "ok"}, Status{Name: "é"})
	if err == nil || string(got) != "prefix" {
		t.Errorf("AppendRateLimit: %q, %v; want \"prefix\" and an error", got, err)
	}
	if got, err = AppendRateLimit(b, Status{Name: "a", Remaining: 1, Reset: 2}); err != nil || string(got) != `prefix"a";r=1;t=2` {
		t.Errorf("AppendRateLimit: %q, %v", got, err)
	}
}

func TestParseRateLimit(t *testing.T) {
	for in, want := range map[string][]Status{
		``:                         nil,
		`   `:                      nil,
		`"default";r=50;t=30`:      {{"default", 50, 30, nil}},
		`  "a";r=1;t=2  `:          {{"a", 1, 2, nil}},
		"\"a\";r=1 ,\t\"b\";r=2":   {{"a", 1, NoReset, nil}, {"b", 2, NoReset, nil}},
		`"q\"uo\\te";r=4;t=0`:      {{`q"uo\te`, 4, 0, nil}},
		`"a";r=1;r=2;t=9;t=3`:      {{"a", 2, 3, nil}},       // the last of a repeated key counts
		`"a";r=-1;r=2`:             {{"a", 2, NoReset, nil}}, // even over a bad one
		`"a"; r=999999999999999`:   {{"a", 999999999999999, NoReset, nil}},
		`"a";r=1;pk=:YWJj:`:        {{"a", 1, NoReset, []byte("abc")}},
		`"a";r=1;pk=:YWI:`:         {{"a", 1, NoReset, []byte("ab")}}, // no padding: accepted
		`"a";r=1;pk=:YWJ=:`:        {{"a", 1, NoReset, []byte("ab")}}, // non-zero pad bits: accepted
		`"a";r=1;pk=::`:            {{"a", 1, NoReset, []byte{}}},
		`"a";r=1;t=2;x;y="z";qu=4`: {{"a", 1, 2, nil}}, // unknown parameters ignored
		// Items the draft does not define are left out, the rest kept.
		`tok;r=1, "b";r=2`:                    {{"b", 2, NoReset, nil}},
		`"a";r=0.5, "b";r=1;t=1.5, "c";r=3`:   {{"c", 3, NoReset, nil}},
		`"a";r=-1, "b";r=1;t=-2, "c";t=1`:     nil,
		`"a";r="1", "b";r=?1, "c";r=@1`:       nil,
		`"a";r=1;pk="x", "b";r=1;pk=1`:        nil,
		`("a" "b");r=1, :YQ==:;r=1, ?1;r=1`:   nil,
		`%"caf%c3%a9";r=1, @1700000000;r=1`:   nil,
		`"a";r=1, ("b" 1.5 tok);x=1, "c";r=2`: {{"a", 1, NoReset, nil}, {"c", 2, NoReset, nil}},
	} {
		got, err := ParseRateLimit(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %+v\nwant %+v", in, got, want)
		}
	}
}

func TestParsePolicy(t *testing.T) {
	for in, want := range map[string][]Policy{
		`"default";q=100;w=10`:                           {{"default", 100, 10, nil}},
		`"permin";q=50;w=60, "perhr";q=1000;w=3600`:      {{"permin", 50, 60, nil}, {"perhr", 1000, 3600, nil}},
		`"peruser";q=100;w=60;pk=:dXNlcjEyMw==:`:         {{"peruser", 100, 60, []byte("user123")}},
		`"bucket";q=4`:                                   {{"bucket", 4, 0, nil}},
		`"a";q=1;w=0`:                                    {{"a", 1, 0, nil}},
		`"a";q=1;qu="requests"`:                          {{"a", 1, 0, nil}},
		`"a";w=60, "b";q=1;w=-1, "c";q=1;w=1.5, "d";q=2`: {{"d", 2, 0, nil}},
	} {
		got, err := ParsePolicy(in)
		if err != nil {
			t.Errorf("%q: %v", in, err)
			continue
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%q:\n got %+v\nwant %+v", in, got, want)
		}
	}
}

// TestParseRejects holds the parser to RFC 9651's grammar, hostile inputs included: a
// field that is not a list fails whole with ErrSyntax and returns nothing, also when
// its first members were good.
func TestParseRejects(t *testing.T) {
	for _, in := range []string{
		// List structure.
		`"a";r=1,`, `,"a";r=1`, `"a";r=1,,"b";r=1`, `"a" "b"`, `"a";r=1;`, "\t\"a\";r=1", `"a";r=1 ;t=2`,
		"\"a\"\t,\t\"b\"\t;r=1", `"a";r=1 x`,
		// Strings: unterminated, bad escapes, control and non-ASCII bytes.
		`"unterminated`, `"a\"`, `"bad\escape"`, `"bad\x41"`, `"a\`, "\"tab\there\"", "\"nl\n\"", "\"nul\x00\"",
		"\"del\x7f\"", `"café";r=1`, "\"\xff\";r=1", `é`, "\xef\xbb\xbf\"a\";r=1",
		// Keys and parameters.
		`"a";R=1`, `"a";=1`, `"a";r=`, `"a";1r=1`, `"a";r=1;é=1`, `"a";-r=1`,
		// Integers and Decimals: too many digits (huge integers), bad forms.
		`"a";r=1234567890123456`, `"a";r=9999999999999999999999999`, `"a";r=-1234567890123456`,
		`"a";r=1.`, `"a";r=1.2345`, `"a";r=1234567890123.1`, `"a";r=.5`, `-`, `"a";r=--1`, `"a";r=1e3`,
		`"a";r=+1`, `"a";r=0x10`,
		// Inner lists.
		`(1 2`, `(1 2)x`, `(1,2)`, `("a"`, `( "a";x=1"b")`,
		// Other items.
		`?2`, `?`, `:a^:`, `:abc`, `:a:`, `:ab=:`, `:a===:`, `:====:`, `@1.5`, `@`, `@x`,
		`%"caf%C3"`, `%x`, `%"caf%c3"`, `%"a%e"`, `%"a`, "%\"\xc3\xa9\"", `"a"x`, `#`, `&`,
	} {
		if got, err := ParseRateLimit(in); err == nil || !errors.Is(err, ErrSyntax) || got != nil {
			t.Errorf("ParseRateLimit(%q) = %+v, %v; want ErrSyntax and nothing", in, got, err)
		}
		if got, err := ParsePolicy(in); err == nil || !errors.Is(err, ErrSyntax) || got != nil {
			t.Errorf("ParsePolicy(%q) = %+v, %v; want ErrSyntax and nothing", in, got, err)
		}
	}
}

// TestParseOversize: long fields parse in one pass; a long good field is read whole,
// a long field with one bad byte at its end fails whole.
func TestParseOversize(t *testing.T) {
	const n = 100_000
	good := strings.Repeat(`"a";r=1;t=2, `, n) + `"b";r=0;t=1`
	got, err := ParseRateLimit(good)
	if err != nil || len(got) != n+1 || !reflect.DeepEqual(got[n], Status{"b", 0, 1, nil}) {
		t.Fatalf("%d items of a %d-byte field, %v", len(got), len(good), err)
	}
	if got, err := ParseRateLimit(good + ","); err == nil || got != nil {
		t.Errorf("a long field with a trailing comma: %d items, %v", len(got), err)
	}
	long := `"` + strings.Repeat("x", 1<<20) + `";r=1`
	if got, err := ParseRateLimit(long); err != nil || len(got) != 1 || len(got[0].Name) != 1<<20 {
		t.Errorf("a 1 MiB name: %v", err)
	}
	if _, err := ParseRateLimit(`"` + strings.Repeat("x", 1<<20)); !errors.Is(err, ErrSyntax) {
		t.Errorf("a 1 MiB unterminated String: %v", err)
	}
	// Many members that are not policies keep nothing.
	junk := strings.Repeat("a, ", n) + "a"
	if got, err := ParseRateLimit(junk); err != nil || got != nil {
		t.Errorf("%d tokens: %d items, %v", n+1, len(got), err)
	}
}

// TestRoundTrip: what the encoder writes, the parser reads back exactly.
func TestRoundTrip(t *testing.T) {
	policies := []Policy{{"per-minute", 100, 60, nil}, {`burst "b"\`, 10, 10, []byte{1, 2, 3}}, {"", 0, 0, []byte{}},
		{"max", maxInteger, maxInteger, []byte{0xff, 0xfe, 0xfd, 0xfc}}}
	f, err := FormatPolicy(policies...)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParsePolicy(f); err != nil || !reflect.DeepEqual(got, policies) {
		t.Errorf("%s: %+v, %v; want %+v", f, got, err, policies)
	}
	statuses := []Status{{"per-minute", 40, 30, nil}, {`burst "b"\`, 3, 2, []byte("k")}, {"no t", 0, NoReset, nil},
		{"max", maxInteger, maxInteger, []byte{}}}
	f, err = FormatRateLimit(statuses...)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := ParseRateLimit(f); err != nil || !reflect.DeepEqual(got, statuses) {
		t.Errorf("%s: %+v, %v; want %+v", f, got, err, statuses)
	}
}

// TestStandardLibraryOnly: the codec links nothing but the standard library, so that
// any client may read the fields with it.
func TestStandardLibraryOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	const self = "github.com/sluicehq/sluice/limiter/ratelimitheader"
	if got := strings.TrimSpace(string(out)); got != self {
		t.Errorf("go list -deps lists, beside the standard library:\n%s\nwant %s alone", got, self)
	}
}
