package h1

import (
	"net/http"
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
