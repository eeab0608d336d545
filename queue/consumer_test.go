package queue_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// TestEnsureWarnsOfAnotherAckWait: dispatchers given different ack waits overwrite each
// other's at every start; the one that changes it says so, the one that agrees is quiet.
func TestEnsureWarnsOfAnotherAckWait(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	q, err := s.Declare(ctx, testConfig("waits"))
	if err != nil {
		t.Fatal(err)
	}
	ensure := func(ackWait time.Duration) string {
		t.Helper()
		var logs bytes.Buffer // Ensure logs on the caller's goroutine
		c := q.Consumer(queue.WithConsumerLogger(slog.New(slog.NewTextHandler(&logs, nil))))
		if err := c.Ensure(ctx, queue.ConsumerConfig{AckWait: ackWait, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
			t.Fatal(err)
		}
		return logs.String()
	}
	ensure(time.Minute)
	if got := ensure(time.Minute); strings.Contains(got, "ack wait") {
		t.Fatalf("the same ack wait again was warned of: %s", got)
	}
	if got := ensure(2 * time.Minute); !strings.Contains(got, "changing the ack wait") || !strings.Contains(got, "was=1m0s") {
		t.Fatalf("a changed ack wait was not warned of; the log: %q", got)
	}
}
