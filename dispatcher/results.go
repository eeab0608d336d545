package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// runResults writes the results consumers of nats: downstreams publish
// (queue.ResultConsumer) into their tickets until ctx ends. Every dispatcher runs it;
// they share the consumer.
func (d *Dispatcher) runResults(ctx context.Context) {
	var rc *queue.ResultConsumer
	for attempt := 1; rc == nil; attempt++ {
		var err error
		if rc, err = d.store.ResultConsumer(ctx); err != nil {
			d.log.Warn("results: cannot reach the result stream; retrying", "err", err)
			if d.opts.clock.Sleep(ctx, retryDelay(queueconfig.Backoff{Initial: time.Second, Max: 30 * time.Second}, attempt)) != nil {
				return
			}
		}
	}
	for ctx.Err() == nil {
		ticket, err := rc.Next(ctx, 5*time.Second)
		switch {
		case errors.Is(err, queue.ErrResultRefused):
			d.log.Warn("result refused", "err", err)
		case err != nil:
			d.log.Warn("results: cannot write a result; retrying", "err", err)
			if d.opts.clock.Sleep(ctx, time.Second) != nil {
				return
			}
		case ticket != "":
			d.log.Debug("result written", "ticket", ticket)
		}
	}
}
