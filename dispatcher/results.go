package dispatcher

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// openResults returns the consumer of the results that consumers of nats:
// downstreams publish (queue.ResultConsumer), declaring their stream, trying again until
// it can; nil when ctx ends first.
func (d *Dispatcher) openResults(ctx context.Context) *queue.ResultConsumer {
	for attempt := 1; ; attempt++ {
		rc, err := d.store.ResultConsumer(ctx)
		if err == nil {
			return rc
		}
		d.log.Warn("results: cannot reach the result stream; retrying", "err", err)
		if d.opts.clock.Sleep(ctx, retryDelay(queueconfig.Backoff{Initial: time.Second, Max: 30 * time.Second}, attempt)) != nil {
			return nil
		}
	}
}

// writeResults writes the results rc reads into their tickets until ctx ends. Every
// dispatcher runs it; they share the consumer.
func (d *Dispatcher) writeResults(ctx context.Context, rc *queue.ResultConsumer) {
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
