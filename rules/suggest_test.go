package rules

import (
	"strings"
	"testing"
)

func TestSuggest(t *testing.T) {
	known := []string{"descriptors", "domain", "routes", "queues"}
	tests := []struct{ in, want string }{
		{"domian", "domain"},          // transposition: two edits
		{"descriptor", "descriptors"}, // one deletion
		{"route", "routes"},
		{"queues", "queues"},
		{"shadow", ""}, // too far from every word
		{"", ""},
		{strings.Repeat("a", 65), ""}, // long input is not compared
	}
	for _, tt := range tests {
		if got := Suggest(tt.in, known); got != tt.want {
			t.Errorf("Suggest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
