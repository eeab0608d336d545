package dispatcher_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/embedded"
	"github.com/sluicehq/sluice/queue/natstest"
)

// okCounter is a real HTTP downstream that answers 503 (Retry-After: 1) while down and
// 201 when up, counting the 201s per Idempotency-Key: the deliveries that count.
type okCounter struct {
	*httptest.Server
	up atomic.Bool
	mu sync.Mutex
	ok map[string]int
}

func newOKCounter(t *testing.T) *okCounter {
	c := &okCounter{ok: map[string]int{}}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if !c.up.Load() {
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		c.mu.Lock()
		c.ok[r.Header.Get("Idempotency-Key")]++
		c.mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *okCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.ok))
	for k, v := range c.ok {
		out[k] = v
	}
	return out
}

// A 24 MB JetStream store fills while the downstream answers 503. When it comes back,
// every accepted order is delivered, at most twice, and every ticket ends done: with the
// high-water mark parking stops early enough for the records; without it (the store
// truly full) the records wait in memory and the orders are acknowledged all the same.
func TestFullStoreDrainsWhenDownstreamReturns(t *testing.T) {
	for _, tc := range []struct {
		name  string
		limit int64 // queue.WithStoreLimit of the parking store
	}{
		{"high-water mark", 24 << 20},
		{"store full, records kept in memory", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			emb, err := embedded.Start(embedded.Config{DataDir: t.TempDir(), MaxStore: 24 << 20})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(emb.Shutdown)
			connect := func() *nats.Conn {
				nc, err := emb.Connect()
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				return nc
			}
			ds := newOKCounter(t)
			cfg := baseConfig("full", ds.URL)
			cfg.MaxDepth = -1
			cfg.MaxInFlight = 16
			cfg.Outflow = limiter.PerSecond(200)
			cfg.MaxAttempts = 3 // a 503 must not count: none may die

			// The key bucket's byte cap is reserved from the store: it must fit in 24 MB
			// also when the store's size is not given (WithStoreLimit(0)).
			store, err := queue.Open(ctxT(t), connect(), queue.WithStoreLimit(tc.limit), queue.WithSigningKey(natstest.SigningKey()),
				queue.WithIdempotencyMaxBytes(1<<20))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Declare(ctxT(t), cfg); err != nil {
				t.Fatal(err)
			}
			startReplicaOn(t, connect(), cfg, "a", dispatcher.WithAckWait(time.Minute), dispatcher.WithDeliveryTimeout(10*time.Second))

			body := bytes.Repeat([]byte("x"), 64<<10)
			var tickets []string
			refused := 0
			for refused < 5 {
				req := orderReq("full", len(tickets))
				req.Body = body
				rc, err := store.Park(ctxT(t), req)
				switch {
				case err == nil:
					tickets = append(tickets, rc.Ticket)
					refused = 0
				case errors.Is(err, queue.ErrStorageFull):
					if !errors.Is(err, queue.ErrUnavailable) {
						t.Fatalf("a full store must read as unavailable (503): %v", err)
					}
					refused++
				default:
					t.Fatalf("park %d: %v", len(tickets), err)
				}
				if len(tickets) > 1000 {
					t.Fatal("a 24 MB store took more than 1000 orders of 64 KiB")
				}
			}
			used, limit := store.StorageUsage(ctxT(t))
			t.Logf("%d orders accepted; %d bytes of JetStream storage used (limit %d)", len(tickets), used, limit)

			ds.up.Store(true)
			start := time.Now()
			waitFor(t, "every accepted order delivered", 5*time.Minute, func() bool { return len(ds.counts()) >= len(tickets) })
			t.Logf("drain: %d orders delivered %s after the downstream came back", len(tickets), time.Since(start).Round(time.Millisecond))
			counts := ds.counts()
			for _, tk := range tickets {
				if n := counts[tk]; n < 1 || n > 2 {
					t.Errorf("order %s delivered %d times", tk, n)
				}
			}
			if len(counts) != len(tickets) {
				t.Errorf("%d distinct orders at the downstream, %d accepted", len(counts), len(tickets))
			}
			// The records refused while the store was full are written once it has room.
			for _, tk := range tickets {
				waitFor(t, "status done", 2*time.Minute, func() bool {
					st, err := store.Status(ctxT(t), tk)
					return err == nil && st.Status == queue.StatusDone
				})
			}
			// Parking works again.
			if _, err := store.Park(context.Background(), orderReq("full", 9999)); err != nil {
				t.Errorf("park after the drain: %v", err)
			}
		})
	}
}
