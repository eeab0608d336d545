package h1

import (
	"net/http"
	"strings"
	"testing"
)

// TestAppendFields: fields are written sorted, a name that is not a token is left
// out, and a line break in a value cannot end the head (net/http's rules).
func TestAppendFields(t *testing.T) {
	h := http.Header{"B": {" two\r\nX-Evil: 1 "}, "A": {"one"}, "Bad Name": {"x"}, "C\r\nD": {"y"}}
	got := string(appendFields(nil, h, []string{"Date", "now"}))
	want := "A: one\r\nB: two  X-Evil: 1\r\nDate: now\r\n"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// FuzzAppendField: a field's value is written as strings.Trim and ContainsAny would
// have it, its line breaks spaces.
func FuzzAppendField(f *testing.F) {
	for _, v := range []string{"", "v", " \t\r\nv\r\n\t ", "a\rb\nc", "\r\n", "\x00 é \xff"} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v string) {
		want := strings.Trim(v, " \t\r\n")
		if strings.ContainsAny(want, "\r\n") {
			want = strings.NewReplacer("\r", " ", "\n", " ").Replace(want)
		}
		want = "K: " + want + "\r\n"
		if got := string(appendField(nil, "K", v)); got != want {
			t.Fatalf("appendField(%q) = %q, want %q", v, got, want)
		}
	})
}
