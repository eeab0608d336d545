package queue

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// DefaultLaneRefresh is how often the scheduler of a laned queue re-reads the depths
// of its lanes unless ConsumerConfig.LaneRefresh says otherwise.
const DefaultLaneRefresh = 100 * time.Millisecond

// lanePoll is how long an idle laned queue waits between looks at its lanes (a pull
// cannot wait on several consumers at once).
const lanePoll = 100 * time.Millisecond

// laneState is what the scheduler knows of one lane (or of the unlaned orders, which
// a laned queue still drains: parked before it had lanes, or re-queued from before).
type laneState struct {
	l       lane
	name    string // consumer name
	cons    jetstream.Consumer
	pending uint64        // waiting orders as last seen
	probe   bool          // orders handed out: some may come back (retries) and be due
	ackWait time.Duration // the lane consumer's on the server, as last seen (0: unknown)
}

func (s *laneState) active() bool { return s.pending > 0 || s.probe }

// scheduler picks the lane each delivery slot of a laned queue goes to. Levels: strict
// (the highest with work) or smooth weighted round robin (see queueconfig.Weighted);
// tenant lanes of a level: round robin, one order per turn. It lives in the one
// dispatcher that leads the queue (see Consumer.lead), so the queue's outflow, paced by
// that dispatcher, is what the lanes share.
type scheduler struct {
	cfg     queueconfig.Config
	levels  [][]*laneState // by level, then tenant lane; the unlaned orders last in the default level
	current []int          // smooth weighted round robin state, by level
	cursor  []int          // next tenant lane to look at, by level

	refreshEvery time.Duration
	refreshedAt  time.Time
	paused       bool
}

func newScheduler(cfg queueconfig.Config, cons map[string]jetstream.Consumer, held map[string]bool, refreshEvery time.Duration) *scheduler {
	nlevels, _ := cfg.LaneCount()
	sc := &scheduler{cfg: cfg, levels: make([][]*laneState, nlevels), current: make([]int, nlevels),
		cursor: make([]int, nlevels), refreshEvery: refreshEvery}
	for _, l := range lanesOf(cfg) {
		if held[l.token()] {
			continue // the queue's consumer takes it (see Consumer.heldLanes)
		}
		sc.levels[l.level] = append(sc.levels[l.level], &laneState{l: l, name: l.consumer(), cons: cons[l.consumer()]})
	}
	def := 0
	if cfg.Priorities.Enabled() {
		def = cfg.Priorities.Level(cfg.Priorities.Default)
	}
	sc.levels[def] = append(sc.levels[def], &laneState{l: lane{def, -1}, name: ConsumerName, cons: cons[ConsumerName]})
	return sc
}

// refresh reads the depth of every lane (one paged consumer listing) and whether the
// queue is paused (the pause of the queue's own consumer: Queue.Pause and the
// dispatchers' pauses set it there). A consumer of the scheduler's that the listing
// lacks is ErrConsumerGone: its orders are taken by no consumer until Ensure sets
// the lanes up again (another replica may have deleted it to make it anew, and
// stopped before it could).
func (sc *scheduler) refresh(ctx context.Context, stream jetstream.Stream, now time.Time) error {
	byName := map[string]*laneState{}
	for _, lv := range sc.levels {
		for _, ls := range lv {
			byName[ls.name] = ls
			ls.pending, ls.probe = 0, false
		}
	}
	seen := 0
	list := stream.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci.Name == ConsumerName {
			sc.paused = ci.Paused && ci.PauseRemaining > 0
		}
		if ls := byName[ci.Name]; ls != nil {
			ls.pending, ls.probe = ci.NumPending, ci.NumAckPending > 0
			ls.ackWait = ci.Config.AckWait
			seen++
		}
	}
	queue := strings.TrimPrefix(stream.CachedInfo().Config.Name, StreamPrefix)
	if err := list.Err(); err != nil {
		return unavailable("lanes of "+queue, err)
	}
	if seen < len(byName) {
		return fmt.Errorf("%w: a consumer of the lanes of %s is gone", ErrConsumerGone, queue)
	}
	sc.refreshedAt = now
	return nil
}

// pick returns the lane the next slot goes to (nil: no lane has work) and commits the
// choice with take once an order came from it.
func (sc *scheduler) pick() (*laneState, int) {
	level := -1
	if sc.cfg.Priorities.Mode == queueconfig.Strict || !sc.cfg.Priorities.Enabled() {
		for lv := range sc.levels {
			if sc.levelActive(lv) {
				level = lv
				break
			}
		}
	} else {
		best := 0
		for lv := range sc.levels {
			if !sc.levelActive(lv) {
				continue
			}
			if c := sc.current[lv] + sc.cfg.Priorities.Weight(lv); level < 0 || c > best {
				level, best = lv, c
			}
		}
	}
	if level < 0 {
		return nil, -1
	}
	lanes := sc.levels[level]
	for i := range lanes {
		ls := lanes[(sc.cursor[level]+i)%len(lanes)]
		if ls.active() {
			return ls, level
		}
	}
	return nil, -1
}

// take commits a slot given to ls (of level): the level's weighted round robin turn
// and the tenant lanes' cursor move on.
func (sc *scheduler) take(ls *laneState, level int) {
	if sc.cfg.Priorities.Mode != queueconfig.Strict && sc.cfg.Priorities.Enabled() {
		total := 0
		for lv := range sc.levels {
			if sc.levelActive(lv) {
				w := sc.cfg.Priorities.Weight(lv)
				sc.current[lv] += w
				total += w
			}
		}
		sc.current[level] -= total
	}
	lanes := sc.levels[level]
	for i, x := range lanes {
		if x == ls {
			sc.cursor[level] = (i + 1) % len(lanes)
		}
	}
}

func (sc *scheduler) levelActive(lv int) bool {
	for _, ls := range sc.levels[lv] {
		if ls.active() {
			return true
		}
	}
	return false
}

// nextLaned is Consumer.Next for a laned queue.
func (c *Consumer) nextLaned(ctx context.Context) (*Lease, error) {
	for {
		l, leading, err := c.tryLaned(ctx)
		if err != nil && ctx.Err() != nil {
			// The caller's time ran out within a request: nothing came, as for an
			// unlaned queue's Next.
			return nil, fmt.Errorf("%w: %w", ErrNoMessages, ctx.Err())
		}
		if l != nil || err != nil {
			return l, err
		}
		wait := lanePoll
		if !leading {
			// Followers look again less often: the lead changes hands only when its
			// holder stops or falls silent for the pinned TTL.
			c.smu.Lock()
			wait = max(wait, c.leadTTL/8)
			c.smu.Unlock()
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: %w", ErrNoMessages, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// tryLaned gives the next slot to a lane: no lease and no error when this dispatcher
// does not lead the queue (leading false), the queue is paused or no lane has work.
func (c *Consumer) tryLaned(ctx context.Context) (_ *Lease, leading bool, _ error) {
	c.smu.Lock()
	defer c.smu.Unlock()
	sc := c.sched
	if sc == nil {
		return nil, false, fmt.Errorf("%w: not set up (Ensure)", ErrConsumerGone)
	}
	if ok, err := c.leadLocked(ctx); !ok || err != nil {
		return nil, false, err
	}
	now := time.Now()
	// Lanes found idle are looked at again only when not just refreshed: each listing
	// carries every consumer's configuration, the queue's with a filter per lane.
	refreshed := now.Sub(sc.refreshedAt) >= sc.refreshEvery
	if refreshed {
		if err := sc.refresh(ctx, c.q.stream, now); err != nil {
			return nil, true, err
		}
	}
	for {
		if sc.paused {
			return nil, true, nil
		}
		ls, level := sc.pick()
		if ls == nil {
			if refreshed {
				return nil, true, nil
			}
			if err := sc.refresh(ctx, c.q.stream, now); err != nil {
				return nil, true, err
			}
			refreshed = true
			continue
		}
		jm, err := fetchNoWait(ls.cons)
		switch {
		case errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrConsumerDeleted),
			errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, true, fmt.Errorf("%w: lane %s: %w", ErrConsumerGone, ls.name, err)
		case err != nil:
			return nil, true, unavailable("fetch from "+c.q.name, err)
		case jm == nil:
			ls.pending, ls.probe = 0, false
			continue
		}
		sc.take(ls, level)
		if md, err := jm.Metadata(); err == nil {
			ls.pending = md.NumPending
		}
		ls.probe = true
		if l := c.lease(jm, cmp.Or(ls.ackWait, serverAckWait(ls.cons))); l != nil {
			return l, true, nil
		}
	}
}

// fetchNoWait fetches one order if one is due now (nil, nil if none).
func fetchNoWait(cons jetstream.Consumer) (jetstream.Msg, error) {
	if cons == nil {
		return nil, nil
	}
	batch, err := cons.FetchNoWait(1)
	if err != nil {
		return nil, err
	}
	var jm jetstream.Msg
	for m := range batch.Messages() {
		jm = m
	}
	if jm != nil {
		return jm, nil
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
		return nil, err
	}
	return nil, nil
}

// leaderKey is the key, in the tickets bucket, naming the dispatcher that leads a
// laned queue. Tickets never contain a dot, so it never names a ticket.
func leaderKey(queue string) string { return "leader." + queue }

// leadLocked makes sure this handle leads the queue: one dispatcher at a time gives
// out the slots of a laned queue (its lanes are several consumers, which a pinned
// priority group cannot keep with one replica). The lead is a key with a TTL of the
// pinned TTL, renewed as Next is called and released by Unpin; another replica takes
// it when it expires. c.smu is held.
func (c *Consumer) leadLocked(ctx context.Context) (bool, error) {
	s, key := c.q.store, leaderKey(c.q.name)
	if c.leadRev != 0 && time.Since(c.leadAt) < c.leadTTL/4 {
		return true, nil
	}
	if c.leadRev != 0 {
		sent := time.Now()
		rev, err := c.putLead(ctx, c.leadRev)
		if err == nil {
			c.leadRev, c.leadAt, c.leadSent = rev, time.Now(), sent
			return true, nil
		}
		c.leadRev, c.leadSent = 0, time.Time{}
		c.log.Info("lost the lead of the queue", "err", err)
	}
	e, err := s.readKey(ctx, s.tickets, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
	case err != nil:
		return false, unavailable("leader of "+c.q.name, err)
	case string(e.Value()) == c.id:
		c.leadRev, c.leadAt = e.Revision(), time.Time{} // ours (a renewal raced): renew now
		return c.leadLocked(ctx)
	default:
		return false, nil
	}
	// Create, not a publish expecting no message: a released lead leaves a delete
	// marker, which Create knows to replace.
	sent := time.Now()
	rev, err := s.tickets.Create(ctx, key, []byte(c.id), jetstream.KeyTTL(max(c.leadTTL, time.Second)))
	if err != nil {
		return false, nil // another replica was quicker
	}
	c.leadRev, c.leadAt, c.leadSent = rev, time.Now(), sent
	c.log.Debug("leads the queue", "queue", c.q.name)
	return true, nil
}

// putLead renews the lead key with its TTL, expecting revision rev.
func (c *Consumer) putLead(ctx context.Context, rev uint64) (uint64, error) {
	ack, err := jsproto.KVPut(ctx, c.q.store.js, TicketsBucket, leaderKey(c.q.name), []byte(c.id), max(c.leadTTL, time.Second),
		jetstream.WithExpectLastSequencePerSubject(rev))
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// releaseLead gives the lead up (the key is deleted unless another replica has it).
func (c *Consumer) releaseLead(ctx context.Context) {
	c.smu.Lock()
	rev := c.leadRev
	c.leadRev, c.leadSent = 0, time.Time{}
	c.smu.Unlock()
	if rev == 0 || c.q.store.nc.IsClosed() {
		return
	}
	_ = c.q.store.tickets.Delete(ctx, leaderKey(c.q.name), jetstream.LastRevision(rev))
}

func newHandleID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// laneConsumers returns the configurations of the queue's lane consumers on the server.
func (c *Consumer) laneConsumers(ctx context.Context) (map[string]jetstream.ConsumerConfig, error) {
	out, err := jsproto.AskAgain(ctx, func(ctx context.Context) (map[string]jetstream.ConsumerConfig, error) {
		out := map[string]jetstream.ConsumerConfig{}
		list := c.q.stream.ListConsumers(ctx)
		for ci := range list.Info() {
			if tok, ok := strings.CutPrefix(ci.Name, ConsumerName+"_"); ok && validLane(tok) {
				out[ci.Name] = ci.Config
			}
		}
		return out, list.Err()
	})
	if err != nil {
		return nil, unavailable("consumers of "+c.q.name, err)
	}
	return out, nil
}

// ensureLanes creates or updates the lane consumers of a laned queue and sets up the
// handle's scheduler (none for a queue without lanes). Lanes the configuration no
// longer has (fewer fair_lanes or levels) keep their consumers, and are drained as
// lanes of the nearest level: the queue's consumer, which takes the lanes without a
// consumer, could take theirs back only by being made anew (see Ensure). existing
// are the lane consumers Ensure found, whose lanes it left out of own's filter; held
// the lanes it left to own instead of giving them a consumer now (see heldLanes).
func (c *Consumer) ensureLanes(ctx context.Context, cfg ConsumerConfig, qcfg queueconfig.Config, own jetstream.Consumer,
	existing map[string]jetstream.ConsumerConfig, held map[string]bool) error {
	if !qcfg.Laned() {
		c.smu.Lock()
		c.sched = nil
		c.smu.Unlock()
		return nil
	}
	stream := c.q.stream
	cons := map[string]jetstream.Consumer{ConsumerName: own}
	for _, l := range lanesOf(qcfg) {
		if held[l.token()] {
			continue
		}
		want := cfg.lane(l, c.q.name)
		if have, ok := existing[want.Durable]; !ok || !sameConsumer(have, want) {
			if _, err := stream.CreateOrUpdateConsumer(ctx, want); err != nil {
				return unavailable("lane consumer of "+c.q.name, err)
			}
		}
		h, err := stream.Consumer(ctx, want.Durable)
		if err != nil {
			return unavailable("lane consumer of "+c.q.name, err)
		}
		cons[want.Durable] = h
	}
	sc := newScheduler(qcfg, cons, held, cmp.Or(cfg.LaneRefresh, DefaultLaneRefresh))
	for name := range existing {
		if cons[name] != nil {
			continue
		}
		l, _ := parseLane(strings.TrimPrefix(name, ConsumerName+"_"))
		h, err := stream.Consumer(ctx, name)
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			// Deleted meanwhile (by a replica without lanes, or by hand): the queue's
			// consumer, set up without the lane, does not take it, so the lane gets its
			// consumer back. Made anew: it starts from the lane's first order.
			if _, err = stream.CreateConsumer(ctx, cfg.lane(l, c.q.name)); err == nil {
				h, err = stream.Consumer(ctx, name)
			}
		}
		if err != nil {
			return unavailable("lane consumer of "+c.q.name, err)
		}
		lv := min(l.level, len(sc.levels)-1)
		sc.levels[lv] = append(sc.levels[lv], &laneState{l: l, name: name, cons: h})
	}
	c.smu.Lock()
	c.sched, c.leadTTL = sc, cfg.PinnedTTL
	c.smu.Unlock()
	return nil
}
