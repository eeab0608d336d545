package queue

import (
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
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
