package queue_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// keyed parks an order of client with key in queue q.
func keyed(t *testing.T, s *queue.Store, q, client, key string) (queue.Receipt, error) {
	t.Helper()
	req := order(q, `{"sku":1}`)
	req.Client, req.IdempotencyKey = client, key
	return s.Park(ctxT(t), req)
}

// A single server loses the key stream's slots when it restarts: the clients' caps
// count afresh, and every keyed order accepted before the restart is still found by
// its key (the same ticket, parked once), its repeats taking no slot.
func TestKeySlotsStartAfreshAfterARestart(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("orders")
	cfg.MaxIdempotencyKeys = 2
	slotsStartAfresh(t, openStore(t, srv, cfg), srv.Restart)
}

// So does a whole R3 cluster restarted at once: the key stream's placement survives
// in the cluster's metadata, its slots (in memory) do not.
func TestKeySlotsStartAfreshAfterAClusterRestart(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	cfg := testConfig("orders")
	cfg.MaxIdempotencyKeys = 2
	s, _ := openR3(t, c.Connect(t), cfg)
	slotsStartAfresh(t, s, func() {
		for i := range 3 {
			c.Kill(i)
		}
		for i := range 3 {
			c.Restart(i)
		}
		c.WaitReady()
	})
}

// slotsStartAfresh fills client c1's cap of 2 keys in s's queue "orders", calls
// restart, and checks that the cap counts afresh while the keys accepted before are
// still found (a server that has just come back may answer ErrUnavailable a while).
func slotsStartAfresh(t *testing.T, s *queue.Store, restart func()) {
	t.Helper()
	tickets := map[string]string{}
	for _, k := range []string{"k1", "k2"} {
		rc, err := keyed(t, s, "orders", "c1", k)
		if err != nil {
			t.Fatal(err)
		}
		tickets[k] = rc.Ticket
	}
	if _, err := keyed(t, s, "orders", "c1", "k3"); !errors.Is(err, queue.ErrTooManyKeys) {
		t.Fatalf("a third key before the restart: %v", err)
	}

	restart()
	for _, k := range []string{"k1", "k2"} {
		if rc, err := keyedOnceUp(t, s, k); err != nil || !rc.Duplicate || rc.Ticket != tickets[k] {
			t.Fatalf("repeat of %s after the restart: %+v %v, want ticket %s", k, rc, err, tickets[k])
		}
	}
	for _, k := range []string{"k3", "k4"} {
		if rc, err := keyedOnceUp(t, s, k); err != nil || rc.Duplicate {
			t.Fatalf("new key %s after the restart: %+v %v", k, rc, err)
		}
	}
	if _, err := keyed(t, s, "orders", "c1", "k5"); !errors.Is(err, queue.ErrTooManyKeys) {
		t.Fatalf("a third key after the restart: %v", err)
	}
	q, err := s.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	if d, err := q.Depth(ctxT(t)); err != nil || d != 4 {
		t.Fatalf("depth %d (%v), want 4: k1 to k4, each once", d, err)
	}
}

// keyedOnceUp is keyed for client c1 in "orders", asked again while the servers answer
// ErrUnavailable, for up to a minute.
func keyedOnceUp(t *testing.T, s *queue.Store, key string) (queue.Receipt, error) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		rc, err := keyed(t, s, "orders", "c1", key)
		if !errors.Is(err, queue.ErrUnavailable) || time.Now().After(deadline) {
			return rc, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A server that refuses memory streams (max_memory_store: 0) gets the key stream on
// file (with a warning in the log), and keyed parks and the cap work as in memory.
func TestKeySlotsOnFileWithoutMemory(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte("jetstream { max_memory_store: 0 }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartConfig(t, conf)
	srv.Conn = srv.Connect(t)
	cfg := testConfig("orders")
	cfg.MaxIdempotencyKeys = 2
	s := openStore(t, srv, cfg)
	if _, err := s.Declare(ctxT(t), cfg); err != nil { // and again, as at a reload
		t.Fatal(err)
	}
	// A single replica on file is not synced: the slots are no acceptance record.
	keySlotsOnFile(t, s, srv.Conn, jetstream.AsyncPersistMode, 0)
}

// A cluster whose nodes have no memory store places the key stream in memory all the
// same, stores one slot and refuses the next ("insufficient resources"): the store
// then makes the stream anew on file, replicated and synced like the orders, and the
// keyed order whose slot was refused is parked all the same.
func TestKeySlotsOnFileWithoutMemoryOnACluster(t *testing.T) {
	c := natstest.StartCluster(t, 3, natstest.WithMaxMemoryStore(0))
	nc := c.Connect(t)
	cfg := testConfig("orders")
	cfg.MaxIdempotencyKeys = 2
	s, _ := openR3(t, nc, cfg)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	moved := false
	for i := 0; i < 5 && !moved; i++ {
		if _, err := keyed(t, s, "orders", "warm", fmt.Sprint("w", i)); err != nil {
			t.Fatalf("keyed park %d while the key stream is in memory: %v", i, err)
		}
		kcfg, _ := keyStream(t, js, "orders")
		moved = kcfg.Storage == jetstream.FileStorage
	}
	if !moved {
		t.Fatal("the key stream stayed in memory on servers without a memory store: the test proves nothing")
	}
	keySlotsOnFile(t, s, nc, jetstream.DefaultPersistMode, 1) // the slot whose refusal moved it
}

// keySlotsOnFile checks keyed parks and client c1's cap of 2 keys in s's queue
// "orders", whose key stream should be on file with persist mode persist, holding
// others slots besides.
func keySlotsOnFile(t *testing.T, s *queue.Store, nc *nats.Conn, persist jetstream.PersistModeType, others uint64) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	first, err := keyed(t, s, "orders", "c1", "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := keyed(t, s, "orders", "c1", "k2"); err != nil {
		t.Fatal(err)
	}
	if rc, err := keyed(t, s, "orders", "c1", "k1"); err != nil || !rc.Duplicate || rc.Ticket != first.Ticket {
		t.Fatalf("repeat: %+v %v", rc, err)
	}
	if _, err := keyed(t, s, "orders", "c1", "k3"); !errors.Is(err, queue.ErrTooManyKeys) {
		t.Fatalf("a third key: %v", err)
	}
	if _, err := keyed(t, s, "orders", "c2", "k3"); err != nil {
		t.Fatalf("another client: %v", err)
	}
	if cfg, n := keyStream(t, js, "orders"); cfg.Storage != jetstream.FileStorage || cfg.PersistMode != persist || n != 3+others {
		t.Errorf("key stream: %v storage, persist mode %v, %d slots; want file, %v, %d", cfg.Storage, cfg.PersistMode, n, persist, 3+others)
	}
}

// Keyed parks of several clients racing into a full queue leave one slot per accepted
// order: each refused one frees its slot (slots are plain publishes: see
// Store.keyStream).
func TestRefusedKeyedParksLeaveNoSlots(t *testing.T) {
	srv := natstest.Start(t)
	cfg := testConfig("orders")
	cfg.MaxDepth, cfg.MaxIdempotencyKeys = 3, 2
	s := openStore(t, srv, cfg)
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := w; i < 400; i += 8 {
				_, err := keyed(t, s, "orders", fmt.Sprint("client-", i%4), fmt.Sprint("key-", i))
				if err != nil && !errors.Is(err, queue.ErrFull) && !errors.Is(err, queue.ErrTooManyKeys) {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	d, err := q.Depth(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if _, n := keyStream(t, js, "orders"); n != d {
		t.Errorf("%d slots for %d orders", n, d)
	}
}
