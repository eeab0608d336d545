package queue

import (
	"context"
	"encoding/json"
	"errors"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Reclaim removes the orders a queue's dispatch consumers have acknowledged that are
// still in its stream, and returns how many it removed. JetStream removes an order from
// a work-queue stream when it is acknowledged, but a removal that fails (the disk is
// full) is tried neither again nor at the server's next start: the order would stay for
// good, counted in the queue's depth and in the store, whose room is what a full disk
// lacks. A consumer's ack floor says which of the orders it takes are acknowledged:
// every one at or below it. Each consumer's are purged by its filter, so nothing of
// another lane, nor a scheduled order, is touched; a consumer not of sluice's is left
// alone.
func (c *Consumer) Reclaim(ctx context.Context) (uint64, error) {
	stream := c.q.stream
	var purge []jetstream.ConsumerInfo
	list := stream.ListConsumers(ctx)
	for ci := range list.Info() {
		if tok, ok := strings.CutPrefix(ci.Name, ConsumerName+"_"); !(ci.Name == ConsumerName || ok && validLane(tok)) {
			continue
		}
		if ci.AckFloor.Stream > 0 && ci.Config.FilterSubject != "" {
			purge = append(purge, *ci)
		}
	}
	if err := list.Err(); err != nil {
		return 0, unavailable("consumers of "+c.q.name, err)
	}
	var removed uint64
	for _, ci := range purge {
		floor, filter := ci.AckFloor.Stream, ci.Config.FilterSubject
		first, err := stream.GetMsg(ctx, 1, jetstream.WithGetMsgSubject(filter))
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			continue
		case err != nil:
			return removed, unavailable("stream of "+c.q.name, err)
		case first.Sequence > floor:
			continue // the usual case: nothing acknowledged is left
		}
		n, err := c.purgeBelow(ctx, filter, floor+1)
		if err != nil {
			return removed, err
		}
		removed += n
	}
	return removed, nil
}

// purgeBelow purges the messages on filter below seq from the queue's stream and
// returns how many went (JetStream's purge answer says; nats.go's Purge drops it).
func (c *Consumer) purgeBelow(ctx context.Context, filter string, seq uint64) (uint64, error) {
	req, err := json.Marshal(struct {
		Filter string `json:"filter"`
		Seq    uint64 `json:"seq"`
	}{filter, seq})
	if err != nil {
		return 0, err
	}
	msg, err := c.q.store.nc.RequestWithContext(ctx, "$JS.API.STREAM.PURGE."+c.q.StreamName(), req)
	if err != nil {
		return 0, unavailable("purge acknowledged orders of "+c.q.name, err)
	}
	var resp struct {
		Purged uint64 `json:"purged"`
		Error  *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, unavailable("purge acknowledged orders of "+c.q.name, err)
	}
	if resp.Error != nil {
		return 0, unavailable("purge acknowledged orders of "+c.q.name, errors.New(resp.Error.Description))
	}
	return resp.Purged, nil
}
