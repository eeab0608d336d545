package queue

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// ReadySubject is the subject an order of queue waits on, ready for delivery:
// sluice.q.{queue}.{ticket} without a lane (a queue without priorities and fair_by),
// sluice.q.{queue}.{lane}.{ticket} in a lane. It is the one place that decides where a
// ready order is published: Park, re-queued dead letters and anything that makes an
// order ready later all call it, and Store.Verify checks a message against it.
func ReadySubject(queue, lane, ticket string) string {
	if lane == "" {
		return "sluice.q." + queue + "." + ticket
	}
	return "sluice.q." + queue + "." + lane + "." + ticket
}

// lane is a position in a laned queue: a priority level (0: highest) and a tenant lane.
type lane struct{ level, tenant int }

// token is the lane's subject token, "p{level}t{tenant}": bounded (both are small
// numbers validated by queueconfig) and never client input.
func (l lane) token() string {
	return "p" + strconv.Itoa(l.level) + "t" + strconv.Itoa(l.tenant)
}

// consumer is the name of the lane's durable consumer.
func (l lane) consumer() string { return ConsumerName + "_" + l.token() }

// parseLane reads a lane token.
func parseLane(tok string) (lane, bool) {
	rest, ok := strings.CutPrefix(tok, "p")
	if !ok {
		return lane{}, false
	}
	lv, tn, ok := strings.Cut(rest, "t")
	if !ok {
		return lane{}, false
	}
	level, err1 := strconv.Atoi(lv)
	tenant, err2 := strconv.Atoi(tn)
	l := lane{level, tenant}
	if err1 != nil || err2 != nil || level < 0 || tenant < 0 ||
		level >= queueconfig.MaxPriorityLevels || tenant >= queueconfig.MaxFairLanes || l.token() != tok {
		return lane{}, false
	}
	return l, true
}

func validLane(tok string) bool {
	_, ok := parseLane(tok)
	return ok
}

// laneFor returns the lane token of an order with the given priority and tenant values
// in a queue of cfg ("" for a queue without lanes). The tenant is hashed with the
// store's signing key, so that a client choosing tenant values cannot aim at the lane of
// another tenant it knows.
func (s *Store) laneFor(cfg queueconfig.Config, priority, tenant string) string {
	if !cfg.Laned() {
		return ""
	}
	var l lane
	if cfg.Priorities.Enabled() {
		l.level = cfg.Priorities.Level(priority)
	}
	if _, tenants := cfg.LaneCount(); tenants > 1 {
		sum := s.mac("sluice tenant lane", []byte(tenant))
		l.tenant = int(binary.BigEndian.Uint64(sum) % uint64(tenants))
	}
	return l.token()
}

// lanesOf returns every lane of a queue of cfg, highest level first.
func lanesOf(cfg queueconfig.Config) []lane {
	levels, tenants := cfg.LaneCount()
	out := make([]lane, 0, levels*tenants)
	for lv := range levels {
		for tn := range tenants {
			out = append(out, lane{lv, tn})
		}
	}
	return out
}

// laneRoom refuses an order for a lane that holds TenantMaxDepth orders already (a
// *FullError). The count is the lane consumer's waiting and handed-out orders, which
// nats-server updates just after it confirms a write (its stream signals consumers on
// another goroutine): parks racing or closely following each other may overshoot the
// cap by their number. A lane whose consumer no dispatcher has set up yet is counted
// by its subjects.
func (q *Queue) laneRoom(ctx context.Context, cfg queueconfig.Config, tok string) error {
	if cfg.TenantMaxDepth <= 0 || tok == "" {
		return nil
	}
	l, _ := parseLane(tok)
	var depth uint64
	info, err := q.stream.Consumer(ctx, l.consumer())
	switch {
	case err == nil:
		ci := info.CachedInfo()
		depth = ci.NumPending + uint64(ci.NumAckPending)
	case errors.Is(err, jetstream.ErrConsumerNotFound):
		// No dispatcher has set the lane up yet: count its subjects (one per order),
		// which costs a listing as long as the lane, until one does.
		si, err := q.stream.Info(ctx, jetstream.WithSubjectFilter(ReadySubject(q.name, tok, "*")))
		if err != nil {
			return unavailable("lane of "+q.name, err)
		}
		depth = uint64(len(si.State.Subjects))
	default:
		return unavailable("lane consumer of "+q.name, err)
	}
	if depth < uint64(cfg.TenantMaxDepth) {
		return nil
	}
	fe := q.fullError(ctx)
	fe.Depth, fe.Lane, fe.Limit, fe.Max = depth, tok, "tenant_max_depth", cfg.TenantMaxDepth
	return fmt.Errorf("%w: lane %s holds %d orders (tenant_max_depth %d)", fe, tok, depth, cfg.TenantMaxDepth)
}

// consumerOf returns the name of the consumer of the order stored on subject: its
// lane's, or the queue's (see servingConsumer).
func (q *Queue) consumerOf(subject string) string {
	rest := strings.TrimPrefix(subject, "sluice.q."+q.name+".")
	if tok, _, ok := strings.Cut(rest, "."); ok {
		if l, ok := parseLane(tok); ok {
			return l.consumer()
		}
	}
	return ConsumerName
}

// servingConsumer returns the consumer that takes the order stored on subject: its
// lane's, or the queue's for an unlaned order and for one of a lane without a
// consumer (any lane in a queue without lanes; see dispatchFilters).
func (q *Queue) servingConsumer(ctx context.Context, subject string) (jetstream.Consumer, error) {
	name := q.consumerOf(subject)
	cons, err := q.stream.Consumer(ctx, name)
	if errors.Is(err, jetstream.ErrConsumerNotFound) && name != ConsumerName {
		cons, err = q.stream.Consumer(ctx, ConsumerName)
	}
	return cons, err
}
