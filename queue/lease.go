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

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Errors of Consumer.Next and of the Lease methods that callers branch on.
var (
	// ErrNoMessages: no order came within the context of Next; ask again.
	ErrNoMessages = errors.New("queue: no messages")
	// ErrConsumerGone: the queue's consumer or stream was deleted; Ensure sets the
	// consumer up again (unless the queue was retired: see Queue.Retired).
	ErrConsumerGone = errors.New("queue: the consumer is gone")
	// ErrFinal: the ticket is final already; Lease.Load acknowledged its message.
	ErrFinal = errors.New("queue: the ticket is final already")
	// ErrNotLoaded: a Lease was settled before Load read its record; nothing was done.
	ErrNotLoaded = errors.New("queue: lease settled before Load")
)

// ConsumerConfig sets up the durable pull consumer that every dispatcher replica of a
// queue shares (one pinned priority group: the server hands orders to one replica at a
// time, and to another one when it falls silent for PinnedTTL).
type ConsumerConfig struct {
	// AckWait: how long an order handed to a dispatcher that went silent stays with it.
	AckWait time.Duration
	// PinnedTTL: how long the queue stays pinned to a dispatcher that stopped asking.
	PinnedTTL time.Duration
	// MaxInFlight caps the orders handed out and not settled, across every replica
	// (in a laned queue: of each lane).
	MaxInFlight int
	// LaneRefresh is how often the scheduler of a laned queue re-reads the depths of
	// its lanes (default DefaultLaneRefresh): an order parked in a lane that had none
	// is seen within it. Each refresh lists the queue's consumers.
	LaneRefresh time.Duration
	// MaxLaneHold bounds how long a lane of the configuration is left to the queue's
	// consumer because it holds orders of the lane (default DefaultMaxLaneHold; see
	// Consumer.Ensure): on a busy queue it nearly always does.
	MaxLaneHold time.Duration
}

// DefaultMaxLaneHold is ConsumerConfig.MaxLaneHold's default.
const DefaultMaxLaneHold = 5 * time.Minute

// jetstream is the configuration of the queue's consumer. In a laned queue it takes
// the unlaned orders (ReadySubject without a lane) and every lane whose token served
// does not name (see dispatchFilters), and it is not pinned: the lead (see
// Consumer.leadLocked) keeps the queue with one dispatcher.
func (c ConsumerConfig) jetstream(laned bool, queue string, served map[string]bool) jetstream.ConsumerConfig {
	if laned {
		cc := c.lane(lane{}, queue)
		cc.Durable, cc.Description = ConsumerName, "sluice dispatchers"
		cc.FilterSubject, cc.FilterSubjects = "", dispatchFilters(queue, served)
		return cc
	}
	return jetstream.ConsumerConfig{
		Durable:     ConsumerName,
		Description: "sluice dispatchers",
		// Every ready subject, laned ones too (a queue that was laned), never a
		// scheduled order's schedule message.
		FilterSubject:  readyFilter(queue),
		AckPolicy:      jetstream.AckExplicitPolicy,
		AckWait:        c.AckWait,
		MaxDeliver:     -1,
		MaxAckPending:  c.MaxInFlight,
		DeliverPolicy:  jetstream.DeliverAllPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned,
		PriorityGroups: []string{PriorityGroup},
		PinnedTTL:      c.PinnedTTL,
	}
}

// dispatchFilters returns the filters of the queue's consumer in a laned queue: the
// unlaned orders, and every valid lane (queueconfig.MaxPriorityLevels ×
// queueconfig.MaxFairLanes of them) whose token served does not name, served being
// the lanes that have a consumer of their own or are about to get one. An order
// waits in such a lane when its lane was fixed under another configuration: a dead
// letter re-queued into its old lane (the lane is signed), a scheduled order whose
// target was set when it was parked, an order parked by a replica still on another
// configuration. Work-queue retention refuses two consumers filtering the same
// subject, so every valid lane is then taken by exactly one consumer.
func dispatchFilters(queue string, served map[string]bool) []string {
	out := []string{ReadySubject(queue, "", "*")}
	for lv := range queueconfig.MaxPriorityLevels {
		for tn := range queueconfig.MaxFairLanes {
			if tok := (lane{lv, tn}).token(); !served[tok] {
				out = append(out, ReadySubject(queue, tok, "*"))
			}
		}
	}
	return out
}

// filtersOf returns the subject filters of a consumer, sorted.
func filtersOf(cc jetstream.ConsumerConfig) []string {
	var out []string
	if cc.FilterSubject != "" {
		out = append(out, cc.FilterSubject)
	}
	return slices.Sorted(slices.Values(append(out, cc.FilterSubjects...)))
}

// grows reports whether a consumer of queue filtered on have would take a subject it
// does not take now once filtered on want.
func grows(queue string, have, want []string) bool {
	all := slices.Contains(have, readyFilter(queue))
	for _, w := range want {
		if !slices.Contains(have, w) && !(all && strings.HasPrefix(w, "sluice.q."+queue+".")) {
			return true
		}
	}
	return false
}

// lane is the configuration of a lane's consumer.
func (c ConsumerConfig) lane(l lane, queue string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       l.consumer(),
		Description:   "sluice dispatchers, lane " + l.token(),
		FilterSubject: ReadySubject(queue, l.token(), "*"),
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       c.AckWait,
		MaxDeliver:    -1,
		MaxAckPending: c.MaxInFlight,
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
}

func sameConsumer(a, b jetstream.ConsumerConfig) bool {
	return slices.Equal(filtersOf(a), filtersOf(b)) && a.AckPolicy == b.AckPolicy && a.AckWait == b.AckWait && a.MaxDeliver == b.MaxDeliver &&
		a.MaxAckPending == b.MaxAckPending && a.PriorityPolicy == b.PriorityPolicy &&
		slices.Equal(a.PriorityGroups, b.PriorityGroups) && a.PinnedTTL == b.PinnedTTL
}

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
// (the handle carries the pin the server gave it). Safe for concurrent use.
type Consumer struct {
	q   *Queue
	log *slog.Logger

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
	c := &Consumer{q: q, log: q.store.log, id: newHandleID()}
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
	stream := c.q.stream
	existing, err := c.laneConsumers(ctx)
	if err != nil {
		return err
	}
	cons, err := stream.Consumer(ctx, ConsumerName)
	served, held := map[string]bool{}, map[string]bool{}
	if laned && err == nil {
		if held, err = c.heldLanes(ctx, cons.CachedInfo(), lanesOf(qcfg), existing); err != nil {
			return err
		}
	}
	held = c.holdAtMost(held, cmp.Or(cfg.MaxLaneHold, DefaultMaxLaneHold))
	if laned {
		for name := range existing {
			served[strings.TrimPrefix(name, ConsumerName+"_")] = true
		}
		for _, l := range lanesOf(qcfg) {
			served[l.token()] = !held[l.token()]
		}
	} else {
		// Lanes first: the queue's consumer takes every subject again, which work-queue
		// retention refuses while another consumer filters some. Their orders are then
		// the queue consumer's.
		for name := range existing {
			if err := stream.DeleteConsumer(ctx, name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return unavailable("delete lane consumer of "+c.q.name, err)
			}
		}
	}
	want := cfg.jetstream(laned, c.q.name, served)
	created := err != nil
	switch {
	case err == nil:
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
			if err := stream.DeleteConsumer(ctx, ConsumerName); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
				return unavailable("delete consumer of "+c.q.name, err)
			}
			if cons, err = c.createDispatch(ctx, want); err != nil {
				return err
			}
			created = true
		case sameConsumer(have, want):
		default:
			if have.AckWait != want.AckWait {
				// Every dispatcher sets the ack wait it was given: the last one to start
				// decides for all, which an operator should hear of.
				c.log.Warn("changing the ack wait of the queue's consumer: dispatchers of one queue should share --ack-wait, or the last one to start sets it for all",
					"queue", c.q.name, "was", have.AckWait, "now", want.AckWait)
			}
			if _, err := stream.UpdateConsumer(ctx, want); err != nil {
				return unavailable("update consumer of "+c.q.name, err)
			}
		}
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		if cons, err = c.createDispatch(ctx, want); err != nil {
			return err
		}
	default:
		return unavailable("consumer of "+c.q.name, err)
	}
	if err := c.ensureLanes(ctx, cfg, qcfg, cons, existing, held); err != nil {
		return err
	}
	// The handle kept reads the consumer's config back: leases go stale by the ack wait
	// it caches (see lease), and a handle kept from before, or one read before the
	// update above, caches an older one.
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
		m, err := c.q.store.readMsg(ctx, c.q.stream, msgQuery{seq: ci.AckFloor.Stream + 1, next: subject})
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
	first, err := c.q.store.readMsg(ctx, c.q.stream, msgQuery{seq: 1, next: ReadySubject(c.q.name, "*", "*")})
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
// here. In a laned queue the scheduler picks the lane the order comes from, in the
// one dispatcher that leads the queue (see sched.go). Errors: ErrNoMessages (nothing
// came: ask again), ErrConsumerGone (set the consumer up again), ErrUnavailable.
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

// lease decodes a fetched message; nil when it is not a parked request (terminated).
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
	if pin := jm.Headers().Get("Nats-Pin-Id"); pin != "" {
		c.pinID = pin
	}
	ackWait := c.ackWait
	c.mu.Unlock()
	if serverAck > 0 && (ackWait <= 0 || serverAck < ackWait) {
		ackWait = serverAck
	}
	return &Lease{c: c, s: c.q.store, jm: jm, m: m, verr: c.q.store.Verify(m), ackWait: ackWait, stale: staleAt(time.Now(), ackWait)}
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

// Retired reports whether the queue left the rules and its stream was deleted
// (Store.Retire): nothing is left to drain.
func (q *Queue) Retired(ctx context.Context) bool {
	if !q.Orphaned() {
		return false
	}
	return errors.Is(q.store.CheckQueue(ctx, q.name), ErrUnknownQueue)
}

// CheckQueue reports whether a queue's stream exists on the server, whether or not this
// store declared the queue (a tool such as `sluice dlq` knows no rules; dead letters of
// a retired queue stay reachable while its stream exists). Errors: ErrUnknownQueue (no
// such stream, or not a queue name), ErrUnavailable.
func (s *Store) CheckQueue(ctx context.Context, name string) error {
	if !queueconfig.ValidName(name) {
		return fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	_, err := s.js.Stream(ctx, StreamName(name))
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: there is no queue %q on this NATS (no stream %s)", ErrUnknownQueue, name, StreamName(name))
	}
	return unavailable("stream of "+name, err)
}

// Lease is an order fetched by a dispatcher, held until it settles it. Its methods
// own the ticket's state machine: each settlement writes the ticket record (kept in
// memory when JetStream refuses it: settling never waits on bookkeeping), gives the
// idempotency key of a final order its final lifetime, publishes the events on
// DoneSubject and DeadSubject, and acknowledges, hands back or terminates the message.
//
// The life of a lease: Verify (a forged order is only ever Dead), Load (the ticket's
// record), Start (the delivery starts), then one of Done, Fail, Retry, Throttle or
// Dead; Release hands an order back untouched. Load and Start settle the lease when
// they return an error; Done, Fail, Retry and Throttle need Load first (else they do
// nothing and return ErrNotLoaded). A Lease is used by one goroutine at a time.
type Lease struct {
	c    *Consumer
	s    *Store
	jm   jetstream.Msg
	m    *Message
	verr error

	rec    *Record // nil until Load
	stored bool    // rec was read from the bucket (else it is new)

	// stale is when the server may have handed the order to another dispatcher: its
	// ack wait has run out (zero: never known; see nak). Extend moves it.
	stale   time.Time
	ackWait time.Duration
}

// staleAt is when a lease fetched at fetched from a consumer with ackWait goes stale:
// a little before its ack wait runs out as counted from fetched, since the server
// counts it from the delivery, which came first.
func staleAt(fetched time.Time, ackWait time.Duration) time.Time {
	if ackWait <= 0 {
		return time.Time{}
	}
	return fetched.Add(ackWait - min(ackWait/10, time.Second))
}

// Message returns the parked order.
func (l *Lease) Message() *Message { return l.m }

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

// Held reports whether the dispatcher that fetched l still has the queue to itself for
// at least margin from now: no other dispatcher of the queue can have been handed an
// order since. The server moves a queue's pin to another dispatcher only once the
// pinned one has sent no pull request for the pinned TTL, and counts that from each
// request's arrival; so the pin holds until a pinned TTL after the sending of the
// latest pull request of this handle that brought an order, by this process's clock
// (for a laned queue: a pinned TTL after the sending of the latest renewal of its
// lead, see leadLocked). A dispatcher that was stopped for longer than that (SIGSTOP,
// a paused VM, a stall) finds Held false when it resumes, and must not start the
// delivery: another dispatcher may be delivering the queue's orders at its own pace.
// Before Ensure (no pinned TTL known) Held is true.
func (l *Lease) Held(margin time.Duration) bool {
	until := l.c.heldUntil()
	return until.IsZero() || time.Now().Add(margin).Before(until)
}

// Verify returns the order's signature check (see Store.Verify): an error wrapping
// ErrForged for an order sluice did not park.
func (l *Lease) Verify() error { return l.verr }

// Record returns a copy of the ticket record as the lease holds it (zero before Load).
func (l *Lease) Record() Record {
	if l.rec == nil {
		return Record{}
	}
	return *l.rec
}

// Load reads the ticket's record. Errors (the lease is then settled): ErrFinal (the
// order is done, failed, dead or cancelled already: a redelivery after a crash between
// the final record and the acknowledgement, or a republished duplicate; the message is
// acknowledged unseen), ErrUnavailable (the record cannot be read; handed back for a
// second).
func (l *Lease) Load(ctx context.Context) error {
	m := l.m
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	rec, err := l.s.Record(rctx, m.Ticket)
	cancel()
	switch {
	case err == nil && rec.Status.Final():
		l.keepKey(ctx)
		_ = l.jm.Ack()
		return fmt.Errorf("%w: ticket %s is %s", ErrFinal, m.Ticket, rec.Status)
	case err == nil:
		l.rec, l.stored = rec, true
	case errors.Is(err, ErrNotFound):
		l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, Status: StatusQueued, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
	default:
		l.nak(ctx, time.Second)
		return unavailable("ticket record", err)
	}
	return nil
}

// Start marks the delivery attempt as started. A ticket without a record reads as
// delivering once its message was handed out (Store.Status asks the consumer), which
// saves a synced write per delivery; a record from an earlier attempt or pause is set
// to delivering with a compare-and-set that loses against a cancellation (Store.Cancel).
// A record that cannot be written does not hold up the delivery (nil). Errors (the
// lease is then settled): ErrCancelled (terminated: never delivered); any other error
// means the record changed under us (handed back for a second).
func (l *Lease) Start(ctx context.Context) error {
	if !l.stored {
		return nil
	}
	mctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := l.s.MarkDelivering(mctx, l.rec)
	cancel()
	switch {
	case errors.Is(err, ErrCancelled):
		_ = l.jm.TermWithReason("cancelled")
		return err
	case err != nil && !errors.Is(err, ErrUnavailable):
		l.nak(ctx, time.Second)
		return err
	case err != nil:
		l.c.log.Debug("cannot mark delivering", "ticket", l.m.Ticket, "err", err)
	}
	return nil
}

// CountAttempt counts a failed delivery attempt in the lease's record (written by the
// settlement that follows) and returns the failed attempts so far (0 before Load:
// nothing to count in). JetStream's delivery count does not serve: it also counts
// pauses and crash redeliveries.
func (l *Lease) CountAttempt() int {
	if l.rec == nil {
		return 0
	}
	l.rec.Attempts++
	return l.rec.Attempts
}

// Done settles a delivered order: status done with the downstream's result, the
// completion event, then the acknowledgement, which it waits for. The order is
// acknowledged whether or not its record could be written: delivering it again because
// the store had no room for the record would keep the store full. An error is the
// failed acknowledgement: the message comes back after the ack wait and is
// acknowledged unseen (its record is done).
func (l *Lease) Done(ctx context.Context, res *Result) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.LastError, rec.NextAttemptAt, rec.Result = StatusDone, "", time.Time{}, res
	rec.Attempts++ // the attempt that delivered it
	l.keepKey(ctx)
	l.save(ctx)
	l.event(ctx, DoneSubject(rec.Queue), statusCode(res))
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return l.jm.DoubleAck(actx)
}

// Fail settles an order the downstream refused for good: status failed with cause as
// the last error and the downstream's result, the completion event, and the message is
// terminated.
func (l *Lease) Fail(ctx context.Context, res *Result, cause string) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.LastError, rec.NextAttemptAt, rec.Result = StatusFailed, cause, time.Time{}, res
	rec.Attempts++ // the attempt the downstream refused
	l.keepKey(ctx)
	l.save(ctx)
	l.event(ctx, DoneSubject(rec.Queue), statusCode(res))
	_ = l.jm.TermWithReason(fmt.Sprintf("downstream answered %d", statusCode(res)))
	return nil
}

func statusCode(res *Result) int {
	if res == nil {
		return 0
	}
	return res.StatusCode
}

// Retry settles the lease for another attempt after `after`: status queued, cause as
// the last error, and the message is handed back for redelivery then. A failed
// attempt is counted with CountAttempt first; without it the attempt does not count.
func (l *Lease) Retry(ctx context.Context, after time.Duration, cause string) error {
	return l.requeue(ctx, time.Now().Add(after), cause, after)
}

// ThrottleOption configures Lease.Throttle.
type ThrottleOption func(*throttleOptions)

type throttleOptions struct{ redeliverIn time.Duration }

// RedeliverIn hands the message back for d instead of until the end of the pause. A
// paused consumer holds it for the rest, and an operator's Queue.Resume then finds it
// available instead of hidden for the whole pause.
func RedeliverIn(d time.Duration) ThrottleOption {
	return func(o *throttleOptions) { o.redeliverIn = d }
}

// Throttle settles the lease for another attempt once the queue's pause ends at until
// (a downstream's Retry-After, or an open circuit): status queued, next attempt at
// until, cause as the last error; the attempt does not count. The message is handed
// back until then (at least 10ms), or for RedeliverIn.
func (l *Lease) Throttle(ctx context.Context, until time.Time, cause string, opts ...ThrottleOption) error {
	o := throttleOptions{redeliverIn: max(time.Until(until), 10*time.Millisecond)}
	for _, opt := range opts {
		opt(&o)
	}
	return l.requeue(ctx, until, cause, o.redeliverIn)
}

func (l *Lease) requeue(ctx context.Context, next time.Time, cause string, redeliverIn time.Duration) error {
	rec := l.rec
	if rec == nil {
		return ErrNotLoaded
	}
	rec.Status, rec.NextAttemptAt, rec.LastError = StatusQueued, next, cause
	l.save(ctx)
	l.nak(ctx, redeliverIn)
	return nil
}

// Release hands the message back for redelivery after `after`, its record untouched:
// for an order this dispatcher will not start now (it is stopping, or the queue is
// paused). See nak.
func (l *Lease) Release(after time.Duration) {
	l.nak(context.Background(), after)
}

// HandBack returns an order this consumer will not deliver (its dispatcher is
// stopping) for immediate redelivery to another one (see nak). A genuine order whose
// ticket has no record yet gets a queued one first: its status would otherwise be
// read as delivering, the consumer having handed it out.
func (l *Lease) HandBack(ctx context.Context) { l.Postpone(ctx, time.Millisecond) }

// Postpone hands the message back for redelivery after `after`, without counting an
// attempt: for an order whose turn has not come (its flow key has no slot free; see
// queueconfig.FlowBy). Like HandBack, it gives a ticket without a record a queued
// one first, so that its status does not read as delivering while it waits.
func (l *Lease) Postpone(ctx context.Context, after time.Duration) {
	if !l.stored && l.verr == nil {
		m := l.m
		if l.rec == nil {
			l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
		}
		l.rec.Status = StatusQueued
		l.save(ctx)
	}
	l.nak(ctx, after)
}

// Extend makes sure the lease has at least need left before its ack wait runs out,
// so that a delivery about to start (need: its timeout and its settlement's writes)
// ends before the server may hand the order to another dispatcher, however long the
// steps before it took (the record read, the pacing slot, each bounded by seconds).
// With less left, it restarts the ack wait on the server (JetStream's "in progress")
// and waits for the server to take it (see ask). false: the order
// must not be delivered here, and the lease must be left as it is: the server
// redelivers the order. Either the lease is stale already (the server may have handed
// the order out again: nothing is sent), or it had too little left and the server did
// not answer (whether the ack wait restarted is not known).
func (l *Lease) Extend(ctx context.Context, need time.Duration) bool {
	if l.stale.IsZero() {
		return true // the ack wait is not known: nothing to keep
	}
	now := time.Now()
	switch {
	case now.After(l.stale):
		return false
	case l.stale.Sub(now) >= need:
		return true
	}
	if err := l.ask(ctx, []byte("+WPI")); err != nil {
		l.c.log.Debug("cannot restart an order's ack wait", "ticket", l.m.Ticket, "err", err)
		return false
	}
	l.stale = staleAt(now, l.ackWait)
	return true
}

// nakWait bounds how long nak waits for the server to take a nak.
const nakWait = 2 * time.Second

// nak hands the message back for redelivery after delay, and is how every settlement
// of a Lease does. Three things it guards against:
//
//   - A lease past its ack wait (stale) sends nothing. The server may have handed the
//     order to another dispatcher meanwhile, and JetStream applies a nak to whichever
//     delivery of the message is current: the nak would cut that delivery short and the
//     order would go out a third time beside it. The server redelivers a stale lease's
//     order by itself.
//   - A nak with a delay, never a plain one: the server keeps a plain nak in memory
//     only, so after a restart of the server (the embedded one restarts with sluice)
//     the message would wait out its ack wait; a delayed nak is stored as the message's
//     new deadline.
//   - It waits until the server has taken the nak: a settlement may come just before
//     the connection or an embedded server stops (a dispatcher stopping), and a nak
//     still on its way, or queued for the consumer inside the server, when the server
//     stops is lost, its order waiting out the ack wait. JetStream answers an
//     acknowledgement of any kind that asks for one once its consumer has processed
//     it (the payload is JetStream's nak with a delay; the client's synchronous form
//     exists for Ack only); a replicated consumer answers once its leader has applied
//     the nak and proposed it, not once the followers have it. The wait is bounded by
//     nakWait and ctx; a ctx already done sends the nak without waiting. Without an
//     answer (time out, or no responders: the consumer has no leader, or is gone) it is
//     not sent again: applied and redelivered meanwhile, a second nak would cut short
//     another dispatcher's delivery, as above; the ack wait is the backstop. While the
//     connection is down the nak is lost (sluice's connections keep no reconnect
//     buffer).
func (l *Lease) nak(ctx context.Context, delay time.Duration) {
	if !l.stale.IsZero() && time.Now().After(l.stale) {
		l.c.log.Debug("not handing back an order held past its ack wait: the server redelivers it",
			"ticket", l.m.Ticket, "stale_for", time.Since(l.stale).Round(time.Millisecond))
		return
	}
	delay = max(delay, time.Millisecond)
	if !l.s.nc.IsConnected() || ctx.Err() != nil {
		_ = l.jm.NakWithDelay(delay)
		return
	}
	_ = l.ask(ctx, fmt.Appendf(nil, "-NAK {\"delay\": %d}", delay.Nanoseconds()))
}

// ask sends the acknowledgement ack of the lease's message and waits for the server to
// have processed it (see nak), at most nakWait.
func (l *Lease) ask(ctx context.Context, ack []byte) error {
	wctx, cancel := context.WithTimeout(ctx, nakWait)
	defer cancel()
	_, err := l.s.nc.RequestWithContext(wctx, l.jm.Reply(), ack)
	return err
}

// Dead moves the order to the dead-letter stream with cause as its reason, then
// records it dead, publishes the event on DeadSubject, and terminates the message. A
// lease not loaded yet (Load) is an order never attempted: its record is written new
// (its ticket may be a genuine order's only if the order verifies, so a forged order
// leaves the record and the events alone). When the dead letter cannot be written the
// order is handed back for retryIn (its record queued) and the error is returned.
func (l *Lease) Dead(ctx context.Context, cause string, retryIn time.Duration) error {
	m := l.m
	if l.rec != nil {
		l.rec.LastError = cause
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	err := l.s.DeadLetter(dctx, m, l.Record().Attempts, cause)
	cancel()
	if err != nil {
		if l.rec != nil {
			l.rec.Status = StatusQueued
			l.save(ctx)
		}
		l.nak(ctx, retryIn)
		return err
	}
	reason := "dead-lettered: " + cause
	if l.rec == nil {
		if l.verr != nil {
			_ = l.jm.TermWithReason(cause)
			return nil
		}
		reason = cause
		l.rec = &Record{Ticket: m.Ticket, Queue: m.Queue, Rule: m.Rule, ReceivedAt: m.ReceivedAt, Fingerprint: m.Fingerprint}
	}
	rec := l.rec
	rec.Status, rec.NextAttemptAt, rec.LastError = StatusDead, time.Time{}, cause
	l.keepKey(ctx)
	l.save(ctx)
	l.event(ctx, DeadSubject(m.Queue), 0)
	_ = l.jm.TermWithReason(reason)
	return nil
}

// keepKey gives the idempotency key of an order that is final its final lifetime
// (KeepKey), before the final record is written and the message acknowledged. A
// failure is logged: the key then keeps the lifetime it had.
func (l *Lease) keepKey(ctx context.Context) {
	kctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := l.s.KeepKey(kctx, l.m); err != nil {
		l.c.log.Warn("cannot refresh the idempotency key", "ticket", l.m.Ticket, "err", err)
	}
}

// save writes the lease's record. When JetStream refuses it (store full, NATS
// unreachable) the record is kept in memory (KeepRecord) and written later
// (FlushRecords), so that settling an order never waits on its bookkeeping. When even
// that fails the record is lost; the order is settled all the same.
func (l *Lease) save(ctx context.Context) {
	rec := l.rec
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := l.s.SaveRecord(sctx, rec)
	cancel()
	if err == nil {
		return
	}
	if kerr := l.s.KeepRecord(rec); kerr != nil {
		l.c.log.Error("cannot save the ticket record nor keep it for later; its status is lost", "ticket", rec.Ticket, "status", rec.Status, "err", err)
		return
	}
	l.c.log.Debug("ticket record kept in memory to be written later", "ticket", rec.Ticket, "err", err)
}

// event publishes the order's final state on subject and, when the order asked for
// one, stores its completion callback.
func (l *Lease) event(ctx context.Context, subject string, status int) {
	rec := l.rec
	ev := Event{
		Ticket: rec.Ticket, Queue: rec.Queue, Rule: rec.Rule, Status: rec.Status,
		DownstreamStatus: status, Attempts: rec.Attempts, Error: rec.LastError, At: time.Now().UTC(),
	}
	if err := l.s.PublishEvent(subject, ev); err != nil {
		l.c.log.Warn("cannot publish event", "subject", subject, "err", err)
	}
	l.s.enqueueCallback(ctx, l.m, ev)
}
