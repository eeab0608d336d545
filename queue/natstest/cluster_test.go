package natstest_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/natstest"
)

// A cluster that StartCluster (or Ready after a restart) calls ready places an R3
// stream at the first attempt: no "no suitable peers for placement".
func TestClusterReadyPlacesR3(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs a 3-process NATS cluster")
	}
	c := natstest.StartCluster(t, 3)
	js, err := jetstream.New(c.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	create := func(name string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{"ready." + name},
			Storage: jetstream.FileStorage, Replicas: 3})
		if err != nil {
			t.Fatalf("R3 stream %s on a ready cluster: %v", name, err)
		}
		if n := len(s.CachedInfo().Config.Subjects); n != 1 {
			t.Fatalf("stream %s: %d subjects", name, n)
		}
	}
	create("FIRST")
	// Every node restarted in turn (the whole cluster comes back): ready again means
	// placement works again.
	for i := range 3 {
		if err := c.RestartNode(i); err != nil {
			t.Fatal(err)
		}
		c.WaitReady()
	}
	create("AFTER_RESTARTS")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, natstest.ReadyStream); err == nil {
		t.Errorf("the readiness probe stream %s was left behind", natstest.ReadyStream)
	}
}
