package natstest

import (
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// PublishedDuring returns the subjects of the messages on subject (a wildcard) that
// conn publishes while f runs, as a watcher on conn's server sees them. A server
// hands a subscriber one connection's messages in the order that connection sent
// them, so a marker conn publishes after f arrives after every message f published
// there, however busy the machine: nothing is waited for but the marker. (A Flush of
// the watcher is not enough: the server may answer a JetStream request before it has
// handed the watcher its copy.) The watcher takes everything on one subscription
// (">"), which keeps the server's order and drops nothing, and picks what matches
// subject. It connects to conn's own server, where its interest holds at once (in a
// cluster it would reach the others over the routes only some time later), without
// credentials.
func PublishedDuring(t testing.TB, conn *nats.Conn, subject string, f func()) []string {
	t.Helper()
	watch, err := nats.Connect(conn.ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	defer watch.Close()
	all, err := watch.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := all.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	f()
	marker := nats.NewInbox()
	if err := conn.Publish(marker, nil); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	var subjects []string
	for {
		m, err := all.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("natstest: no marker within 30s of the end of f (%v)", err)
		}
		switch {
		case m.Subject == marker:
			return subjects
		case server.SubjectMatchesFilter(m.Subject, subject):
			subjects = append(subjects, m.Subject)
		}
	}
}
