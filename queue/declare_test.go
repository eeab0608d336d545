package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A declaration that changes nothing leaves the stream as it is (every replica
// declares every queue at start and on each reload); one that changes a setting
// updates it.
func TestDeclareUpdatesOnlyWhatChanged(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("orders")
	cfg.MaxDepth = 100
	s := openStore(t, srv, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	streamConfig := func() (int64, map[string]string) {
		info, err := srv.Stream(t, queue.StreamName("orders")).Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.Config.MaxMsgs, info.Config.Metadata
	}
	before, meta := streamConfig()
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if again, meta2 := streamConfig(); again != before || meta2[queue.MetadataConfig] != meta[queue.MetadataConfig] {
		t.Errorf("the same declaration changed the stream: max msgs %d → %d", before, again)
	}
	cfg.MaxDepth = 200
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if after, meta3 := streamConfig(); after != 200 || meta3[queue.MetadataConfig] == meta[queue.MetadataConfig] {
		t.Errorf("a changed max_depth was not applied: max msgs %d", after)
	}
}
