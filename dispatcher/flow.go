package dispatcher

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// WithFlowLimiter sets where the pacing state of the flow keys of queues with flow_by
// (queueconfig.FlowBy) is kept (default: a limiter.Memory of the dispatcher's own, on
// the dispatcher's clock). A queue's orders are started by one dispatcher at a time
// (the pinned one, or a laned queue's lead), so memory keeps each key's rate while that
// dispatcher lives; the one that takes the queue over after it would start with fresh
// buckets, a key's first start there as soon as it has the queue (measured: 3 s after
// the last one for a key at 1 per 10 s). A limiter/redisstore Store shared by the
// replicas keeps each key's pace across a fail-over: `sluice serve` and `sluice
// dispatch` use their --redis one. Each key's state is one leaky bucket of one
// start, keyed "sluice:flow:{queue}/{key}:{rate}", which expires once the key is
// idle: keys cost nothing while they have no orders.
//
// A key's max_in_flight is counted in the dispatcher's memory, whatever the limiter:
// by the one dispatcher that starts the queue's orders, so it holds for the queue as
// a whole, except across a fail-over, where the deliveries the old dispatcher still
// has under way (a stalled one resumed; a dead one has none) are not counted by the
// new one.
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
// key's rate through the flow limiter, each key's deliveries running here counted.
// A key has a flowKeyState only while a delivery of it runs, orders of it are handed
// back, or it started one within queue.FlowRateWindow: idle keys take no memory.
//
// An order without a turn is handed back for its key's wait plus one step (the key's
// interval) for each order of the key already handed back and not yet seen again: a
// key's backlog comes back spread over the times its turns come, each order about
// once more, instead of all of them at every turn.
type flowGate struct {
	lim limiter.Limiter

	mu        sync.Mutex
	keys      map[string]*flowKeyState // queue + "/" + key
	pen       map[string]penned        // ticket → the order handed back
	nextSweep time.Time
}

// flowRateSeconds is queue.FlowRateWindow in whole seconds: a key's starts are
// counted per second over that many seconds.
const flowRateSeconds = int64(queue.FlowRateWindow / time.Second)

// flowKeyState is what the gate knows of one key of one queue.
type flowKeyState struct {
	running int // deliveries running
	waiting int // orders handed back, not seen again
	// starts counts the key's starts per second: starts[s % flowRateSeconds] for the
	// Unix second s, for the flowRateSeconds seconds up to last (the latest start).
	starts [flowRateSeconds]uint32
	last   int64
}

// startsBefore returns the starts in the flowRateSeconds whole seconds before sec.
func (k *flowKeyState) startsBefore(sec int64) int {
	n := 0
	for s := max(sec-flowRateSeconds, k.last-flowRateSeconds+1); s < sec && s <= k.last; s++ {
		n += int(k.starts[s%flowRateSeconds])
	}
	return n
}

// count records a start at sec.
func (k *flowKeyState) count(sec int64) {
	if sec > k.last {
		for s := max(k.last+1, sec-flowRateSeconds+1); s <= sec; s++ {
			k.starts[s%flowRateSeconds] = 0
		}
		k.last = sec
	}
	if sec > k.last-flowRateSeconds {
		k.starts[sec%flowRateSeconds]++
	}
}

// idle reports whether the key holds nothing at sec: the state can go.
func (k *flowKeyState) idle(sec int64) bool {
	return k.running == 0 && k.waiting == 0 && sec-k.last >= flowRateSeconds
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
	return &flowGate{lim: lim, keys: map[string]*flowKeyState{}, pen: map[string]penned{}}
}

// keyLocked returns id's state, made if missing. Called with g.mu held.
func (g *flowGate) keyLocked(id string) *flowKeyState {
	k := g.keys[id]
	if k == nil {
		k = &flowKeyState{last: math.MinInt64 / 2}
		g.keys[id] = k
	}
	return k
}

// dropIdleLocked removes id's state if it holds nothing at now.
func (g *flowGate) dropIdleLocked(id string, now time.Time) {
	if k := g.keys[id]; k != nil && k.idle(now.Unix()) {
		delete(g.keys, id)
	}
}

// unpenLocked forgets ticket's hand-back (it is back). Called with g.mu held.
func (g *flowGate) unpenLocked(ticket string, now time.Time) {
	e, ok := g.pen[ticket]
	if !ok {
		return
	}
	delete(g.pen, ticket)
	if k := g.keys[e.id]; k != nil {
		k.waiting = max(k.waiting-1, 0)
		g.dropIdleLocked(e.id, now)
	}
}

// sweepLocked forgets the hand-backs long past their due time, and the keys idle
// since their last start.
func (g *flowGate) sweepLocked(now time.Time) {
	if now.Before(g.nextSweep) {
		return
	}
	g.nextSweep = now.Add(penForget / 4)
	for ticket, e := range g.pen {
		if now.Sub(e.due) > penForget {
			g.unpenLocked(ticket, now)
		}
	}
	for id := range g.keys {
		g.dropIdleLocked(id, now)
	}
}

// admit decides whether the order ticket of queue with flow key key may start now
// under f. ok: it may, and release must be called once its delivery ends. Else wait
// is how long to hand the order back for.
func (g *flowGate) admit(ctx context.Context, queue string, f queueconfig.FlowBy, key, ticket string, now time.Time) (release func(), wait time.Duration, ok bool, err error) {
	id := queue + "/" + key
	g.mu.Lock()
	g.unpenLocked(ticket, now)
	g.sweepLocked(now)
	busy := false
	if k := g.keys[id]; k != nil {
		busy = f.MaxInFlight > 0 && k.running >= f.MaxInFlight
	}
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
	g.mu.Lock()
	k := g.keyLocked(id)
	k.running++
	k.count(now.Unix())
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		defer g.mu.Unlock()
		if k := g.keys[id]; k != nil {
			k.running = max(k.running-1, 0)
		}
	}, 0, true, nil
}

// postpone records ticket as handed back and returns for how long: base, plus step for
// each order of the key handed back before it and not seen again.
func (g *flowGate) postpone(id, ticket string, base, step time.Duration, now time.Time) time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := g.keyLocked(id)
	wait := base + time.Duration(k.waiting)*step
	g.pen[ticket] = penned{id: id, due: now.Add(wait)}
	k.waiting++
	return wait
}

// hold records ticket, of queue's flow key key, as handed back for wait (its key is
// paused) and returns wait.
func (g *flowGate) hold(queueName, key, ticket string, wait time.Duration, now time.Time) time.Duration {
	g.mu.Lock()
	g.unpenLocked(ticket, now)
	g.mu.Unlock()
	return g.postpone(queueName+"/"+key, ticket, wait, 0, now)
}

// stats returns the figures of queue's flow keys at now (see queue.FlowStat), and
// forgets the keys that are idle.
func (g *flowGate) stats(queueName string, now time.Time) []queue.FlowStat {
	prefix := queueName + "/"
	sec := now.Unix()
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []queue.FlowStat
	for id, k := range g.keys {
		key, ok := strings.CutPrefix(id, prefix)
		if !ok {
			continue
		}
		if k.idle(sec) {
			delete(g.keys, id)
			continue
		}
		out = append(out, queue.FlowStat{Key: key, Depth: k.running + k.waiting,
			PerSecond: float64(k.startsBefore(sec)) / float64(flowRateSeconds)})
	}
	return out
}
