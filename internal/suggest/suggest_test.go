package suggest

import (
	"strings"
	"testing"
)

func TestClosest(t *testing.T) {
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
		if got := Closest(tt.in, known); got != tt.want {
			t.Errorf("Closest(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
