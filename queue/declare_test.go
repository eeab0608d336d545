package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A declaration that changes nothing leaves the stream as it is (every replica
// declares every queue at start and on each reload), and so does an Open of a store
// that exists; one that changes a setting updates it.
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
	// Every stream update is announced: the same declarations again, by this store and
	// a second one, must announce none.
	updates := make(chan *nats.Msg, 64)
	sub, err := srv.Conn.ChanSubscribe("$JS.EVENT.ADVISORY.STREAM.UPDATED.>", updates)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := srv.Conn.Flush(); err != nil {
		t.Fatal(err)
	}
	before, meta := streamConfig()
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	openStore(t, srv, cfg)
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
	// The change's announcement comes after any of the declarations before it, the
	// second Open's key-value buckets included: an update rewrites a stream's
	// configuration on disk, which fails on a full disk, where a sluice restarting must
	// still open its store to drain the queues.
	want := "$JS.EVENT.ADVISORY.STREAM.UPDATED." + queue.StreamName("orders")
	for {
		select {
		case m := <-updates:
			if m.Subject != want {
				t.Errorf("a declaration that changed nothing updated a stream: %s", m.Subject)
			}
			return
		case <-ctx.Done():
			t.Fatal("no update announced for the changed max_depth")
		}
	}
}

// keyedPark parks an order with key and wants it accepted, not as a repeat.
func keyedPark(t *testing.T, s *queue.Store, q, key string) {
	t.Helper()
	req := order(q, `{"sku":1}`)
	req.IdempotencyKey = key
	rc, err := s.Park(ctxT(t), req)
	if err != nil || rc.Duplicate {
		t.Fatalf("keyed park %s: %+v %v", key, rc, err)
	}
}

// keyStream returns the configuration and message count of a queue's key stream.
func keyStream(t *testing.T, js jetstream.JetStream, q string) (jetstream.StreamConfig, uint64) {
	t.Helper()
	st, err := js.Stream(ctxT(t), queue.KeyStreamName(q))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return info.Config, info.State.Msgs
}

// A key stream keeps its slots in memory (a slot only counts a key against its
// client's cap); the queue's own stream stays on file and synced. A key stream on file
// (made where memory was refused: TestKeySlotsOnFileWithoutMemory) is kept on file
// (JetStream cannot move a stream between storage types) and takes slots, and so is a
// synced one (JetStream cannot change a stream's persist mode). The key stream of an
// earlier sluice (SLUICE_KEYS_) is left alone while the queue is declared, and deleted
// with the queue.
func TestKeyStreamInMemory(t *testing.T) {
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	s := openStore(t, srv, testConfig("fresh"))
	keyedPark(t, s, "fresh", `"a"`)
	if cfg, n := keyStream(t, js, "fresh"); cfg.Storage != jetstream.MemoryStorage || cfg.PersistMode != jetstream.DefaultPersistMode || n != 1 {
		t.Errorf("new key stream: %v storage, persist mode %v, %d slots; want memory, default, 1", cfg.Storage, cfg.PersistMode, n)
	}
	if info, err := srv.Stream(t, queue.StreamName("fresh")).Info(ctxT(t)); err != nil ||
		info.Config.Storage != jetstream.FileStorage || info.Config.PersistMode != jetstream.DefaultPersistMode {
		t.Errorf("the queue's stream must stay on file and synced: %+v %v", info.Config, err)
	}

	// A synced key stream on file.
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
		Name: queue.KeyStreamName("onfile"), Subjects: []string{"sluice.keys.onfile.slot.*"},
		Storage: jetstream.FileStorage, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
		MaxMsgsPerSubject: 10, AllowMsgTTL: true, AllowDirect: true, AllowAtomicPublish: true,
	}); err != nil {
		t.Fatal(err)
	}
	// The key stream of an earlier sluice, with a slot of its own.
	old := queue.KeyStreamPrefix + "onfile"
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
		Name: old, Subjects: []string{"sluice.keys.onfile.*"}, Storage: jetstream.FileStorage,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctxT(t), "sluice.keys.onfile.scope", nil); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("onfile")
	if _, err := s.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	keyedPark(t, s, "onfile", `"a"`)
	keyedPark(t, s, "onfile", `"b"`)
	if cfg, n := keyStream(t, js, "onfile"); cfg.Storage != jetstream.FileStorage || cfg.PersistMode != jetstream.DefaultPersistMode || cfg.AllowAtomicPublish || n != 2 {
		t.Errorf("key stream on file: %v storage, persist mode %v, atomic batches %v, %d slots; want file, default, none (see Store.keyStream), 2",
			cfg.Storage, cfg.PersistMode, cfg.AllowAtomicPublish, n)
	}
	if _, err := s.Declare(ctxT(t), cfg); err != nil {
		t.Errorf("declaring the queue again: %v", err)
	}
	if st, err := js.Stream(ctxT(t), old); err != nil || st.CachedInfo().State.Msgs != 1 {
		t.Fatalf("the earlier key stream must stay as it is while the queue is declared: %v", err)
	}
	if _, err := s.AdoptOrphans(ctxT(t), []string{"fresh"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Retire(ctxT(t), "onfile", true); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{queue.KeyStreamName("onfile"), old} {
		if _, err := js.Stream(ctxT(t), name); !errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("stream %s after the queue was retired: %v", name, err)
		}
	}
}

// A queue whose key stream is on file (the servers refused it in memory) that becomes
// replicated gets a synced key stream (JetStream refuses async persistence on
// replicated streams and cannot change it on a stream): the old one is made anew, and
// keyed parks go on.
func TestKeyStreamBecomesReplicated(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := queue.Open(ctxT(t), nc, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	// On file, as a server without memory streams has it made.
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
		Name: queue.KeyStreamName("orders"), Subjects: []string{"sluice.keys.orders.slot.*"},
		Storage: jetstream.FileStorage, PersistMode: jetstream.AsyncPersistMode,
	}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig("orders")
	cfg.Replicas = 1
	if _, err := s.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	keyedPark(t, s, "orders", `"a"`)
	if kc, _ := keyStream(t, js, "orders"); kc.PersistMode != jetstream.AsyncPersistMode {
		t.Fatalf("single-replica key stream: persist mode %v", kc.PersistMode)
	}
	q, err := s.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	if orders, slots := q.WriterBatches(); orders != 16 || slots != 0 {
		t.Errorf("single replica: writers batch past %d orders and %d slots, want 16 and 0 (never)", orders, slots)
	}
	cfg.Replicas = 3
	if _, err := s.Declare(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	// Replicated streams stage batches in memory: worth it from the second write on;
	// slots take none (see Store.keyStream).
	if orders, slots := q.WriterBatches(); orders != 1 || slots != 0 {
		t.Errorf("three replicas: writers batch past %d orders and %d slots, want 1 and 0 (never)", orders, slots)
	}
	keyedPark(t, s, "orders", `"b"`)
	kc, n := keyStream(t, js, "orders")
	if kc.PersistMode != jetstream.DefaultPersistMode || kc.Replicas != 3 || kc.AllowAtomicPublish || n != 1 {
		t.Errorf("replicated key stream: persist mode %v, %d replicas, atomic batches %v, %d slots; want default, 3, none, 1 (made anew)",
			kc.PersistMode, kc.Replicas, kc.AllowAtomicPublish, n)
	}
	// The order parked before the change is still found by its key.
	req := order("orders", `{"sku":1}`)
	req.IdempotencyKey = `"a"`
	if rc, err := s.Park(ctxT(t), req); err != nil || !rc.Duplicate {
		t.Errorf("repeat of the first key: %+v %v", rc, err)
	}

	// A new replicated queue has its slots in memory, replicated like it.
	fresh := testConfig("fresh")
	fresh.Replicas = 3
	if _, err := s.Declare(ctxT(t), fresh); err != nil {
		t.Fatal(err)
	}
	keyedPark(t, s, "fresh", `"a"`)
	if kc, n := keyStream(t, js, "fresh"); kc.Storage != jetstream.MemoryStorage || kc.Replicas != 3 || n != 1 {
		t.Errorf("new replicated key stream: %v storage, %d replicas, %d slots; want memory, 3, 1", kc.Storage, kc.Replicas, n)
	}
}

// A bucket whose byte cap cannot be changed (no room to reserve the larger one asked
// for; on a full disk, no room for its new configuration) serves as it is: a store that
// cannot open cannot drain the queues.
func TestBucketKeptWhenItsCapCannotChange(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	open := func(capBytes int64) *queue.Store {
		s, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(natstest.SigningKey()), queue.WithIdempotencyMaxBytes(capBytes))
		if err != nil {
			t.Fatalf("open with a key cap of %d bytes: %v", capBytes, err)
		}
		return s
	}
	open(1 << 20)
	s := open(1 << 60) // more than any disk: JetStream cannot reserve it
	info, err := srv.Stream(t, "KV_"+queue.IdempotencyBucket).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.MaxBytes != 1<<20 {
		t.Errorf("bucket cap %d, want the 1 MiB it had", info.Config.MaxBytes)
	}
	if _, err := s.Declare(ctx, testConfig("orders")); err != nil {
		t.Fatal(err)
	}
	req := order("orders", `{"sku":1}`)
	req.IdempotencyKey = `"k"`
	if _, err := s.Park(ctx, req); err != nil {
		t.Fatalf("a keyed park on the kept bucket: %v", err)
	}
}
