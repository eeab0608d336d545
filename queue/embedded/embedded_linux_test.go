package embedded_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/natstest/lazyfs"
)

// A stream made on a fresh data directory survives a power cut once SyncMetadata has
// run, on a filesystem where a directory's entries last only once it is synced. The
// server is shut down before the cut (which syncs its files, but no directory above
// the stream's), so only the directories decide. Without SyncMetadata the outcome is
// logged: it is nats-server's to change.
func TestSyncMetadataKeepsNewStreamsThroughAPowerCut(t *testing.T) {
	for _, synced := range []bool{true, false} {
		t.Run(map[bool]string{true: "synced", false: "not synced"}[synced], func(t *testing.T) {
			disk := lazyfs.Mount(t)
			e, err := embedded.Start(embedded.Config{DataDir: disk.Dir()})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			nc, err := e.Connect()
			if err != nil {
				t.Fatal(err)
			}
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
				t.Fatal(err)
			}
			if _, err := js.Publish(ctx, "s", []byte("accepted")); err != nil {
				t.Fatal(err)
			}
			if synced {
				if err := e.SyncMetadata(); err != nil {
					t.Fatal(err)
				}
			}
			nc.Close()
			e.Shutdown()
			loss, err := lazyfs.PowerCut(nil, disk)
			if err != nil {
				t.Fatal(err)
			}

			e2, err := embedded.Start(embedded.Config{DataDir: disk.Dir()})
			if err != nil {
				t.Fatal(err)
			}
			defer e2.Shutdown()
			nc2, err := e2.Connect()
			if err != nil {
				t.Fatal(err)
			}
			defer nc2.Close()
			js2, err := jetstream.New(nc2)
			if err != nil {
				t.Fatal(err)
			}
			var msgs uint64
			s, err := js2.Stream(ctx, "S")
			if err == nil {
				msgs = s.CachedInfo().State.Msgs
			} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Fatal(err)
			}
			t.Logf("the cut discarded %s; after it the stream has %d messages (%v)", loss, msgs, err)
			if synced && msgs != 1 {
				t.Errorf("after SyncMetadata and a power cut: %d messages in the stream (%v), want the one acknowledged", msgs, err)
			}
		})
	}
}
