package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Errors of Consumer.Next that callers branch on.
var (
	// ErrNoMessages: no order came within the context of Next; ask again.
	ErrNoMessages = errors.New("queue: no messages")
	// ErrConsumerGone: the queue's consumer or stream was deleted; Ensure sets the
	// consumer up again (unless the queue was retired: see Queue.Retired).
	ErrConsumerGone = errors.New("queue: the consumer is gone")
)

// ConsumerOption configures a Consumer.
type ConsumerOption func(*Consumer)

// WithConsumerLogger sets the logger of a Consumer and of its leases (default: the
// store's).
func WithConsumerLogger(l *slog.Logger) ConsumerOption {
	return func(c *Consumer) {
		if l != nil {
			c.log = l
		}
	}
}

// Consumer is one dispatcher's handle on the consumer of a queue: it fetches orders as
// Leases, and pauses, unpins and inspects the consumer. Each dispatcher needs its own
// (the handle carries the pin the server gave it, and the leases it handed out). Safe
// for concurrent use.
//
// A handle hands out at most one lease of a ticket at a time: an order that comes back
// while the lease it handed out before is not settled yet is not handed out (see
// hold), so a dispatcher never delivers one order beside itself. Across handles (other
// dispatchers, after a fail-over) an order whose ack wait ran out is handed out again,
// with the same ticket and idempotency key: delivery is at least once.
type Consumer struct {
	q   *Queue
	log *slog.Logger

	// lmu guards leased: the leases this handle handed out and not settled yet, by
	// ticket (see hold and Lease.let).
	lmu    sync.Mutex
	leased map[string]*Lease

	mu      sync.Mutex
	cons    jetstream.Consumer
	pinID   string
	ackWait time.Duration // as set by Ensure
	// pinTTL is the pinned TTL set by Ensure; pulled is when the latest pull request
	// that brought an order was sent (see Lease.Held).
	pinTTL time.Duration
	pulled time.Time

	// A laned queue's scheduler and this handle's lead of the queue (see sched.go).
	id      string
	smu     sync.Mutex
	sched   *scheduler
	leadRev uint64
	leadAt  time.Time
	leadTTL time.Duration
	// leadSent: when the request that last took or renewed the lead was sent; the
	// lead's key expires a leadTTL after the server wrote it, which is later.
	leadSent time.Time
	// heldSince: since when Ensure has left lanes to the queue's consumer (see
	// heldLanes, holdAtMost); zero while it leaves none.
	heldSince time.Time
}

// Consumer returns a handle on the queue's consumer for one dispatcher. It does no
// I/O: Ensure creates the consumer on the server.
func (q *Queue) Consumer(opts ...ConsumerOption) *Consumer {
	c := &Consumer{q: q, log: q.store.log, id: newHandleID(), leased: map[string]*Lease{}}
	for _, opt := range opts {
		opt(c)
	}
	if c.log == nil {
		c.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Ensure creates the consumer or updates it to cfg, keeping a pause set on the server,
// and in a laned queue the consumers of its lanes (see ensureLanes). The handle stays
// the one it has unless the consumer was (re)created: it carries this dispatcher's
// pin, and a fresh handle would lose the pin for a pinned TTL.
//
// The queue's consumer never takes a subject more by an update: an update keeps the
// consumer's ack floor and delivered sequence, and an order waiting on the added
// subject below them would be delivered never. When its filter must grow (the lanes
// went: it takes every ready subject again; a lane lost its consumer; an earlier
// sluice's laned consumer took the unlaned orders alone) it is made anew, which starts
// from the first order; the orders it had handed out come again (Load drops those
// final meanwhile). It is created, never updated, then: a consumer another replica
// made between the delete and here (one with another configuration, which may have
// delivered since) would keep its ack floor through an update; Ensure fails and is
// tried again. A lane is taken from it (a shrinking update) before the lane's consumer
// is created, since work-queue retention refuses two consumers of one subject; a
// replica that looks in between sees the lane taken by neither and makes the queue's
// consumer anew with it, and the lane's creation fails and is tried again. Replicas
// with different lanes configured converge: every lane either has a consumer, kept
// once made, or is the queue's consumer's. A lane of the configuration whose orders
// the queue's consumer holds (handed out, not acknowledged) stays the queue
// consumer's until they are settled, and is given its consumer by a later Ensure
// (see heldLanes, LanesHeld), or by the first one past MaxLaneHold (see holdAtMost).
func (c *Consumer) Ensure(ctx context.Context, cfg ConsumerConfig) error {
	if cfg.AckWait <= 0 || cfg.PinnedTTL <= 0 || cfg.MaxInFlight < 1 {
		return fmt.Errorf("%w: consumer of %q: ack wait, pinned TTL and max in flight must be positive", ErrInvalidConfig, c.q.name)
	}
	qcfg := c.q.Config()
	laned := qcfg.Laned()
	existing, err := c.laneConsumers(ctx)
	if err != nil {
		return err
	}
	cons, err := jsproto.AskAgain(ctx, func(ctx context.Context) (jetstream.Consumer, error) { return c.q.stream.Consumer(ctx, ConsumerName) })
	if err != nil {
		cons = nil
	}
	served, held, serr := c.served(ctx, cfg, qcfg, cons, existing)
	switch {
	case serr != nil:
		return serr
	case err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound):
		return unavailable("consumer of "+c.q.name, err)
	}
	cons, created, err := c.ensureDispatch(ctx, cons, cfg.jetstream(laned, c.q.name, served), laned)
	if err != nil {
		return err
	}
	if err := c.ensureLanes(ctx, cfg, qcfg, cons, existing, held); err != nil {
		return err
	}
	return c.keep(ctx, cfg, cons, created)
}

// served returns the lanes (tokens) of a laned queue that have a consumer of their
// own or get one now, and those of the configuration left to the queue's consumer
// (cons, nil when there is none) because it holds orders of theirs (see heldLanes,
// holdAtMost). In a queue without lanes it deletes the lanes' consumers first: the
// queue's consumer takes every subject again, which work-queue retention refuses
// while another consumer filters some; their orders are then the queue consumer's.
func (c *Consumer) served(ctx context.Context, cfg ConsumerConfig, qcfg queueconfig.Config, cons jetstream.Consumer,
	existing map[string]jetstream.ConsumerConfig) (served, held map[string]bool, err error) {
	served, held = map[string]bool{}, map[string]bool{}
	laned := qcfg.Laned()
	if laned && cons != nil {
		if held, err = c.heldLanes(ctx, cons.CachedInfo(), lanesOf(qcfg), existing); err != nil {
			return nil, nil, err
		}
	}
	held = c.holdAtMost(held, cmp.Or(cfg.MaxLaneHold, DefaultMaxLaneHold))
	if !laned {
		for name := range existing {
			if err := c.q.stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return nil, nil, unavailable("delete lane consumer of "+c.q.name, err)
			}
		}
		return served, held, nil
	}
	for name := range existing {
		served[strings.TrimPrefix(name, ConsumerName+"_")] = true
	}
	for _, l := range lanesOf(qcfg) {
		served[l.token()] = !held[l.token()]
	}
	return served, held, nil
}

// ensureDispatch creates the queue's consumer as want when there is none (cons nil),
// makes it anew when its filter must grow (see Ensure), or updates it (keeping a pause
// set on the server). created says that the handle returned is a new consumer's.
func (c *Consumer) ensureDispatch(ctx context.Context, cons jetstream.Consumer, want jetstream.ConsumerConfig,
	laned bool) (_ jetstream.Consumer, created bool, _ error) {
	if cons == nil {
		cons, err := c.createDispatch(ctx, want)
		return cons, true, err
	}
	have := cons.CachedInfo().Config
	want.PauseUntil = have.PauseUntil
	anew := grows(c.q.name, filtersOf(have), filtersOf(want))
	if !anew && !laned && slices.Equal(filtersOf(have), filtersOf(want)) {
		// Widened by an update already (earlier sluices did so when the lanes went):
		// an order of a lane at or below its ack floor was never delivered by it.
		anew = c.floorPassedLanes(ctx, cons.CachedInfo().AckFloor.Stream)
	}
	switch {
	case anew:
		if err := c.q.stream.DeleteConsumer(ctx, ConsumerName); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, false, unavailable("delete consumer of "+c.q.name, err)
		}
		cons, err := c.createDispatch(ctx, want)
		return cons, true, err
	case sameConsumer(have, want):
	default:
		if have.AckWait != want.AckWait {
			// Every dispatcher sets the ack wait it was given: the last one to start
			// decides for all, which an operator should hear of.
			c.log.Warn("changing the ack wait of the queue's consumer: dispatchers of one queue should share --ack-wait, or the last one to start sets it for all",
				"queue", c.q.name, "was", have.AckWait, "now", want.AckWait)
		}
		if _, err := c.q.stream.UpdateConsumer(ctx, want); err != nil {
			return nil, false, unavailable("update consumer of "+c.q.name, err)
		}
	}
	return cons, false, nil
}

// keep makes cons this Consumer's handle when it has none or cons is a new consumer's
// (created), and keeps cfg's ack wait and pinned TTL. The handle kept reads the
// consumer's config back: leases go stale by the ack wait it caches (see lease), and
// a handle kept from before, or one read before an update, caches an older one.
func (c *Consumer) keep(ctx context.Context, cfg ConsumerConfig, cons jetstream.Consumer, created bool) error {
	c.mu.Lock()
	h := c.cons
	c.mu.Unlock()
	if h == nil || created {
		h = cons
	}
	if _, err := h.Info(ctx); err != nil {
		return unavailable("consumer of "+c.q.name, err)
	}
	c.mu.Lock()
	if c.cons == nil || created {
		c.cons = cons
	}
	c.ackWait, c.pinTTL = cfg.AckWait, cfg.PinnedTTL
	c.mu.Unlock()
	return nil
}

// heldLanes returns the lanes (tokens) of the configuration without a consumer of
// their own that the queue's consumer (ci) takes and holds orders of: handed out and
// not acknowledged yet (in flight, or handed back for a retry). Such a lane stays the
// queue's consumer's: it keeps redelivering what it handed out whatever its filter,
// and the lane's consumer, which starts from the lane's first order, would hand those
// orders out beside it. A later Ensure gives the lane its consumer (see LanesHeld).
func (c *Consumer) heldLanes(ctx context.Context, ci *jetstream.ConsumerInfo, lanes []lane,
	existing map[string]jetstream.ConsumerConfig) (map[string]bool, error) {
	held := map[string]bool{}
	if ci == nil || ci.NumAckPending == 0 {
		return held, nil
	}
	have := filtersOf(ci.Config)
	all := slices.Contains(have, readyFilter(c.q.name))
	for _, l := range lanes {
		subject := ReadySubject(c.q.name, l.token(), "*")
		if _, ok := existing[l.consumer()]; ok || !all && !slices.Contains(have, subject) {
			continue
		}
		// Above the ack floor and handed out, still stored: not acknowledged yet.
		m, err := c.q.store.readMsg(ctx, c.q.stream, jsproto.MsgQuery{Seq: ci.AckFloor.Stream + 1, Next: subject})
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
		case err != nil:
			return nil, unavailable("orders of lane "+l.token()+" of "+c.q.name, err)
		case m.Sequence <= ci.Delivered.Stream:
			held[l.token()] = true
		}
	}
	return held, nil
}

// holdAtMost returns held, or none once lanes have been held for longer than limit:
// on a queue whose orders of those lanes are always some in flight the lanes would
// never get their consumers (and their fairness). The orders the queue's consumer
// holds of them then, it may deliver beside the lanes' consumers, with the same
// Idempotency-Key: said in a warning.
func (c *Consumer) holdAtMost(held map[string]bool, limit time.Duration) map[string]bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	if len(held) == 0 {
		c.heldSince = time.Time{}
		return held
	}
	if c.heldSince.IsZero() {
		c.heldSince = time.Now()
	}
	if since := time.Since(c.heldSince); since > limit {
		c.log.Warn("giving lanes their consumers although the queue's consumer still holds orders of theirs: those may be delivered twice, with the same Idempotency-Key",
			"queue", c.q.name, "lanes", slices.Sorted(maps.Keys(held)), "held_for", since.Round(time.Second))
		c.heldSince = time.Time{}
		return map[string]bool{}
	}
	return held
}

// LanesHeld reports whether the last Ensure left lanes of the configuration without
// their consumers because the queue's consumer held orders of theirs (see heldLanes):
// their orders are drained with the unlaned ones meanwhile, and Ensure, called again
// once those are settled, gives the lanes their consumers.
func (c *Consumer) LanesHeld() bool {
	c.smu.Lock()
	defer c.smu.Unlock()
	return !c.heldSince.IsZero()
}

// createDispatch creates the queue's consumer (never updating one of that name: see
// Ensure) and returns a handle on it.
func (c *Consumer) createDispatch(ctx context.Context, want jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if _, err := c.q.stream.CreateConsumer(ctx, want); err != nil {
		return nil, unavailable("create consumer of "+c.q.name, err)
	}
	cons, err := c.q.stream.Consumer(ctx, ConsumerName)
	if err != nil {
		return nil, unavailable("consumer of "+c.q.name, err)
	}
	return cons, nil
}

// floorPassedLanes reports whether an order of a lane waits at or below floor, the ack
// floor of the queue's consumer taking every ready subject. Such an order was never
// delivered by it, unless JetStream failed to remove it once acknowledged (a full
// disk): either way the consumer made anew delivers it (Load drops one whose record is
// final). A lookup that fails says no: the next Ensure looks again.
func (c *Consumer) floorPassedLanes(ctx context.Context, floor uint64) bool {
	if floor == 0 {
		return false
	}
	first, err := c.q.store.readMsg(ctx, c.q.stream, jsproto.MsgQuery{Seq: 1, Next: ReadySubject(c.q.name, "*", "*")})
	if err != nil {
		if !errors.Is(err, jetstream.ErrMsgNotFound) {
			c.log.Debug("cannot look for laned orders below the consumer's ack floor", "queue", c.q.name, "err", err)
		}
		return false
	}
	return first.Sequence <= floor
}

func (c *Consumer) handle() jetstream.Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cons
}

// Next asks the server for one order (a pull request of batch 1 that lasts as long as
// ctx) and returns it as a Lease. A message that is not a parked request is terminated
// here; the redelivery of an order whose lease from this handle is not settled yet is
// left as it is (see hold), and counts as nothing come. In a laned queue the scheduler
// picks the lane the order comes from, in the one dispatcher that leads the queue (see
// sched.go). Errors: ErrNoMessages (nothing came: ask again), ErrConsumerGone (set the
// consumer up again), ErrUnavailable.
func (c *Consumer) Next(ctx context.Context) (*Lease, error) {
	c.smu.Lock()
	laned := c.sched != nil
	c.smu.Unlock()
	if laned {
		return c.nextLaned(ctx)
	}
	cons := c.handle()
	if cons == nil {
		return nil, fmt.Errorf("%w: not set up (Ensure)", ErrConsumerGone)
	}
	sent := time.Now()
	batch, err := cons.Fetch(1, jetstream.FetchContext(ctx), jetstream.FetchPriorityGroup(PriorityGroup))
	if err == nil {
		var l *Lease
		for jm := range batch.Messages() {
			l = c.lease(jm, serverAckWait(cons))
		}
		if l != nil {
			// The server took this request as the pinned client's (it has no other
			// to hand an order to): the pin holds for a pinned TTL from its arrival.
			c.mu.Lock()
			if sent.After(c.pulled) {
				c.pulled = sent
			}
			c.mu.Unlock()
			return l, nil
		}
		err = batch.Error()
	}
	switch {
	case err == nil, ctx.Err() != nil, errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, jetstream.ErrNoMessages), errors.Is(err, nats.ErrTimeout),
		// Another dispatcher holds the queue now; the handle asks again without a pin.
		errors.Is(err, jetstream.ErrPinIDMismatch):
		if err == nil {
			return nil, ErrNoMessages
		}
		return nil, fmt.Errorf("%w: %w", ErrNoMessages, err)
	case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted),
		errors.Is(err, jetstream.ErrStreamNotFound):
		return nil, fmt.Errorf("%w: %w", ErrConsumerGone, err)
	}
	return nil, unavailable("fetch from "+c.q.name, err)
}

// serverAckWait is the ack wait of a consumer as the server last reported it to this
// handle (0: unknown). The dispatcher's PauseState refreshes the queue consumer's every
// few seconds; a laned queue's scheduler reads its lanes' with every refresh.
func serverAckWait(cons jetstream.Consumer) time.Duration {
	if cons == nil {
		return 0
	}
	if ci := cons.CachedInfo(); ci != nil {
		return ci.Config.AckWait
	}
	return 0
}

// lease decodes a fetched message; nil when it is not a parked request (terminated),
// or when this handle holds an unsettled lease of its ticket (left as it is: see hold).
// serverAck is the ack wait the server last reported for the consumer it came from (0:
// unknown): the lease goes stale by the shorter of it and this handle's, since another
// replica's Ensure may have shortened it on the server, and a lane the configuration
// no longer has keeps the ack wait it was created with.
func (c *Consumer) lease(jm jetstream.Msg, serverAck time.Duration) *Lease {
	m, err := Decode(jm)
	if err != nil {
		c.log.Error("terminating a message that is not a parked request", "err", err)
		_ = jm.TermWithReason("not a sluice message")
		return nil
	}
	c.mu.Lock()
	if pin := jsproto.PinID(jm); pin != "" {
		c.pinID = pin
	}
	ackWait := c.ackWait
	c.mu.Unlock()
	if serverAck > 0 && (ackWait <= 0 || serverAck < ackWait) {
		ackWait = serverAck
	}
	now := time.Now()
	l := &Lease{c: c, s: c.q.store, jm: jm, m: m, verr: c.q.store.Verify(m), fetched: now, ackWait: ackWait, stale: staleAt(now, ackWait)}
	// A forged message is dead-lettered without delivery: it is never delivered beside
	// its ticket's order, so it is not held back behind it.
	if l.verr != nil {
		return l
	}
	if prev, ok := c.hold(l); !ok {
		c.log.Warn("an order came back while this dispatcher still holds it (its delivery and settlement outlasted the ack wait: a stall, or an ack wait too short); not delivering it beside itself",
			"ticket", m.Ticket, "seq", m.Seq, "held_for", time.Since(prev.fetched).Round(time.Millisecond), "ack_wait", ackWait)
		return nil
	}
	return l
}

// hold makes l the lease of its ticket that this handle handed out; false, with the
// earlier lease, when that one is not settled yet (Lease.let). l's message is then a
// redelivery of the order whose delivery is under way here, or settling (its lease
// outlived the ack wait), or another copy of its ticket (a re-queued dead letter). It
// is left as it is, neither acknowledged nor handed back: JetStream applies either to
// the message's latest delivery, which would settle the order, or cut short the
// delivery under way, by the earlier lease's outcome. That outcome settles the order
// (an acknowledgement or termination removes it; a retry's nak hands it out again
// when due), and an earlier lease that leaves the order as it is (Lease.Extend) lets
// the server hand it out again after the ack wait; so does a copy with a sequence of
// its own, which Load then acknowledges unseen once its ticket is final.
func (c *Consumer) hold(l *Lease) (prev *Lease, ok bool) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if prev := c.leased[l.m.Ticket]; prev != nil {
		return prev, false
	}
	c.leased[l.m.Ticket] = l
	return nil, true
}

// let ends l's hold on its ticket (see hold); nothing when l no longer holds it.
func (c *Consumer) let(l *Lease) {
	c.lmu.Lock()
	defer c.lmu.Unlock()
	if c.leased[l.m.Ticket] == l {
		delete(c.leased, l.m.Ticket)
	}
}

// PauseState reports whether the consumer is paused on the server, and for how much
// longer.
func (c *Consumer) PauseState(ctx context.Context) (paused bool, remaining time.Duration, err error) {
	cons := c.handle()
	if cons == nil {
		return false, 0, fmt.Errorf("%w: not set up (Ensure)", ErrConsumerGone)
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return false, 0, unavailable("consumer of "+c.q.name, err)
	}
	return info.Paused, info.PauseRemaining, nil
}

// Pause pauses the consumer on the server until until: every replica stops fetching.
// Unlike Queue.Pause it logs nothing (a dispatcher pauses for a downstream's reasons
// and says so itself).
func (c *Consumer) Pause(ctx context.Context, until time.Time) error {
	if _, err := c.q.stream.PauseConsumer(ctx, ConsumerName, until); err != nil {
		return c.q.consumerError("pause", err)
	}
	return nil
}

// Unpin releases the queue's pin if this handle holds it, so that another replica
// takes over without waiting for the pinned TTL. Nothing to do is not an error.
func (c *Consumer) Unpin(ctx context.Context) error {
	c.releaseLead(ctx)
	c.mu.Lock()
	cons, pin := c.cons, c.pinID
	c.mu.Unlock()
	if cons == nil || pin == "" || c.q.store.nc.IsClosed() {
		return nil
	}
	info, err := cons.Info(ctx)
	if err != nil {
		return unavailable("consumer of "+c.q.name, err)
	}
	for _, g := range info.PriorityGroups {
		if g.Group == PriorityGroup && g.PinnedClientID == pin {
			if err := c.q.stream.UnpinConsumer(ctx, ConsumerName, g.Group); err != nil {
				return unavailable("unpin consumer of "+c.q.name, err)
			}
		}
	}
	return nil
}

// Flush waits until the settlements sent so far (a retry's nak, a term) reached the
// server, so that they are on their way before the connection or the embedded server
// stops (HandBack waits for its own). A closed connection has nothing to flush.
func (c *Consumer) Flush(ctx context.Context) error {
	nc := c.q.store.nc
	if nc.IsClosed() {
		return nil
	}
	return nc.FlushWithContext(ctx)
}

// heldUntil is until when this handle has the queue to itself (see Lease.Held); zero:
// not known (no pinned TTL set by Ensure yet).
func (c *Consumer) heldUntil() time.Time {
	c.smu.Lock()
	laned, leadSent, leadTTL := c.sched != nil, c.leadSent, c.leadTTL
	c.smu.Unlock()
	if laned {
		if leadTTL <= 0 {
			return time.Time{}
		}
		return leadSent.Add(leadTTL) // long past when not leading (leadSent zero)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.pinTTL <= 0 || c.pulled.IsZero() {
		return time.Time{}
	}
	return c.pulled.Add(c.pinTTL)
}
