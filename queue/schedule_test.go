package queue_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func scheduledConfig(name string) queueconfig.Config {
	c := testConfig(name)
	c.MaxDelay = time.Hour
	return c
}

// at returns an order of queue q asking to be delivered not before nb.
func at(q, body string, nb time.Time) *queue.Request {
	r := order(q, body)
	r.NotBefore = nb
	return r
}

// settle takes a leased order to done.
func settle(t *testing.T, l *queue.Lease) {
	t.Helper()
	ctx := ctxT(t)
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
		t.Fatal(err)
	}
}

// TestScheduledFiresAfterItsTime: a scheduled order is stored as a JetStream schedule,
// reads back as scheduled with its due time (whole seconds, never before the asked
// time), and reaches the dispatch consumer, signed, only once due; an unscheduled order
// parked after it comes first.
func TestScheduledFiresAfterItsTime(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, scheduledConfig("sched"))
	c := consumer(t, s, "sched")
	ctx := ctxT(t)

	asked := time.Now().Add(2500 * time.Millisecond)
	rc, err := s.Park(ctx, at("sched", "later", asked))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Status != queue.StatusScheduled || rc.NotBefore.Before(asked) || rc.NotBefore.Nanosecond() != 0 ||
		!rc.EstimatedDelivery.Equal(rc.NotBefore) {
		t.Fatalf("receipt %+v; want scheduled, due at the whole second at or after %s", rc, asked)
	}
	if rec, err := s.Status(ctx, rc.Ticket); err != nil {
		t.Fatal(err)
	} else if time.Now().Before(rc.NotBefore) && (rec.Status != queue.StatusScheduled || !rec.NotBefore.Equal(rc.NotBefore)) {
		t.Fatalf("status before its time: %+v", rec)
	}
	now, err := s.Park(ctx, order("sched", "now"))
	if err != nil || now.Status != queue.StatusQueued {
		t.Fatalf("unscheduled order: %+v, %v", now, err)
	}

	first := lease(t, c)
	if first.Message().Ticket != now.Ticket {
		t.Fatalf("first order %s, want the unscheduled %s", first.Message().Ticket, now.Ticket)
	}
	settle(t, first)
	l := lease(t, c)
	got := time.Now()
	m := l.Message()
	if m.Ticket != rc.Ticket || string(m.Body) != "later" {
		t.Fatalf("leased %s %q, want %s", m.Ticket, m.Body, rc.Ticket)
	}
	if err := l.Verify(); err != nil {
		t.Fatalf("fired order does not verify: %v", err)
	}
	if got.Before(rc.NotBefore) || !m.NotBefore.Equal(rc.NotBefore) {
		t.Fatalf("delivered at %s with due time %s; due %s", got, m.NotBefore, rc.NotBefore)
	}
	if m.Header.Get("Content-Type") != "application/json" {
		t.Errorf("kept headers lost when firing: %v", m.Header)
	}
	settle(t, l)
	if rec, err := s.Status(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusDone {
		t.Fatalf("status after delivery: %+v, %v", rec, err)
	}
	q, _ := s.Queue("sched")
	if d, err := q.Depth(ctx); err != nil || d != 0 {
		t.Fatalf("depth %d (%v) after both were delivered: the schedule message stayed", d, err)
	}
}

// TestScheduleBounds: NotBefore beyond max_delay, or on a queue without max_delay, is
// refused with ErrSchedule naming the bound; a time already past is delivered at once;
// a queue's delay holds back every order.
func TestScheduleBounds(t *testing.T) {
	srv := natstest.Start(t)
	delayed := testConfig("delayed")
	delayed.Delay = 30 * time.Minute
	s := openStore(t, srv, scheduledConfig("sched"), testConfig("plain"), delayed)
	ctx := ctxT(t)

	_, err := s.Park(ctx, at("sched", "far", time.Now().Add(2*time.Hour)))
	var se *queue.ScheduleError
	if !errors.Is(err, queue.ErrSchedule) || !errors.As(err, &se) || se.MaxDelay != time.Hour {
		t.Fatalf("beyond max_delay: %v; want a ScheduleError with the bound 1h", err)
	}
	_, err = s.Park(ctx, at("plain", "x", time.Now().Add(time.Minute)))
	if !errors.As(err, &se) || se.MaxDelay != 0 {
		t.Fatalf("on a queue without max_delay: %v", err)
	}
	rc, err := s.Park(ctx, at("sched", "past", time.Now().Add(-time.Minute)))
	if err != nil || rc.Status != queue.StatusQueued {
		t.Fatalf("a past time: %+v, %v; want queued at once", rc, err)
	}
	start := time.Now()
	rc, err = s.Park(ctx, order("delayed", "d"))
	if err != nil || rc.Status != queue.StatusScheduled || rc.NotBefore.Before(start.Add(30*time.Minute-time.Second)) {
		t.Fatalf("delay 30m: %+v, %v", rc, err)
	}
	// A client's later time wins over the queue's delay, within max_delay only.
	if _, err := s.Park(ctx, at("delayed", "d2", time.Now().Add(time.Hour))); !errors.Is(err, queue.ErrSchedule) {
		t.Fatalf("client schedule on a queue with only a delay: %v", err)
	}
}

// TestCancelScheduled: a scheduled order is cancelled while it waits: its record says
// cancelled, its schedule message is gone (it never fires), and the queue is empty.
func TestCancelScheduled(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, scheduledConfig("sched"))
	ctx := ctxT(t)
	rc, err := s.Park(ctx, at("sched", "x", time.Now().Add(30*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Status(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusCancelled {
		t.Fatalf("status: %+v, %v", rec, err)
	}
	q, _ := s.Queue("sched")
	if d, err := q.Depth(ctx); err != nil || d != 0 {
		t.Fatalf("depth %d (%v): the schedule message stayed", d, err)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Fatalf("cancelling again: %v", err)
	}
	if err := s.Cancel(ctx, "aaaaaaaaaaaaaaaaaaaaaaaaaa"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("unknown ticket: %v", err)
	}
}

// TestScheduledSurvivesRestart: scheduled orders wait through a server restart (as after
// a crash) and every one is delivered, after its time, exactly once.
func TestScheduledSurvivesRestart(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, scheduledConfig("sched"))
	ctx := ctxT(t)
	const n = 30
	due := map[string]time.Time{}
	for i := range n {
		rc, err := s.Park(ctx, at("sched", "o", time.Now().Add(time.Duration(2+i%3)*time.Second)))
		if err != nil {
			t.Fatal(err)
		}
		due[rc.Ticket] = rc.NotBefore
	}
	srv.Restart()
	c := consumer(t, s, "sched")
	for range n {
		l := lease(t, c)
		m := l.Message()
		when, ok := due[m.Ticket]
		if !ok {
			t.Fatalf("unknown or repeated order %s", m.Ticket)
		}
		if time.Now().Before(when) || l.Verify() != nil {
			t.Fatalf("order %s came at %s, due %s (verify %v)", m.Ticket, time.Now(), when, l.Verify())
		}
		delete(due, m.Ticket)
		settle(t, l)
	}
	if len(due) != 0 {
		t.Fatalf("%d orders not delivered", len(due))
	}
}

// TestScheduledSignature: the due time is signed: a copy of a scheduled order published
// on its ready subject with another due time does not verify, nor does an unchanged
// copy published there before its time.
func TestScheduledSignature(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, scheduledConfig("sched"))
	ctx := ctxT(t)
	rc, err := s.Park(ctx, at("sched", "x", time.Now().Add(30*time.Minute)))
	if err != nil {
		t.Fatal(err)
	}
	st := srv.Stream(t, queue.StreamName("sched"))
	raw, err := st.GetLastMsgForSubject(ctx, "sluice.s.sched."+rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg("sluice.q.sched." + rc.Ticket)
	forged.Data = raw.Data
	for k, vs := range raw.Header {
		if k == "Nats-Schedule" || k == "Nats-Schedule-Target" || k == jetstream.MsgIDHeader || k == "Nats-Rollup" {
			continue
		}
		forged.Header[k] = vs
	}
	js, _ := jetstream.New(srv.Conn)
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	forged.Header.Set(queue.HeaderNotBefore, time.Now().Add(-time.Hour).UTC().Format(time.RFC3339))
	if _, err := js.PublishMsg(ctx, forged); err != nil {
		t.Fatal(err)
	}
	c := consumer(t, s, "sched")
	for _, what := range []string{"early copy", "rescheduled copy"} {
		l := lease(t, c)
		if !errors.Is(l.Verify(), queue.ErrForged) {
			t.Fatalf("%s verifies: %v", what, l.Verify())
		}
		l.Release(time.Hour) // out of the way of the next one
	}
}

// TestScheduleSoftCap: a queue with schedules keeps max_depth itself (its stream cannot
// refuse), counting the orders that wait for their time.
func TestScheduleSoftCap(t *testing.T) {
	srv := natstest.Start(t)
	cfg := scheduledConfig("sched")
	cfg.MaxDepth = 2
	s := openStore(t, srv, cfg)
	ctx := ctxT(t)
	for i := range 2 {
		if _, err := s.Park(ctx, at("sched", "x", time.Now().Add(30*time.Minute))); err != nil {
			t.Fatalf("order %d: %v", i, err)
		}
		// Older than the stream info Park may reuse, so the next park counts this one.
		time.Sleep(150 * time.Millisecond)
	}
	if _, err := s.Park(ctx, order("sched", "x")); !errors.Is(err, queue.ErrFull) {
		t.Fatalf("third order in a queue of max_depth 2: %v", err)
	}
}

// TestScheduleAddedToExistingQueue: a queue declared without schedules and holding an
// order takes max_delay on a re-declaration; the order stays and is delivered, and the
// stream keeps its schedules when the setting goes away again.
func TestScheduleAddedToExistingQueue(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("sched"))
	ctx := ctxT(t)
	old, err := s.Park(ctx, order("sched", "old"))
	if err != nil {
		t.Fatal(err)
	}
	c := consumer(t, s, "sched")
	if _, err := s.Declare(ctx, scheduledConfig("sched")); err != nil {
		t.Fatal(err)
	}
	if err := c.Ensure(ctx, leaseConsumer); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, at("sched", "new", time.Now().Add(time.Second)))
	if err != nil || rc.Status != queue.StatusScheduled {
		t.Fatalf("scheduled on the re-declared queue: %+v, %v", rc, err)
	}
	if _, err := s.Declare(ctx, testConfig("sched")); err != nil {
		t.Fatalf("re-declared without schedules: %v", err)
	}
	for _, want := range []string{old.Ticket, rc.Ticket} {
		l := lease(t, c)
		if l.Message().Ticket != want {
			t.Fatalf("leased %s, want %s", l.Message().Ticket, want)
		}
		settle(t, l)
	}
}

// TestCancelledScheduleOutlivesItsRecord: a cancel that cannot delete a scheduled
// order's schedule message (the deletion fails: here the NATS user may not delete
// messages) leaves it to fire, for a dispatcher to drop by its cancelled record. That
// record must last until then: it lived the queue's idempotency TTL from the cancel,
// so an order due later than that was delivered after its cancel was answered 204.
func TestCancelledScheduleOutlivesItsRecord(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(conf, []byte(`accounts {
  APP {
    jetstream: enabled
    users: [{user: app, password: app-pw, permissions: {publish: {allow: ">", deny: ["$JS.API.STREAM.MSG.DELETE.>"]}, subscribe: ">"}}]
  }
}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartConfig(t, conf)
	nc := srv.Connect(t, nats.UserInfo("app", "app-pw"))
	ctx := ctxT(t)
	s, err := queue.Open(ctx, nc, queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	cfg := scheduledConfig("sched")
	// A record lifetime shorter than the wait, as a max_delay beyond 24h makes it.
	cfg.IdempotencyTTL, cfg.Backoff = 2*time.Second, queueconfig.Backoff{Initial: 100 * time.Millisecond, Max: time.Second}
	if _, err := s.Declare(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	rc, err := s.Park(ctx, at("sched", "x", time.Now().Add(5*time.Second)))
	if err != nil {
		t.Fatal(err)
	}
	// The deletion gets no answer: each try is bounded; asking again is what a client
	// told 503 does, and it ends in 204 (the record says cancelled).
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := s.Cancel(cctx, rc.Ticket)
		cancel()
		if err == nil {
			break
		}
		if !errors.Is(err, queue.ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("cancel: %v", err)
		}
	}
	if rec, err := s.Status(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusCancelled {
		t.Fatalf("status after the cancel: %+v, %v", rec, err)
	}
	c := consumer(t, s, "sched")
	l := lease(t, c)
	if l.Message().Ticket != rc.Ticket {
		t.Fatalf("leased %s, want %s", l.Message().Ticket, rc.Ticket)
	}
	if err := l.Load(ctx); !errors.Is(err, queue.ErrFinal) {
		t.Fatalf("the cancelled order fired at %s (due %s) and loads as deliverable (%v): its cancelled record is gone",
			time.Now().UTC().Format(time.RFC3339Nano), rc.NotBefore.Format(time.RFC3339), err)
	}
}

// TestPositionBehindAWaitingSchedule: a scheduled order waiting for a distant time
// holds the first sequence of its queue's stream, but it is not ahead of anything:
// an order parked once the queue has drained what came after it is first in line
// (position 1, estimated now), in its receipt and in its status. The position was
// counted from the stream's first sequence: every order parked since the scheduled
// one, delivered or not, and the ETA and Retry-After with it.
func TestPositionBehindAWaitingSchedule(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, scheduledConfig("sched"))
	c := consumer(t, s, "sched")
	ctx := ctxT(t)
	if _, err := s.Park(ctx, at("sched", "later", time.Now().Add(30*time.Minute))); err != nil {
		t.Fatal(err)
	}
	const drained = 20
	for range drained {
		if _, err := s.Park(ctx, order("sched", "x")); err != nil {
			t.Fatal(err)
		}
	}
	for range drained {
		settle(t, lease(t, c))
	}
	// Stream information is reused for up to a second.
	time.Sleep(1100 * time.Millisecond)
	rc, err := s.Park(ctx, order("sched", "alone"))
	if err != nil {
		t.Fatal(err)
	}
	if rc.Position != 1 {
		t.Errorf("receipt of the only queued order: position %d, estimated delivery in %s; want 1, now",
			rc.Position, time.Until(rc.EstimatedDelivery).Round(time.Second))
	}
	st, err := s.Status(ctx, rc.Ticket)
	if err != nil {
		t.Fatal(err)
	}
	if st.Status != queue.StatusQueued || st.Position != 1 {
		t.Errorf("status of the only queued order: %s at position %d (retry after %s); want queued at 1", st.Status, st.Position, st.RetryAfter)
	}
}
