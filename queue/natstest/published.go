package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// PublishedDuring returns the subjects of the messages on subject (a wildcard) that
// conn publishes while f runs, as a watcher on conn's server sees them. A server
// hands a subscriber one connection's messages in the order that connection sent
// them, so a marker conn publishes after f arrives after every message f published
// there, however busy the machine: nothing is waited for but the marker. (A Flush of
// the watcher is not enough: the server may answer a JetStream request before it has
// handed the watcher its copy.) The watcher connects to conn's own server, where
// its interest holds at once; in a cluster it would reach the others over the routes
// only some time later.
func PublishedDuring(t testing.TB, conn *nats.Conn, subject string, f func()) []string {
	t.Helper()
	watch, err := nats.Connect(conn.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	marker := nats.NewInbox()
	seen := make(chan *nats.Msg, 256)
	for _, subj := range []string{subject, marker} {
		if _, err := watch.ChanSubscribe(subj, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	f()
	if err := conn.Publish(marker, nil); err != nil {
		t.Fatal(err)
	}
	timeout := time.NewTimer(30 * time.Second)
	defer timeout.Stop()
	var subjects []string
	for {
		select {
		case m := <-seen:
			if m.Subject == marker {
				return subjects
			}
			subjects = append(subjects, m.Subject)
		case <-timeout.C:
			t.Fatalf("natstest: no marker 30s after %v", subjects)
		}
	}
}
