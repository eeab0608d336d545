package main

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/natstest"
)

// TestRequireDurable: R1 queues on a 3-node cluster are not durable: sluice warns once
// (the problem named), and with --require-durable refuses the connection; R3 passes.
func TestRequireDurable(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	out := &syncBuffer{}
	log := slog.New(slog.NewTextHandler(out, nil))
	conn, err := openNATS(natsConfig{url: c.URL(), signKey: natstest.SigningKey(), replicas: 1}, log, false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.nc.Close)
	waitFor(t, "the warning", 30*time.Second, func() bool { return strings.Contains(out.String(), "may be lost") })
	if !strings.Contains(out.String(), "one replica") {
		t.Errorf("the warning does not name the problem:\n%s", out)
	}
	if _, err := openNATS(natsConfig{url: c.URL(), signKey: natstest.SigningKey(), replicas: 1, requireDurable: true}, log, false); !errors.Is(err, errNotDurable) {
		t.Errorf("--require-durable with R1 queues on a cluster: %v, want errNotDurable", err)
	}
	conn, err = openNATS(natsConfig{url: c.URL(), signKey: natstest.SigningKey(), replicas: 3, requireDurable: true}, log, false)
	if err != nil {
		t.Fatalf("--require-durable with R3 queues: %v", err)
	}
	conn.nc.Close()
}
