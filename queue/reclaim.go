package queue

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
)

// Reclaim removes the orders a queue's dispatch consumers have acknowledged that are
// still in its stream, and returns how many it removed. JetStream removes an order from
// a work-queue stream when it is acknowledged, but a removal that fails (the disk is
// full) is tried neither again nor at the server's next start: the order would stay for
// good, counted in the queue's depth and in the store, whose room is what a full disk
// lacks. A consumer's ack floor says which of the orders it takes are acknowledged:
// every one at or below it, but only on subjects the consumer has taken all along: an
// update that widens a consumer's filter keeps its ack floor, so a subject it took up
// later may hold orders below the floor that it never delivered. A lane's consumer
// always takes its lane; the queue's own always took the unlaned orders, but a lane it
// takes (every lane in a queue without lanes, those without a consumer in a laned one)
// may have come to it by an update (earlier sluices widened it so when the lanes
// went), so its purge is of the unlaned orders alone. Nothing of another lane, nor a
// scheduled order, is touched; a consumer not of sluice's, or one of sluice's name
// with a filter sluice does not give it, is left alone.
func (c *Consumer) Reclaim(ctx context.Context) (uint64, error) {
	stream := c.q.stream
	type target struct {
		floor  uint64
		filter string
	}
	var purge []target
	unlaned := ReadySubject(c.q.name, "", "*")
	list := stream.ListConsumers(ctx)
	for ci := range list.Info() {
		if ci.AckFloor.Stream == 0 {
			continue
		}
		switch tok, ok := strings.CutPrefix(ci.Name, ConsumerName+"_"); {
		case ci.Name == ConsumerName && c.takesUnlaned(filtersOf(ci.Config)):
			purge = append(purge, target{ci.AckFloor.Stream, unlaned})
		case ok && validLane(tok) && ci.Config.FilterSubject == ReadySubject(c.q.name, tok, "*"):
			purge = append(purge, target{ci.AckFloor.Stream, ci.Config.FilterSubject})
		}
	}
	if err := list.Err(); err != nil {
		return 0, unavailable("consumers of "+c.q.name, err)
	}
	var removed uint64
	for _, ci := range purge {
		floor, filter := ci.floor, ci.filter
		first, err := c.q.store.readMsg(ctx, stream, jsproto.MsgQuery{Seq: 1, Next: filter})
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return removed, unavailable("stream of "+c.q.name, err)
		case first.Sequence > floor:
			continue // the usual case: nothing acknowledged is left
		}
		n, err := jsproto.PurgeBelow(ctx, c.q.store.nc, c.q.StreamName(), filter, floor+1)
		if err != nil {
			return removed, unavailable("purge acknowledged orders of "+c.q.name, err)
		}
		removed += n
	}
	return removed, nil
}

// takesUnlaned reports whether filters are ones sluice gives the queue's consumer:
// every ready subject, or the unlaned orders and lanes (see dispatchFilters).
func (c *Consumer) takesUnlaned(filters []string) bool {
	if slices.Equal(filters, []string{readyFilter(c.q.name)}) {
		return true
	}
	unlaned := false
	for _, f := range filters {
		rest, ok := strings.CutPrefix(f, "sluice.q."+c.q.name+".")
		tok, star, laned := strings.Cut(rest, ".")
		switch {
		case ok && rest == "*":
			unlaned = true
		case !ok || !laned || star != "*" || !validLane(tok):
			return false
		}
	}
	return unlaned
}
