package dispatcher

import (
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// WithFlowLimiter sets where the pacing state of the flow keys of queues with flow_by
// (queueconfig.FlowBy) is kept (default: a limiter.Memory of the dispatcher's own, on
// the dispatcher's clock). A queue's orders are started by one dispatcher at a time
// (the pinned one), so memory is enough for the bound while it lives; a
// limiter/redisstore Store shared by the replicas keeps each key's pace across a
// fail-over too. Each key's state is one leaky bucket of one start, keyed
// "sluice:flow:{queue}/{key}:{rate}", which expires once the key is idle: keys cost nothing
// while they have no orders.
func WithFlowLimiter(l limiter.Limiter) Option { return func(o *options) { o.flowLimiter = l } }

// flowBusyDelay is how long an order whose flow key has MaxInFlight deliveries
// running is handed back for (at least; a slower key's interval when longer): a
// delivery's length is not known ahead, and the order must not hold the pull while
// it waits.
const flowBusyDelay = 100 * time.Millisecond

// flowErrorDelay is how long an order is handed back for when its key's pacing state
// cannot be read (the flow limiter failed): a key whose pace is not known must not
// start, nor its order hold up the others'.
const flowErrorDelay = time.Second

// FlowPending is how many orders of a queue with flow_by may wait, handed back
// until their key's turn, beside its MaxInFlight deliveries: the queue's consumer
// hands out up to MaxInFlight + FlowPending orders unsettled (JetStream's
// MaxAckPending), and the dispatcher caps the deliveries running at MaxInFlight
// itself. A handed-back order stays unsettled on the server until it comes back, so
// without this room a flooding key's handed-back orders would fill MaxAckPending and
// hold up every other key's orders behind them; with it they do once a key has more
// than FlowPending orders waiting at once (see the package doc's measurements).
const FlowPending = 10_000

// flowGate admits the starts of one dispatcher's orders by their flow keys: each
// key's rate through the flow limiter, each key's deliveries running here counted in
// running. A key is in running only while a delivery of it runs, and in waiting only
// while orders of it are handed back: idle keys take no memory.
//
// An order without a turn is handed back for its key's wait plus one step (the key's
// interval) for each order of the key already handed back and not yet seen again: a
// key's backlog comes back spread over the times its turns come, each order about
// once more, instead of all of them at every turn.
type flowGate struct {
	lim limiter.Limiter

	mu        sync.Mutex
	running   map[string]int    // queue + "/" + key → deliveries running
	waiting   map[string]int    // queue + "/" + key → orders handed back
	pen       map[string]penned // ticket → the order handed back
	nextSweep time.Time
}

// penned is an order handed back until its key's turn.
type penned struct {
	id  string
	due time.Time
}

// penForget is how long after its due time a handed-back order that was not seen
// again (another dispatcher took it) is forgotten.
const penForget = time.Minute

func newFlowGate(lim limiter.Limiter) *flowGate {
	return &flowGate{lim: lim, running: map[string]int{}, waiting: map[string]int{}, pen: map[string]penned{}}
}

// unpenLocked forgets ticket's hand-back (it is back). Called with g.mu held.
func (g *flowGate) unpenLocked(ticket string) {
	e, ok := g.pen[ticket]
	if !ok {
		return
	}
	delete(g.pen, ticket)
	if g.waiting[e.id]--; g.waiting[e.id] <= 0 {
		delete(g.waiting, e.id)
	}
}

// sweepLocked forgets the hand-backs long past their due time.
func (g *flowGate) sweepLocked(now time.Time) {
	if now.Before(g.nextSweep) {
		return
	}
	g.nextSweep = now.Add(penForget / 4)
	for ticket, e := range g.pen {
		if now.Sub(e.due) > penForget {
			g.unpenLocked(ticket)
		}
	}
}

// admit decides whether the order ticket of queue with flow key key may start now
// under f. ok: it may, and release must be called once its delivery ends. Else wait
// is how long to hand the order back for.
func (g *flowGate) admit(ctx context.Context, queue string, f queueconfig.FlowBy, key, ticket string, now time.Time) (release func(), wait time.Duration, ok bool, err error) {
	id := queue + "/" + key
	g.mu.Lock()
	g.unpenLocked(ticket)
	g.sweepLocked(now)
	busy := f.MaxInFlight > 0 && g.running[id] >= f.MaxInFlight
	g.mu.Unlock()
	step := f.Rate.Interval()
	switch {
	case busy:
		step = max(step, flowBusyDelay/time.Duration(f.MaxInFlight))
		return nil, g.postpone(id, ticket, max(flowBusyDelay, step), step, now), false, nil
	case !f.Rate.IsZero():
		// The rate is part of the limiter's key: a pinned rate, or a new flow_by rate,
		// starts a bucket of its own.
		d, err := g.lim.AllowN(ctx, "sluice:flow:"+id+":"+f.Rate.String(), f.Limit(), 1)
		if err != nil {
			return nil, g.postpone(id, ticket, flowErrorDelay, 0, now), false, err
		}
		if !d.Allowed {
			return nil, g.postpone(id, ticket, max(d.RetryAfter, time.Millisecond), step, now), false, nil
		}
	}
	if f.MaxInFlight <= 0 {
		return func() {}, 0, true, nil
	}
	g.mu.Lock()
	g.running[id]++
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if g.running[id]--; g.running[id] <= 0 {
			delete(g.running, id)
		}
	}, 0, true, nil
}

// postpone records ticket as handed back and returns for how long: base, plus step for
// each order of the key handed back before it and not seen again.
func (g *flowGate) postpone(id, ticket string, base, step time.Duration, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	wait := base + time.Duration(g.waiting[id])*step
	g.pen[ticket] = penned{id: id, due: now.Add(wait)}
	g.waiting[id]++
	return wait
}
