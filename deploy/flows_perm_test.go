package deploy_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// The user sluice of the shipped accounts.conf must be able to keep the flow
// settings (sluice queue flow, PUT /sluice/v1/queues/{q}/flows/{key}): they live in
// the bucket queue.FlowsBucket, written on $KV.sluice_flows.>; the dispatchers'
// figures of flow keys in queue.FlowStatsBucket, on $KV.sluice_flow_stats.>.
func TestAccountsSluiceWritesFlowSettings(t *testing.T) {
	const pw = "0123456789abcdef0123456789abcdef"
	t.Setenv("NATS_SLUICE_PASSWORD", pw)
	t.Setenv("NATS_EVENTS_PASSWORD", pw+"e")
	t.Setenv("NATS_WORKER_PASSWORD", pw+"w")
	srv := natstest.StartConfig(t, filepath.Join("nats", "accounts.conf"))
	nc := srv.Connect(t, nats.UserInfo("sluice", pw))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The dispatchers' reports of their flow keys (queue.Queue.PublishFlowStats) too.
	for _, bucket := range []string{queue.FlowsBucket, queue.FlowStatsBucket} {
		kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
		if err != nil {
			t.Fatalf("the user sluice makes %s: %v", bucket, err)
		}
		if _, err := kv.Put(ctx, "orders.merchant-a", []byte(`{}`)); err != nil {
			t.Errorf("the user sluice writes an entry in %s: %v", bucket, err)
		}
	}
}
