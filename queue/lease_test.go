package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

var leaseConsumer = queue.ConsumerConfig{AckWait: 30 * time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 4}

// consumer sets up the dispatchers' consumer of a queue.
func consumer(t *testing.T, s *queue.Store, name string) *queue.Consumer {
	t.Helper()
	q, err := s.Queue(name)
	if err != nil {
		t.Fatal(err)
	}
	c := q.Consumer()
	if err := c.Ensure(ctxT(t), leaseConsumer); err != nil {
		t.Fatal(err)
	}
	return c
}

// lease fetches orders until one comes (generous deadline: the machine is shared).
func lease(t *testing.T, c *queue.Consumer) *queue.Lease {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		l, err := c.Next(ctx)
		cancel()
		if err == nil {
			return l
		}
		if !errors.Is(err, queue.ErrNoMessages) {
			t.Fatalf("next: %v", err)
		}
	}
	t.Fatal("no order came")
	return nil
}

func nextEvent(t *testing.T, sub *nats.Subscription) queue.Event {
	t.Helper()
	msg, err := sub.NextMsg(10 * time.Second)
	if err != nil {
		t.Fatalf("no event: %v", err)
	}
	var ev queue.Event
	if err := json.Unmarshal(msg.Data, &ev); err != nil {
		t.Fatal(err)
	}
	return ev
}

func TestLeaseSettlements(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	c := consumer(t, s, "orders")
	q, _ := s.Queue("orders")
	ctx := ctxT(t)
	res := &queue.Result{StatusCode: 201, Body: []byte("ok")}
	for _, tc := range []struct {
		name    string
		settle  func(l *queue.Lease) error
		status  queue.Status
		attempt int
		subject string // event subject ("": none)
		gone    bool   // the message left the queue
	}{
		{"done", func(l *queue.Lease) error { return l.Done(ctx, res) }, queue.StatusDone, 1, queue.DoneSubject("orders"), true},
		{"fail", func(l *queue.Lease) error { return l.Fail(ctx, &queue.Result{StatusCode: 404}, "nope") }, queue.StatusFailed, 1, queue.DoneSubject("orders"), true},
		{"retry counted", func(l *queue.Lease) error { l.CountAttempt(); return l.Retry(ctx, 20*time.Millisecond, "boom") }, queue.StatusQueued, 1, "", false},
		{"retry not counted", func(l *queue.Lease) error { return l.Retry(ctx, 20*time.Millisecond, "refused") }, queue.StatusQueued, 0, "", false},
		{"throttle", func(l *queue.Lease) error {
			return l.Throttle(ctx, time.Now().Add(time.Minute), "429", queue.RedeliverIn(20*time.Millisecond))
		}, queue.StatusQueued, 0, "", false},
		{"dead", func(l *queue.Lease) error { l.CountAttempt(); return l.Dead(ctx, "out of attempts", time.Second) }, queue.StatusDead, 1, queue.DeadSubject("orders"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done, _ := srv.Conn.SubscribeSync(queue.DoneSubject("orders"))
			dead, _ := srv.Conn.SubscribeSync(queue.DeadSubject("orders"))
			defer func() { _ = done.Unsubscribe(); _ = dead.Unsubscribe() }()
			rc, err := s.Park(ctx, order("orders", tc.name))
			if err != nil {
				t.Fatal(err)
			}
			l := lease(t, c)
			if l.Message().Ticket != rc.Ticket || l.Verify() != nil {
				t.Fatalf("leased %s (verify %v), parked %s", l.Message().Ticket, l.Verify(), rc.Ticket)
			}
			if err := l.Load(ctx); err != nil || l.Record().Status != queue.StatusQueued {
				t.Fatalf("load: %v, record %+v", err, l.Record())
			}
			if err := l.Start(ctx); err != nil {
				t.Fatal(err)
			}
			if err := tc.settle(l); err != nil {
				t.Fatal(err)
			}
			rec, err := s.Record(ctx, rc.Ticket)
			if err != nil || rec.Status != tc.status || rec.Attempts != tc.attempt {
				t.Fatalf("record %+v %v; want %s with %d attempts", rec, err, tc.status, tc.attempt)
			}
			if tc.subject != "" {
				sub := done
				if tc.subject == queue.DeadSubject("orders") {
					sub = dead
				}
				if ev := nextEvent(t, sub); ev.Ticket != rc.Ticket || ev.Status != tc.status {
					t.Errorf("event %+v", ev)
				}
			}
			if !tc.gone {
				// Handed back: it comes again, and its record says how far it got.
				l := lease(t, c)
				if l.Message().Ticket != rc.Ticket {
					t.Fatalf("redelivered %s, want %s", l.Message().Ticket, rc.Ticket)
				}
				if err := l.Load(ctx); err != nil || l.Record().Attempts != tc.attempt {
					t.Fatalf("reload: %v, record %+v", err, l.Record())
				}
				if err := l.Start(ctx); err != nil {
					t.Fatal(err)
				}
				if err := l.Done(ctx, res); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, func() bool { d, err := q.Depth(ctx); return err == nil && d == 0 })
		})
	}
	if dls, err := s.DeadLetters(ctx, "orders", 0); err != nil || len(dls) != 1 || dls[0].Reason != "out of attempts" || dls[0].Attempts != 1 {
		t.Fatalf("dead letters %+v %v", dls, err)
	}
}

// A final ticket's redelivery is acknowledged unseen; a cancellation between Load and
// Start wins (Start terminates the order).
func TestLeaseFinalAndCancelled(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	c := consumer(t, s, "orders")
	q, _ := s.Queue("orders")
	ctx := ctxT(t)

	rc, err := s.Park(ctx, order("orders", "final"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SaveRecord(ctx, &queue.Record{Ticket: rc.Ticket, Queue: "orders", Status: queue.StatusDone}); err != nil {
		t.Fatal(err)
	}
	if err := lease(t, c).Load(ctx); !errors.Is(err, queue.ErrFinal) {
		t.Fatalf("load of a done ticket: %v, want ErrFinal", err)
	}
	waitFor(t, func() bool { d, err := q.Depth(ctx); return err == nil && d == 0 })

	rc, err = s.Park(ctx, order("orders", "cancel"))
	if err != nil {
		t.Fatal(err)
	}
	l := lease(t, c)
	if err := l.Retry(ctx, time.Millisecond, "settled before Load"); !errors.Is(err, queue.ErrNotLoaded) {
		t.Fatalf("retry before load: %v, want ErrNotLoaded", err)
	}
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Retry(ctx, time.Millisecond, "first attempt refused"); err != nil { // now it has a record
		t.Fatal(err)
	}
	l = lease(t, c)
	if err := l.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Cancel(ctx, rc.Ticket); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if err := l.Start(ctx); !errors.Is(err, queue.ErrCancelled) {
		t.Fatalf("start after cancel: %v, want ErrCancelled", err)
	}
	if rec, err := s.Record(ctx, rc.Ticket); err != nil || rec.Status != queue.StatusCancelled {
		t.Fatalf("record %+v %v", rec, err)
	}
	waitFor(t, func() bool { d, err := q.Depth(ctx); return err == nil && d == 0 })
}

// A message published on a queue subject by someone else is leased as forged; its
// dead-lettering leaves the record of the ticket it names alone and publishes no event.
func TestLeaseForged(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	c := consumer(t, s, "orders")
	ctx := ctxT(t)
	ticket := queue.NewTicket()
	msg := nats.NewMsg("sluice.q.orders." + ticket)
	msg.Header.Set(queue.HeaderTicket, ticket)
	msg.Header.Set(queue.HeaderQueue, "orders")
	msg.Header.Set(queue.HeaderMethod, "POST")
	msg.Header.Set(queue.HeaderPath, "/v1/orders")
	msg.Data = []byte("forged")
	js, _ := jetstream.New(srv.Conn)
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	l := lease(t, c)
	if err := l.Verify(); !errors.Is(err, queue.ErrForged) {
		t.Fatalf("verify: %v, want ErrForged", err)
	}
	// Events go out on the store's connection within Dead.
	if events := natstest.PublishedDuring(t, srv.Conn, queue.DeadSubject("orders"), func() {
		if err := l.Dead(ctx, "forged: "+l.Verify().Error(), time.Second); err != nil {
			t.Fatal(err)
		}
	}); len(events) != 0 {
		t.Errorf("events for a forged order: %v", events)
	}
	if _, err := s.Record(ctx, ticket); !errors.Is(err, queue.ErrNotFound) {
		t.Errorf("record of the forged ticket: %v, want ErrNotFound", err)
	}
	if dls, err := s.DeadLetters(ctx, "orders", 0); err != nil || len(dls) != 1 || dls[0].Message.Ticket != ticket {
		t.Fatalf("dead letters %+v %v", dls, err)
	}
}

func TestForwardAndCheckQueue(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	ctx := ctxT(t)
	m := &queue.Message{Ticket: queue.NewTicket(), Request: queue.Request{Queue: "orders", Method: "POST", Path: "/x", Body: []byte("b")}}

	// No stream captures the subject: the downstream is unreachable.
	if _, err := s.Forward(ctx, "out.none", m); !errors.Is(err, queue.ErrUnavailable) {
		t.Errorf("forward without a stream: %v, want ErrUnavailable", err)
	}
	js, _ := jetstream.New(srv.Conn)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OUT", Subjects: []string{"out.>"}}); err != nil {
		t.Fatal(err)
	}
	seq, err := s.Forward(ctx, "out.orders", m)
	if err != nil || seq != 1 {
		t.Fatalf("forward: seq %d, %v", seq, err)
	}
	sub, _ := srv.Conn.SubscribeSync("plain.orders")
	if _, err := s.Forward(ctx, "plain.orders", m, queue.ForwardAtMostOnce()); err != nil {
		t.Fatal(err)
	}
	got, err := sub.NextMsg(5 * time.Second)
	if err != nil || string(got.Data) != "b" || got.Header.Get(queue.HeaderTicket) != m.Ticket || got.Header.Get(queue.HeaderSignature) != "" {
		t.Fatalf("at most once: %+v %v", got, err)
	}

	for _, tc := range []struct {
		name string
		want error
	}{
		{"orders", nil},
		{"missing", queue.ErrUnknownQueue},
		{"not a name!", queue.ErrUnknownQueue},
	} {
		if err := s.CheckQueue(ctx, tc.name); !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("CheckQueue(%q) = %v, want %v", tc.name, err, tc.want)
		}
	}
}

// parkedForHandBack parks n orders and returns their queue's consumer with an ack
// wait of an hour, longer than any test waits (lease gives up after 30 s): an order
// that comes again came back by its nak.
func parkedForHandBack(t *testing.T, n int) (*natstest.Server, *queue.Consumer) {
	t.Helper()
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	for range n {
		if _, err := s.Park(ctxT(t), order("orders", "x")); err != nil {
			t.Fatal(err)
		}
	}
	q, err := s.Queue("orders")
	if err != nil {
		t.Fatal(err)
	}
	c := q.Consumer()
	cfg := leaseConsumer
	cfg.AckWait, cfg.MaxInFlight = time.Hour, n
	if err := c.Ensure(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	return srv, c
}

// A hand-back comes just before the connection or an embedded server stops: HandBack
// returns once the server has applied its nak, so a server restarted right after it
// redelivers every order at once, not after the ack wait.
func TestHandBackOutlivesServerRestart(t *testing.T) {
	const orders = 20
	srv, c := parkedForHandBack(t, orders)
	var leases []*queue.Lease
	for range orders {
		leases = append(leases, lease(t, c))
	}
	for _, l := range leases {
		l.HandBack(ctxT(t))
	}
	srv.Restart() // at once: nothing else waits for the naks to arrive
	seen := map[string]bool{}
	for len(seen) < orders {
		seen[lease(t, c).Message().Ticket] = true
	}
}

// A hand-back whose context is done already (a stopping caller's) still hands the
// order back: the nak is sent without waiting for its answer.
func TestHandBackDoneContext(t *testing.T) {
	_, c := parkedForHandBack(t, 1)
	l := lease(t, c)
	done, cancel := context.WithCancel(context.Background())
	cancel()
	l.HandBack(done)
	if got := lease(t, c).Message().Ticket; got != l.Message().Ticket {
		t.Fatalf("ticket %s came, want %s", got, l.Message().Ticket)
	}
}

// TestStaleLeaseSendsNoNak: a lease held past its ack wait, whose order the server has
// handed out again, must not hand it back: JetStream applies a nak to the message's
// current delivery, so the order would go out a third time while the second lease
// still holds it.
func TestStaleLeaseSendsNoNak(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	const ackWait = 2 * time.Second
	for _, tc := range []struct {
		name   string
		settle func(l *queue.Lease)
	}{
		{"hand back", func(l *queue.Lease) { l.HandBack(ctx) }},
		{"release", func(l *queue.Lease) { l.Release(0) }},
		{"retry", func(l *queue.Lease) {
			if err := l.Retry(ctx, 0, "503"); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := strings.ReplaceAll(tc.name, " ", "-")
			c := consumerWithOrder(t, s, name, ackWait)
			first := lease(t, c)
			if err := first.Load(ctx); err != nil {
				t.Fatal(err)
			}
			// The server's redelivery, once first's ack wait ran out, to the dispatcher
			// that took the queue over.
			q := queueOf(t, s, name)
			other, second := redelivered(t, q, c, withAckWait(ackWait))
			expectNoThirdDelivery(t, q, other, first, second, tc.settle)
			if err := second.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if err := second.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestLeaseExtend: a delivery about to start gets its whole time within the ack wait,
// and a lease that went stale before it is not delivered.
func TestLeaseExtend(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	t.Run("enough left", func(t *testing.T) {
		c := consumerWithOrder(t, s, "enough", time.Minute)
		if l := lease(t, c); !l.Extend(ctx, 10*time.Second) {
			t.Fatal("a fresh lease with 50s to spare refused a 10s delivery")
		}
	})
	t.Run("restarted", func(t *testing.T) {
		// Each Extend restarts the 5s ack wait; 7s later the order has not come again.
		c := consumerWithOrder(t, s, "restarted", 5*time.Second)
		l := lease(t, c)
		for end := time.Now().Add(7 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
			if !l.Extend(ctx, 10*time.Second) {
				t.Fatal("Extend refused a lease it had kept alive")
			}
		}
		look, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if again, err := c.Next(look); err == nil {
			t.Fatalf("%s came again while its lease was extended", again.Message().Ticket)
		} else if !errors.Is(err, queue.ErrNoMessages) {
			t.Fatal(err)
		}
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("stale", func(t *testing.T) {
		c := consumerWithOrder(t, s, "stale", 2*time.Second)
		first := lease(t, c)
		_, second := redelivered(t, queueOf(t, s, "stale"), c, withAckWait(2*time.Second)) // once first's ack wait ran out
		if first.Extend(ctx, time.Second) {
			t.Fatal("a lease whose order was handed out again may be delivered")
		}
		if err := second.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := second.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	})
}

// consumerWithOrder declares queue name on s, sets its consumer up with ackWait (a
// handle made with opts) and parks one order in it.
func consumerWithOrder(t *testing.T, s *queue.Store, name string, ackWait time.Duration, opts ...queue.ConsumerOption) *queue.Consumer {
	t.Helper()
	ctx := ctxT(t)
	q, err := s.Declare(ctx, testConfig(name))
	if err != nil {
		t.Fatal(err)
	}
	c := q.Consumer(opts...)
	if err := c.Ensure(ctx, withAckWait(ackWait)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Park(ctx, order(name, `{"id":1}`)); err != nil {
		t.Fatal(err)
	}
	return c
}

// withAckWait is the consumer configuration of these tests with ackWait.
func withAckWait(ackWait time.Duration) queue.ConsumerConfig {
	return queue.ConsumerConfig{AckWait: ackWait, PinnedTTL: 10 * time.Second, MaxInFlight: 4}
}

func queueOf(t *testing.T, s *queue.Store, name string) *queue.Queue {
	t.Helper()
	q, err := s.Queue(name)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// redelivered is the dispatcher that takes q over from c, which holds the lease of an
// order past its ack wait (c is unpinned, as the server does once c stops asking):
// its handle, set up with cfg, and its lease of the order, handed out again once the
// ack wait ran out. c itself hands out no second lease of an order it holds a lease
// of (see TestHandleHoldsItsOrders).
func redelivered(t *testing.T, q *queue.Queue, c *queue.Consumer, cfg queue.ConsumerConfig) (*queue.Consumer, *queue.Lease) {
	t.Helper()
	ctx := ctxT(t)
	if err := c.Unpin(ctx); err != nil {
		t.Fatal(err)
	}
	other := q.Consumer()
	if err := other.Ensure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	return other, lease(t, other)
}

// handedOut is how many times the consumers of q have handed an order out, first
// deliveries and redeliveries.
func handedOut(t *testing.T, q *queue.Queue) uint64 {
	t.Helper()
	ctx := ctxT(t)
	var n uint64
	list := q.Stream().ListConsumers(ctx)
	for ci := range list.Info() {
		n += ci.Delivered.Consumer
	}
	if err := list.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHandleHoldsItsOrders: a consumer handle hands out no second lease of an order
// while the lease it handed out is not settled. The server's redelivery once that
// lease's ack wait ran out (its delivery or settlement outlasted it: a stall) is left
// as it is, and the first lease's settlement decides what happens to the order: it
// comes again after a retry or a refused Extend (the lease left as it is), never
// after Done.
func TestHandleHoldsItsOrders(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	const ackWait = time.Second
	for _, tc := range []struct {
		name   string
		settle func(t *testing.T, l *queue.Lease)
		again  bool
	}{
		{"retry", func(t *testing.T, l *queue.Lease) {
			if err := l.Retry(ctx, 0, "503"); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"extend refused", func(t *testing.T, l *queue.Lease) {
			if l.Extend(ctx, time.Second) {
				t.Fatal("Extend kept a lease whose order was handed out again")
			}
		}, true},
		{"done", func(t *testing.T, l *queue.Lease) {
			if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
				t.Fatal(err)
			}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "held-" + strings.ReplaceAll(tc.name, " ", "-")
			var logs bytes.Buffer // the handle logs on the goroutine of Next
			c := consumerWithOrder(t, s, name, ackWait, queue.WithConsumerLogger(slog.New(slog.NewTextHandler(&logs, nil))))
			q := queueOf(t, s, name)
			first := lease(t, c)
			if err := first.Load(ctx); err != nil {
				t.Fatal(err)
			}
			// Ask until the server has handed the order out again to c (it holds the
			// pin) and c said it held it, each pull lasting several ack waits.
			deadline := time.Now().Add(30 * time.Second)
			for !strings.Contains(logs.String(), "came back while this dispatcher still holds it") {
				if time.Now().After(deadline) {
					t.Fatalf("the order was not handed out again after its ack wait, or not held; the log:\n%s", logs.String())
				}
				look, cancel := context.WithTimeout(ctx, 5*ackWait)
				l, err := c.Next(look)
				cancel()
				switch {
				case err == nil:
					t.Fatalf("the handle gave out a second lease of %s while it held the first", l.Message().Ticket)
				case !errors.Is(err, queue.ErrNoMessages):
					t.Fatal(err)
				}
			}
			tc.settle(t, first)
			if !tc.again {
				if depth, err := q.Depth(ctx); err != nil || depth != 0 {
					t.Fatalf("after Done the queue holds %d orders (%v), want none", depth, err)
				}
				return
			}
			again := lease(t, c)
			if again.Message().Ticket != first.Message().Ticket {
				t.Fatalf("got %s, want %s again", again.Message().Ticket, first.Message().Ticket)
			}
			if err := again.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if err := again.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestEverySettlementLetsTheTicketGo: whatever settles a lease, its handle holds the
// ticket no more (else a redelivery would never be handed out by it again, and the
// handle would keep an entry per order it ever delivered).
func TestEverySettlementLetsTheTicketGo(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	for _, tc := range []struct {
		name   string
		settle func(l *queue.Lease) error
	}{
		{"done", func(l *queue.Lease) error { return l.Done(ctx, &queue.Result{StatusCode: 200}) }},
		{"fail", func(l *queue.Lease) error { return l.Fail(ctx, &queue.Result{StatusCode: 400}, "400") }},
		{"dead", func(l *queue.Lease) error { return l.Dead(ctx, "too many attempts", time.Second) }},
		{"retry", func(l *queue.Lease) error { return l.Retry(ctx, time.Minute, "503") }},
		{"throttle", func(l *queue.Lease) error { return l.Throttle(ctx, time.Now().Add(time.Minute), "429") }},
		{"release", func(l *queue.Lease) error { l.Release(time.Minute); return nil }},
		{"hand back", func(l *queue.Lease) error { l.HandBack(ctx); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := consumerWithOrder(t, s, "let-"+strings.ReplaceAll(tc.name, " ", "-"), time.Minute)
			l := lease(t, c)
			if err := l.Load(ctx); err != nil {
				t.Fatal(err)
			}
			if n := c.HeldTickets(); n != 1 {
				t.Fatalf("a handle with one lease out holds %d tickets, want 1", n)
			}
			if err := tc.settle(l); err != nil {
				t.Fatal(err)
			}
			if n := c.HeldTickets(); n != 0 {
				t.Fatalf("after %s the handle still holds %d tickets", tc.name, n)
			}
		})
	}
}

// expectNoThirdDelivery settles first, the stale lease of an order c handed out again
// as second, and fails if the server hands the order out a third time while second
// holds it (c asks meanwhile; it would hold such a lease, not give it out, so the
// consumers' counts of deliveries tell). The second delivery is kept in progress
// meanwhile; its first reset goes before the settlement, as a later one would undo
// the settlement's nak.
func expectNoThirdDelivery(t *testing.T, q *queue.Queue, c *queue.Consumer, first, second *queue.Lease, settle func(*queue.Lease)) {
	t.Helper()
	ctx := ctxT(t)
	if second.Message().Ticket != first.Message().Ticket {
		t.Fatalf("second lease is %s, want the redelivery of %s", second.Message().Ticket, first.Message().Ticket)
	}
	if err := second.InProgress(); err != nil {
		t.Fatal(err)
	}
	held, release := context.WithCancel(ctx)
	defer release()
	go func() {
		for {
			select {
			case <-held.Done():
				return
			case <-time.After(500 * time.Millisecond):
				_ = second.InProgress()
			}
		}
	}()
	before := handedOut(t, q)
	settle(first)
	look, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if third, err := c.Next(look); err == nil {
		t.Fatalf("the stale lease's settlement handed %s out a third time beside the second delivery", third.Message().Ticket)
	} else if !errors.Is(err, queue.ErrNoMessages) {
		t.Fatal(err)
	}
	if after := handedOut(t, q); after != before {
		t.Fatalf("the stale lease's settlement had the order handed out a third time beside the second delivery (%d deliveries, then %d)", before, after)
	}
}

// TestStaleLeaseServerAckWait: a lease goes stale by the consumer's ack wait on the
// server when that is shorter than the one this handle set: another replica's Ensure
// shortened it (the dispatcher reads it back with PauseState every few seconds), or the
// lease came from a lane the configuration no longer has, whose consumer keeps the ack
// wait it was created with.
func TestStaleLeaseServerAckWait(t *testing.T) {
	const short, long = 2 * time.Second, time.Minute
	t.Run("another replica", func(t *testing.T) {
		srv := natstest.Start(t)
		s := openStore(t, srv)
		ctx := ctxT(t)
		q, err := s.Declare(ctx, testConfig("replica"))
		if err != nil {
			t.Fatal(err)
		}
		c := q.Consumer()
		if err := c.Ensure(ctx, withAckWait(long)); err != nil {
			t.Fatal(err)
		}
		if err := q.Consumer().Ensure(ctx, withAckWait(short)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.PauseState(ctx); err != nil { // as the dispatcher does every 2s
			t.Fatal(err)
		}
		if _, err := s.Park(ctx, order("replica", `{"id":1}`)); err != nil {
			t.Fatal(err)
		}
		first := lease(t, c)
		other, second := redelivered(t, q, c, withAckWait(short))
		expectNoThirdDelivery(t, q, other, first, second, func(l *queue.Lease) { l.Release(0) })
	})
	t.Run("leftover lane", func(t *testing.T) {
		srv := natstest.Start(t)
		cfg := testConfig("left")
		cfg.FairBy = "header:X-Tenant"
		cfg.FairLanes = 4
		s := openStore(t, srv, cfg)
		ctx := ctxT(t)
		q, err := s.Queue("left")
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Consumer().Ensure(ctx, queue.ConsumerConfig{AckWait: short, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
			t.Fatal(err)
		}
		tenant := ""
		for i := range 100 {
			tn := fmt.Sprintf("tenant-%d", i)
			if l := s.LaneFor(cfg, "", tn); l == "p0t2" || l == "p0t3" {
				tenant = tn
				break
			}
		}
		if tenant == "" {
			t.Fatal("no tenant in lane t2 or t3")
		}
		parkAs(t, s, "left", tenant, "", "left0")
		cfg.FairLanes = 2 // lanes t2 and t3 stay until drained, with their ack wait
		if q, err = s.Declare(ctx, cfg); err != nil {
			t.Fatal(err)
		}
		c := q.Consumer()
		if err := c.Ensure(ctx, withAckWait(long)); err != nil {
			t.Fatal(err)
		}
		first := lease(t, c)
		other, second := redelivered(t, q, c, withAckWait(long))
		expectNoThirdDelivery(t, q, other, first, second, func(l *queue.Lease) { l.Release(0) })
	})
}

// TestLeaseAfterLongerAckWait: a handle whose Ensure lengthened the ack wait judges its
// leases by the new one, not by the one its handle cached before the update, so a lease
// held past the old ack wait still hands its order back.
func TestLeaseAfterLongerAckWait(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv)
	ctx := ctxT(t)
	q, err := s.Declare(ctx, testConfig("longer"))
	if err != nil {
		t.Fatal(err)
	}
	c := q.Consumer()
	if err := c.Ensure(ctx, queue.ConsumerConfig{AckWait: time.Second, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
		t.Fatal(err)
	}
	if err := c.Ensure(ctx, queue.ConsumerConfig{AckWait: 10 * time.Minute, PinnedTTL: 10 * time.Second, MaxInFlight: 4}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Park(ctx, order("longer", `{"id":1}`)); err != nil {
		t.Fatal(err)
	}
	first := lease(t, c)
	time.Sleep(1500 * time.Millisecond) // past the old ack wait
	first.Release(0)
	if again := lease(t, c); again.Message().Ticket != first.Message().Ticket { // waits at most 30s, not 10m
		t.Fatalf("got %s, want %s back", again.Message().Ticket, first.Message().Ticket)
	}
}

// Reclaim removes what a dispatch consumer acknowledged and the stream still holds
// (JetStream does not retry a removal that failed on a full disk, not even at its next
// start), and nothing else. A full disk cannot be made here, so the test makes the same
// state: the stream's messages are put back on disk as they were before the orders
// were acknowledged, while the consumer keeps its ack floor.
func TestReclaimAcknowledgedOrders(t *testing.T) {
	srv := natstest.Start(t)
	s := openStore(t, srv, testConfig("orders"))
	q, _ := s.Queue("orders")
	ctx := ctxT(t)
	c := consumer(t, s, "orders")
	reclaim := func(want uint64) {
		t.Helper()
		if n, err := c.Reclaim(ctx); err != nil || n != want {
			t.Fatalf("reclaimed %d (%v), want %d", n, err, want)
		}
	}
	for i := range 3 {
		if _, err := s.Park(ctx, order("orders", fmt.Sprintf(`{"id":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	reclaim(0)
	msgs := filepath.Join(srv.Dir, "jetstream", "$G", "streams", queue.StreamName("orders"), "msgs")
	kept := filepath.Join(t.TempDir(), "msgs")
	srv.Shutdown()
	if err := os.CopyFS(kept, os.DirFS(msgs)); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	for range 3 {
		l := lease(t, c)
		if err := l.Load(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
			t.Fatal(err)
		}
	}
	srv.Shutdown()
	if err := os.RemoveAll(msgs); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(msgs, os.DirFS(kept)); err != nil {
		t.Fatal(err)
	}
	srv.Restart()
	if d, err := q.Depth(ctx); err != nil || d != 3 {
		t.Fatalf("depth %d (%v) with the acknowledged orders back on disk, want 3", d, err)
	}
	for i := range 2 {
		if _, err := s.Park(ctx, order("orders", fmt.Sprintf(`{"after":%d}`, i))); err != nil {
			t.Fatal(err)
		}
	}
	held := lease(t, c) // one of the two new orders, handed out and not acknowledged
	reclaim(3)
	reclaim(0)
	if d, err := q.Depth(ctx); err != nil || d != 2 {
		t.Errorf("depth %d (%v) after reclaiming, want the 2 new orders", d, err)
	}
	held.Release(time.Millisecond)
}
