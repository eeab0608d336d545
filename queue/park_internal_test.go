package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func keyedOrder(client, key, body string) *Request {
	return &Request{Queue: "orders", Method: "POST", Path: "/v1/orders", Body: []byte(body),
		Header: http.Header{"Content-Type": {"application/json"}}, Client: client, IdempotencyKey: key}
}

func openInternal(t *testing.T, cfg queueconfig.Config, opts ...Option) (*Store, *Queue, context.Context) {
	t.Helper()
	s, q, ctx, _ := openInternalServer(t, cfg, opts...)
	return s, q, ctx
}

// openInternalServer is openInternal that also returns the server.
func openInternalServer(t *testing.T, cfg queueconfig.Config, opts ...Option) (*Store, *Queue, context.Context, *natstest.Server) {
	t.Helper()
	srv := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	s, err := Open(ctx, srv.Conn, append([]Option{WithSigningKey(natstest.SigningKey())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	q, err := s.Declare(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s, q, ctx, srv
}

func depth(t *testing.T, ctx context.Context, q *Queue) uint64 {
	t.Helper()
	d, err := q.Depth(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// keyCount is the number of live keys in the idempotency bucket.
func keyCount(t *testing.T, ctx context.Context, s *Store) int {
	t.Helper()
	keys, err := s.idem.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range keys.Keys() {
		n++
	}
	return n
}

func slotCount(t *testing.T, ctx context.Context, q *Queue) uint64 {
	t.Helper()
	info, err := q.keys.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A crash after the order was stored and before its client got the receipt leaves an
// order whose key is in no bucket yet. Its retry, even past the duplicate window, must
// find the stored order by the ticket its key names; nothing is parked twice.
func TestIdempotencyCrashAfterPublish(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	req := keyedOrder("c1", `"crash"`, `{"sku":1}`)
	key := idemKey("c1", `"crash"`)
	m := &Message{Request: *req, Ticket: s.keyedTicket(q.name, key)}
	m.Header = KeptHeader(req.Header, nil)
	m.Fingerprint = Fingerprint(&m.Request)
	// Another message id: the stream's duplicate window cannot recognise the retry.
	if _, err := s.publish(ctx, q, m, "past-the-window"); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, req)
	if err != nil || rc.Ticket != m.Ticket || !rc.Duplicate || rc.Status != StatusQueued {
		t.Fatalf("retry: %+v %v, want ticket %s", rc, err, m.Ticket)
	}
	if d, _ := q.Depth(ctx); d != 1 {
		t.Fatalf("depth %d", d)
	}
	// The same key with another payload: 422, nothing stored.
	if _, err := s.Park(ctx, keyedOrder("c1", `"crash"`, `{"sku":2}`)); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("other payload: %v", err)
	}
	// Delivered meanwhile (message gone): the dispatcher kept the key; a retry maps to it.
	if err := s.keepKey(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := q.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.Park(ctx, req); err != nil || rc.Ticket != m.Ticket || !rc.Duplicate {
		t.Fatalf("retry after delivery: %+v %v", rc, err)
	}
	if _, err := s.Park(ctx, keyedOrder("c1", `"crash"`, `{"sku":2}`)); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("other payload after delivery: %v", err)
	}
	if d, _ := q.Depth(ctx); d != 0 {
		t.Fatalf("a delivered order was parked again (depth %d)", d)
	}
}

// A key refused at the cap leaves nothing behind: once a slot frees, the same key is
// accepted (not taken for an order that was never kept), and nothing anybody saw was
// withdrawn.
func TestKeyRefusedAtTheCapWorksAgain(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), MaxIdempotencyKeys: 1,
		Downstream: "http://127.0.0.1:1"})
	if _, err := s.Park(ctx, keyedOrder("c1", "k1", "{}")); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs { // racing repeats of a refused key
		wg.Go(func() { _, errs[i] = s.Park(ctx, keyedOrder("c1", "k2", "{}")) })
	}
	wg.Wait()
	for i, err := range errs {
		if !errors.Is(err, ErrTooManyKeys) {
			t.Fatalf("request %d past the cap: %v", i, err)
		}
	}
	if d := depth(t, ctx, q); d != 1 {
		t.Fatalf("depth %d after refusals, want 1", d)
	}
	if err := q.keys.Purge(ctx); err != nil { // the slot's TTL ran out
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, keyedOrder("c1", "k2", "{}"))
	if err != nil || rc.Duplicate {
		t.Fatalf("the refused key once a slot freed: %+v %v", rc, err)
	}
	if d := depth(t, ctx, q); d != 2 {
		t.Fatalf("depth %d, want 2", d)
	}
}

// A repeat keeps no slot, so it never counts against its client's cap: within the
// duplicate window its slot is a duplicate of its key's and stores nothing, so a new
// key that races it one below the cap is accepted; at the cap a repeat of an order
// waiting past the duplicate window still gets its order back.
func TestKeyedRepeatsTakeNoSlot(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), MaxIdempotencyKeys: 2,
		Downstream: "http://127.0.0.1:1"})
	const clients = 20
	for c := range clients {
		if _, err := s.Park(ctx, keyedOrder(fmt.Sprint("c", c), "a", "{}")); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	errs := make([]error, 2*clients)
	for c := range clients {
		client := fmt.Sprint("c", c)
		wg.Go(func() {
			rc, err := s.Park(ctx, keyedOrder(client, "a", "{}"))
			if err == nil && !rc.Duplicate {
				err = fmt.Errorf("the repeat was parked again: %+v", rc)
			}
			errs[2*c] = err
		})
		wg.Go(func() { _, errs[2*c+1] = s.Park(ctx, keyedOrder(client, "b", "{}")) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if d, n := depth(t, ctx, q), slotCount(t, ctx, q); d != 2*clients || n != 2*clients {
		t.Fatalf("depth %d, %d slots; want %d of each", d, n, 2*clients)
	}

	// At c0's cap: an order of its key "w" parked so long ago that the duplicate window
	// no longer knows its message id.
	m := &Message{Request: *keyedOrder("c0", "w", "{}"), Ticket: s.keyedTicket(q.name, idemKey("c0", "w"))}
	m.Header = KeptHeader(m.Request.Header, nil)
	m.Fingerprint = Fingerprint(&m.Request)
	if _, err := s.publish(ctx, q, m, "past-the-window"); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, keyedOrder("c0", "w", "{}"))
	if err != nil || !rc.Duplicate || rc.Ticket != m.Ticket {
		t.Fatalf("repeat at the cap: %+v %v, want ticket %s", rc, err, m.Ticket)
	}
	if _, err := s.Park(ctx, keyedOrder("c0", "x", "{}")); !errors.Is(err, ErrTooManyKeys) {
		t.Fatalf("a new key at the cap: %v", err)
	}
}

// A repeat past the duplicate window takes its slot at once with its lookup (its
// Nats-Msg-Id is no longer known to the key stream), and deletes it once the lookup found
// the order: waiting, final, or with another payload. The client's cap then still has
// room for as many new keys as before.
func TestKeyedRepeatPastTheWindowLeavesNoSlot(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), MaxIdempotencyKeys: 2,
		Downstream: "http://127.0.0.1:1"})
	req := keyedOrder("c0", "w", `{"sku":1}`)
	m := &Message{Request: *req, Ticket: s.keyedTicket(q.name, idemKey("c0", "w"))}
	m.Header = KeptHeader(m.Request.Header, nil)
	m.Fingerprint = Fingerprint(&m.Request)
	// Parked so long ago that neither stream's duplicate window knows its key: no slot.
	if _, err := s.publish(ctx, q, m, "past-the-window"); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.Park(ctx, req); err != nil || !rc.Duplicate || rc.Ticket != m.Ticket {
		t.Fatalf("repeat of the waiting order: %+v %v, want ticket %s", rc, err, m.Ticket)
	}
	if n := slotCount(t, ctx, q); n != 0 {
		t.Fatalf("%d slots after a repeat of a waiting order, want 0", n)
	}
	if err := q.keys.Purge(ctx); err != nil { // and past the window again
		t.Fatal(err)
	}
	if _, err := s.Park(ctx, keyedOrder("c0", "w", `{"sku":2}`)); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("another payload: %v", err)
	}
	// Final: the dispatcher recorded the key and the message left.
	if err := s.keepKey(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := q.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if err := q.keys.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	if rc, err := s.Park(ctx, req); err != nil || !rc.Duplicate || rc.Ticket != m.Ticket {
		t.Fatalf("repeat of the final order: %+v %v, want ticket %s", rc, err, m.Ticket)
	}
	if n := slotCount(t, ctx, q); n != 0 {
		t.Fatalf("%d slots after the repeats, want 0", n)
	}
	for _, k := range []string{"x", "y"} {
		if rc, err := s.Park(ctx, keyedOrder("c0", k, "{}")); err != nil || rc.Duplicate {
			t.Fatalf("new key %s below the cap: %+v %v", k, rc, err)
		}
	}
	if _, err := s.Park(ctx, keyedOrder("c0", "z", "{}")); !errors.Is(err, ErrTooManyKeys) {
		t.Fatalf("a new key at the cap: %v", err)
	}
}

// A repeat whose lane differs from its order's (another priority) still finds the
// waiting order, past the duplicate window too.
func TestKeyedRepeatInAnotherLane(t *testing.T) {
	cfg := queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1",
		Priorities: queueconfig.Priorities{Levels: []string{"high", "low"}, Default: "low"}}
	s, q, ctx := openInternal(t, cfg)
	req := keyedOrder("c1", "k", "{}")
	req.Priority = "high"
	m := &Message{Request: *req, Ticket: s.keyedTicket(q.name, idemKey("c1", "k"))}
	m.Header = KeptHeader(req.Header, nil)
	m.Fingerprint = Fingerprint(&m.Request)
	m.Lane = s.laneFor(q.Config(), "high", "")
	// Another message id: the duplicate window cannot recognise the repeat.
	if _, err := s.publish(ctx, q, m, "past-the-window"); err != nil {
		t.Fatal(err)
	}
	low := keyedOrder("c1", "k", "{}")
	low.Priority = "low"
	rc, err := s.Park(ctx, low)
	if err != nil || rc.Ticket != m.Ticket || !rc.Duplicate {
		t.Fatalf("repeat in another lane: %+v %v, want ticket %s", rc, err, m.Ticket)
	}
	if d := depth(t, ctx, q); d != 1 {
		t.Fatalf("depth %d, want 1", d)
	}
}

// A cancelled order's key stays taken: a repeat gets the cancelled ticket, another
// payload 422, and nothing is parked again.
func TestKeyOfCancelledOrder(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	req := keyedOrder("c1", "k", `{"sku":1}`)
	rc, err := s.Park(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Fatal(err)
	}
	if again, err := s.Park(ctx, req); err != nil || again.Ticket != rc.Ticket || !again.Duplicate || again.Status != StatusCancelled {
		t.Fatalf("repeat of a cancelled order: %+v %v", again, err)
	}
	if _, err := s.Park(ctx, keyedOrder("c1", "k", `{"sku":2}`)); !errors.Is(err, ErrIdempotencyConflict) {
		t.Fatalf("other payload: %v", err)
	}
	if d, _ := q.Depth(ctx); d != 0 {
		t.Fatalf("depth %d after the cancellation and its repeats", d)
	}
}

// Refused requests leave no key and no slot, so the same key works afterwards.
func TestRefusedLeavesNoKey(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), MaxDepth: 2, Downstream: "http://127.0.0.1:1"})
	for i := range 2 {
		if _, err := s.Park(ctx, keyedOrder("c1", fmt.Sprint("ok-", i), "{}")); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		if _, err := s.Park(ctx, keyedOrder("c1", fmt.Sprint("refused-", i), "{}")); !errors.Is(err, ErrFull) {
			t.Fatalf("full queue: %v", err)
		}
	}
	if d, slots := depth(t, ctx, q), slotCount(t, ctx, q); d != 2 || slots != 2 {
		t.Fatalf("after 50 refusals: depth %d, %d slots; want 2 and 2", d, slots)
	}
	if err := q.stream.Purge(ctx); err != nil { // the queue drained
		t.Fatal(err)
	}
	if rc, err := s.Park(ctx, keyedOrder("c1", "refused-0", `{"fixed":true}`)); err != nil || rc.Duplicate {
		t.Fatalf("a refused key used again: %+v %v", rc, err)
	}
}

// The per-client key cap: past it ErrTooManyKeys with a retry delay; another client is
// unaffected; a refused order takes no slot; repeats of a known key are not new keys.
func TestKeyCapPerClient(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), MaxIdempotencyKeys: 3,
		IdempotencyTTL: time.Hour, Downstream: "http://127.0.0.1:1"})
	for i := range 3 {
		if _, err := s.Park(ctx, keyedOrder("c1", fmt.Sprint("k", i), "{}")); err != nil {
			t.Fatal(err)
		}
	}
	if rc, err := s.Park(ctx, keyedOrder("c1", "k0", "{}")); err != nil || !rc.Duplicate {
		t.Fatalf("repeat at the cap: %+v %v", rc, err)
	}
	_, err := s.Park(ctx, keyedOrder("c1", "k3", "{}"))
	var ke *KeyLimitError
	if !errors.Is(err, ErrTooManyKeys) || !errors.As(err, &ke) || ke.Limit != 3 || ke.RetryAfter < 59*time.Minute || ke.RetryAfter > time.Hour {
		t.Fatalf("past the cap: %v (%+v)", err, ke)
	}
	if _, err := s.Park(ctx, keyedOrder("c2", "k3", "{}")); err != nil {
		t.Fatalf("another client: %v", err)
	}
	// Without a key a capped client still parks.
	if _, err := s.Park(ctx, keyedOrder("c1", "", "{}")); err != nil {
		t.Fatalf("no key: %v", err)
	}
	// Three orders of c1 and one of c2 with keys, one of c1 without: the refused one was
	// withdrawn.
	if d, slots := depth(t, ctx, q), slotCount(t, ctx, q); d != 5 || slots != 4 {
		t.Fatalf("depth %d, %d slots; want 5 and 4", d, slots)
	}
}

// The bucket's byte cap: once the keys of final orders fill it, new keys are refused
// with ErrKeyStoreFull (a 503) and nothing is accepted; requests without a key still
// park.
func TestKeyStoreFull(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"},
		WithIdempotencyMaxBytes(4096))
	accepted, refused := 0, false
	for i := 0; i < 200 && !refused; i++ {
		req := keyedOrder("c1", fmt.Sprint("k", i), "{}")
		rc, err := s.Park(ctx, req)
		switch {
		case err == nil:
			accepted++
			// Delivered: the dispatcher keeps its key.
			m := &Message{Request: *req, Ticket: rc.Ticket, Fingerprint: Fingerprint(req)}
			if err := s.keepKey(ctx, m); err != nil && !errors.Is(err, ErrKeyStoreFull) {
				t.Fatal(err)
			}
			if _, err := s.idemInfo.streamInfo(ctx, 0); err != nil { // keyRoom's view, up to a second old
				t.Fatal(err)
			}
		case errors.Is(err, ErrKeyStoreFull) && errors.Is(err, ErrUnavailable):
			refused = true
		default:
			t.Fatalf("park %d: %v", i, err)
		}
	}
	if !refused || accepted == 0 {
		t.Fatalf("accepted %d, refused %v", accepted, refused)
	}
	if d := depth(t, ctx, q); int(d) != accepted {
		t.Fatalf("depth %d, accepted %d", d, accepted)
	}
	if _, err := s.Park(ctx, keyedOrder("c1", "", "{}")); err != nil {
		t.Fatalf("no key: %v", err)
	}
	t.Logf("4096-byte cap: %d keys accepted before refusals", accepted)
}

// keepKey gives a final order's key its TTL; a key that now belongs to another ticket
// is left alone; a missing one is created.
func TestKeepKey(t *testing.T) {
	s, _, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), IdempotencyTTL: 2 * time.Second,
		Backoff: queueconfig.Backoff{Initial: time.Second, Max: time.Second}, Downstream: "http://127.0.0.1:1"})
	rc, err := s.Park(ctx, keyedOrder("c1", "k", "{}"))
	if err != nil {
		t.Fatal(err)
	}
	key := idemKey("c1", "k")
	if _, found, err := s.getKey(ctx, key); err != nil || found {
		t.Fatalf("a queued order's key recorded (%v, %v): its message is its record", found, err)
	}
	m := &Message{Request: *keyedOrder("c1", "k", "{}"), Ticket: rc.Ticket}
	if err := s.keepKey(ctx, m); err != nil { // final: created with the TTL
		t.Fatal(err)
	}
	other := &Message{Request: *keyedOrder("c1", "k", "{}"), Ticket: newTicket()}
	if err := s.keepKey(ctx, other); err != nil { // another ticket: untouched
		t.Fatal(err)
	}
	if rec, found, err := s.getKey(ctx, key); err != nil || !found || rec.Ticket != rc.Ticket {
		t.Fatalf("key of a final order: %+v %v %v", rec, found, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, found, err := s.getKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the key of a final order never expired")
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// An idempotency record that sluice did not write decides nothing: a forged one that
// maps a client's key to a ticket of the attacker's choice is replaced, and the order
// gets a ticket of its own.
func TestForgedIdempotencyRecordIsReplaced(t *testing.T) {
	s, _, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	req := keyedOrder("c1", `"k"`, `{"sku":1}`)
	planted := newTicket()
	val, _ := json.Marshal(idemRecord{Ticket: planted, Fingerprint: Fingerprint(req), Queue: "orders"})
	if _, err := s.idem.Create(ctx, idemKey("c1", `"k"`), val); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, req)
	if err != nil || rc.Ticket == planted || rc.Duplicate {
		t.Fatalf("park over a forged key: %+v %v", rc, err)
	}
	// The key now holds the genuine record: a repeat gets the same ticket.
	if rc2, err := s.Park(ctx, req); err != nil || rc2.Ticket != rc.Ticket || !rc2.Duplicate {
		t.Fatalf("repeat: %+v %v", rc2, err)
	}
}

func TestOutflowSamples(t *testing.T) {
	var o outflowSamples
	t0 := time.Unix(1_000_000, 0)
	if r, over := o.rate(); r != 0 || over != 0 {
		t.Fatalf("empty: %v %v", r, over)
	}
	// 100 orders parked, 2 leave per second; samples every second for two minutes.
	for i := 0; i <= 120; i++ {
		o.add(t0.Add(time.Duration(i)*time.Second), jetstream.StreamState{LastSeq: 100, Msgs: uint64(max(100-2*i, 0))})
		if i == 3 {
			if r, over := o.rate(); over != 0 {
				t.Errorf("after 3 s: %v over %v, want unmeasured", r, over)
			}
		}
		if i == 40 {
			if r, over := o.rate(); r != 2 || over != 40*time.Second {
				t.Errorf("after 40 s: %v over %v", r, over)
			}
		}
	}
	// The queue emptied at 50 s: the last minute saw nothing leave.
	if r, over := o.rate(); r != 0 || over < 55*time.Second || over > 65*time.Second {
		t.Errorf("after 120 s: %v over %v", r, over)
	}
	if len(o.s) > 16 {
		t.Errorf("%d samples kept", len(o.s))
	}
	// A re-created stream starts over.
	o.add(t0.Add(121*time.Second), jetstream.StreamState{LastSeq: 1, Msgs: 1})
	if r, over := o.rate(); over != 0 {
		t.Errorf("after re-creation: %v %v", r, over)
	}
}

// Repeats racing the settlement of their orders, parked past the duplicate window,
// never park a second order and always get the order's ticket: the queue and the
// records are read at once, and a keyed order leaves its queue only leaveGap after its
// key is recorded (see repeat). A stress test: to fail, a lookup trusting two misses
// too early must land between a key's record and its order's acknowledgement.
func TestRepeatsRacingSettlementParkNothing(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	c := q.Consumer()
	if err := c.Ensure(ctx, ConsumerConfig{AckWait: 30 * time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 8}); err != nil {
		t.Fatal(err)
	}
	const n = 30
	tickets := make([]string, n)
	for i := range n {
		req := keyedOrder("c1", fmt.Sprint("k", i), "{}")
		m := &Message{Request: *req, Ticket: s.keyedTicket(q.name, idemKey("c1", fmt.Sprint("k", i)))}
		m.Header = KeptHeader(req.Header, nil)
		m.Fingerprint = Fingerprint(&m.Request)
		if _, err := s.publish(ctx, q, m, fmt.Sprint("past-the-window-", i)); err != nil {
			t.Fatal(err)
		}
		tickets[i] = m.Ticket
	}
	var wg sync.WaitGroup
	settled := make(chan struct{})
	wg.Go(func() {
		defer close(settled)
		for range n {
			lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			l, err := c.Next(lctx)
			cancel()
			if err == nil {
				err = l.Load(ctx)
			}
			if err == nil {
				err = l.Start(ctx)
			}
			if err == nil {
				err = l.Done(ctx, &Result{StatusCode: 200})
			}
			if err != nil {
				t.Error(err)
				return
			}
		}
	})
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			for {
				var last bool // every order was settled before this repeat
				select {
				case <-settled:
					last = true
				default:
				}
				rc, err := s.Park(ctx, keyedOrder("c1", fmt.Sprint("k", i), "{}"))
				switch {
				case err != nil:
					errs[i] = err
					return
				case !rc.Duplicate || rc.Ticket != tickets[i]:
					errs[i] = fmt.Errorf("repeat of k%d: %+v, want ticket %s", i, rc, tickets[i])
					return
				case rc.Status == StatusDone:
					return
				case last:
					errs[i] = fmt.Errorf("repeat of k%d after its settlement: status %q", i, rc.Status)
					return
				}
			}
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if d := depth(t, ctx, q); d != 0 {
		t.Fatalf("depth %d after every order was settled: a repeat parked its order again", d)
	}
}

// An order that leaves its queue while a repeat's reads are under way is found by its
// key: two misses are trusted only when the queue answered within leaveGap of the
// reads' start, else the records are read again after the queue's answer.
func TestRepeatReadsRecordsAgainAfterSlowReads(t *testing.T) {
	s, q, ctx := openInternal(t, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(5), Downstream: "http://127.0.0.1:1"})
	req := keyedOrder("c1", "k", "{}")
	key := idemKey("c1", "k")
	m := &Message{Request: *req, Ticket: s.keyedTicket(q.name, key)}
	m.Header = KeptHeader(req.Header, nil)
	m.Fingerprint = Fingerprint(&m.Request)
	if _, err := s.publish(ctx, q, m, "past-the-window"); err != nil {
		t.Fatal(err)
	}
	stale := s.readRecords(ctx, key, m.Ticket)() // read before the order was settled: misses
	if stale.found || !errors.Is(stale.recErr, ErrNotFound) {
		t.Fatalf("records before the settlement: %+v", stale)
	}
	// Settled meanwhile: the key recorded, then the order gone from the queue.
	if err := s.keepKey(ctx, m); err != nil {
		t.Fatal(err)
	}
	if err := q.stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	records := func() records { return stale }
	rc, found, err := s.repeatFrom(ctx, q, key, m, time.Now().Add(-leaveGap), records)
	if err != nil || !found || rc.Ticket != m.Ticket || !rc.Duplicate {
		t.Fatalf("repeat after slow reads: %+v found %v %v, want ticket %s", rc, found, err, m.Ticket)
	}
	// Reads that came back within leaveGap are trusted (the dispatcher waits leaveGap
	// between the key's record and the acknowledgement, which this test skipped). The
	// start lies ahead, so that the queue's answer counts as quick however long a
	// loaded machine takes to give it.
	if _, found, err := s.repeatFrom(ctx, q, key, m, time.Now().Add(time.Minute), records); err != nil || found {
		t.Fatalf("repeat after quick reads: found %v %v; the misses should have been trusted", found, err)
	}
}
