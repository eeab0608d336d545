package natstest_test

import (
	"testing"

	"github.com/sluicehq/sluice/queue/natstest"
)

// PublishedDuring counts exactly what its connection published on the subject while
// f ran: all of a burst far larger than its channel, none of another connection's,
// none on other subjects.
func TestPublishedDuring(t *testing.T) {
	srv := natstest.Start(t)
	other := srv.Connect(t)
	const n = 5000
	got := natstest.PublishedDuring(t, srv.Conn, "watched.>", func() {
		for range n {
			if err := srv.Conn.Publish("watched.a", nil); err != nil {
				t.Fatal(err)
			}
			if err := srv.Conn.Publish("unwatched", nil); err != nil {
				t.Fatal(err)
			}
		}
		if err := other.Publish("watched.b", nil); err != nil {
			t.Fatal(err)
		}
		if err := other.Flush(); err != nil {
			t.Fatal(err)
		}
	})
	mine := 0
	for _, s := range got {
		if s == "watched.a" {
			mine++
		}
	}
	if mine != n {
		t.Errorf("counted %d of conn's %d messages", mine, n)
	}
	if len(got) != n+1 { // other's, delivered before the marker: it was flushed first
		t.Errorf("%d messages seen, want %d: %d of conn's and other's one", len(got), n+1, mine)
	}
}
