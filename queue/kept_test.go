package queue_test

import (
	"bytes"
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// Records JetStream refused are kept in memory: Record and Status read them, a newer
// direct write replaces them, FlushRecords writes the rest, and the memory is bounded.
func TestKeptRecords(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := queue.Open(ctx, srv.Conn, queue.WithKeptRecordsBytes(4<<10), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	a, b := queue.NewTicket(), queue.NewTicket()
	if err := s.KeepRecord(&queue.Record{Ticket: a, Queue: "q", Status: queue.StatusDone, Result: &queue.Result{StatusCode: 201}}); err != nil {
		t.Fatal(err)
	}
	if err := s.KeepRecord(&queue.Record{Ticket: b, Queue: "q", Status: queue.StatusQueued, Attempts: 2}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Status(ctx, a); err != nil || st.Status != queue.StatusDone || st.Result.StatusCode != 201 {
		t.Fatalf("status of a kept record: %+v %v", st, err)
	}
	// A direct write of a newer record of b replaces the kept copy; the flush must not
	// write the older copy over it.
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: b, Queue: "q", Status: queue.StatusDone, Attempts: 2}); err != nil {
		t.Fatal(err)
	}
	if n := s.KeptRecords(); n != 1 {
		t.Fatalf("%d kept records, want 1", n)
	}
	if left, err := s.FlushRecords(ctx); err != nil || left != 0 {
		t.Fatalf("flush: %d left, %v", left, err)
	}
	for _, tk := range []string{a, b} {
		if rec, err := s.Record(ctx, tk); err != nil || rec.Status != queue.StatusDone {
			t.Errorf("record %s after the flush: %+v %v", tk, rec, err)
		}
	}

	// Bounded: a big result body is dropped first, then records are refused.
	big := &queue.Record{Ticket: queue.NewTicket(), Queue: "q", Status: queue.StatusDone,
		Result: &queue.Result{StatusCode: 200, Body: bytes.Repeat([]byte("b"), 8<<10)}}
	if err := s.KeepRecord(big); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Record(ctx, big.Ticket)
	if err != nil || len(rec.Result.Body) != 0 || !rec.Result.Truncated || rec.Status != queue.StatusDone {
		t.Fatalf("kept over the bound: %+v %v", rec, err)
	}
	var full error
	for range 100 {
		if full = s.KeepRecord(&queue.Record{Ticket: queue.NewTicket(), Queue: "q", Status: queue.StatusDone}); full != nil {
			break
		}
	}
	if !errors.Is(full, queue.ErrKeptRecordsFull) {
		t.Fatalf("kept records unbounded: %v", full)
	}
	if err := s.KeepRecord(&queue.Record{Ticket: "../../x", Queue: "q"}); !errors.Is(err, queue.ErrInvalidRequest) {
		t.Errorf("bad ticket kept: %v", err)
	}
}

// Park refuses at the high-water mark of the store limit, as unavailable (503).
func TestParkStopsAtHighWater(t *testing.T) {
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := testConfig("hw")
	cfg.MaxDepth = -1
	s, err := queue.Open(ctx, srv.Conn, queue.WithStoreLimit(2<<20), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	req := order("hw", "")
	req.Body = bytes.Repeat([]byte("x"), 32<<10)
	accepted := 0
	for ; accepted < 200; accepted++ {
		if _, err = s.Park(ctx, req); err != nil {
			break
		}
	}
	if !errors.Is(err, queue.ErrStorageFull) || !errors.Is(err, queue.ErrUnavailable) {
		t.Fatalf("after %d orders: %v", accepted, err)
	}
	used, limit := s.StorageUsage(ctx)
	if limit != 2<<20 || used < uint64(float64(limit)*queue.HighWater) || used > uint64(limit) {
		t.Errorf("refused at %d of %d bytes", used, limit)
	}
	t.Logf("%d orders of 32 KiB accepted; refused at %d of %d bytes", accepted, used, limit)
}

// Park keeps the disk's reserve whatever the store limit: other files may fill the
// disk under the store, and a nats-server that meets a full disk answers no write
// until it restarts.
func TestParkKeepsTheDiskReserve(t *testing.T) {
	srv := natstest.Start(t)
	ctx := ctxT(t)
	var free atomic.Uint64
	free.Store(1 << 40)
	const limit = 1 << 30
	reg := prometheus.NewRegistry()
	s, err := queue.Open(ctx, srv.Conn, queue.WithSigningKey(natstest.SigningKey()), queue.WithRegisterer(reg),
		queue.WithStoreLimit(limit), queue.WithDiskFree(func() (uint64, error) { return free.Load(), nil }))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Declare(ctx, testConfig("disk")); err != nil {
		t.Fatal(err)
	}
	park := func() error { _, err := s.Park(ctx, order("disk", `{}`)); return err }
	if err := park(); err != nil {
		t.Fatal(err)
	}
	keyed := order("disk", `{"keyed":true}`)
	keyed.IdempotencyKey = "kept"
	first, err := s.Park(ctx, keyed)
	if err != nil {
		t.Fatal(err)
	}
	if got := gather(t, reg, "sluice_queue_store_disk_free_bytes"); got != 1<<40 {
		t.Errorf("disk free gauge %v, want %v", got, 1<<40)
	}
	if got := gather(t, reg, "sluice_queue_store_limit_bytes"); got != limit {
		t.Errorf("store limit gauge %v, want %v", got, limit)
	}
	reserve := queue.DiskReserve(limit)
	if reserve != limit*15/100 {
		t.Errorf("reserve %d for a %d-byte store, want 15%%", reserve, limit)
	}
	free.Store(reserve - 1)
	waitFor(t, func() bool {
		err := park()
		if err != nil && !(errors.Is(err, queue.ErrStorageFull) && errors.Is(err, queue.ErrUnavailable)) {
			t.Fatalf("park with the disk at its reserve: %v", err)
		}
		return err != nil
	})
	// A repeat of an accepted order stores nothing: it gets its ticket, not a refusal.
	if rc, err := s.Park(ctx, keyed); err != nil || rc.Ticket != first.Ticket || !rc.Duplicate {
		t.Errorf("repeat with the disk at its reserve: %+v, %v; want ticket %s, a duplicate", rc, err, first.Ticket)
	}
	fresh := order("disk", `{"keyed":true}`)
	fresh.IdempotencyKey = "fresh"
	if _, err := s.Park(ctx, fresh); !errors.Is(err, queue.ErrStorageFull) {
		t.Errorf("new keyed order with the disk at its reserve: %v, want ErrStorageFull", err)
	}
	free.Store(reserve)
	waitFor(t, func() bool { return park() == nil })
	if queue.DiskReserve(0) != 16<<20 {
		t.Errorf("reserve without a store limit: %d, want 16 MiB", queue.DiskReserve(0))
	}
}
