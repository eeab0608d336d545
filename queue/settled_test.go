package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestStatusAndCancelOfAnOrderJustSettled: a status request or a cancel that reads a
// scheduled order's ticket record before a dispatcher settles it (no record yet: the
// first attempt), and looks for its message after the dispatcher acknowledged it (the
// message is gone), must answer from the final record the dispatcher wrote before it
// acknowledged: done, and not cancellable. It answered "no such ticket" (404) for an
// order that had been delivered. Other queues in the store widen the window: Status
// and Cancel look for the message in every queue, one after the other. Even tickets
// are asked for their status; odd ones are cancelled once they fell due (they may
// still be cancelled then, if no dispatcher took them yet).
func TestStatusAndCancelOfAnOrderJustSettled(t *testing.T) {
	srv := natstest.Start(t)
	cfgs := []queueconfig.Config{scheduledConfig("sched")}
	for i := range 24 {
		cfgs = append(cfgs, scheduledConfig(fmt.Sprintf("pad%02d", i)))
	}
	s := openStore(t, srv, cfgs...)
	c := consumer(t, s, "sched")
	ctx := ctxT(t)
	const n = 40
	var tickets []string
	due := time.Now().Add(3 * time.Second)
	for range n {
		rc, err := s.Park(ctx, at("sched", "x", due))
		if err != nil {
			t.Fatal(err)
		}
		tickets = append(tickets, rc.Ticket)
	}

	// One dispatcher, settling each order as soon as it comes (a fast downstream).
	var mu sync.Mutex
	delivered := map[string]int{}
	dctx, stop := context.WithCancel(context.Background())
	var dwg sync.WaitGroup
	dwg.Add(1)
	go func() {
		defer dwg.Done()
		for dctx.Err() == nil {
			nctx, cancel := context.WithTimeout(dctx, 500*time.Millisecond)
			l, err := c.Next(nctx)
			cancel()
			if err != nil {
				continue
			}
			if l.Load(ctx) != nil || l.Start(ctx) != nil {
				continue
			}
			mu.Lock()
			delivered[l.Message().Ticket]++
			mu.Unlock()
			if err := l.Done(ctx, &queue.Result{StatusCode: 200}); err != nil {
				t.Errorf("done: %v", err)
			}
		}
	}()

	cancelled := make([]bool, n)
	var wg sync.WaitGroup
	for i, tk := range tickets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Until it is final (status) or decided (cancel); the test's context bounds it.
			for ctx.Err() == nil {
				rec, err := s.Status(ctx, tk)
				switch {
				case errors.Is(err, queue.ErrNotFound):
					t.Errorf("status of %s: %v", tk, err)
					return
				case err != nil:
					t.Errorf("status of %s: %v", tk, err)
					return
				case rec.Status.Final():
					return
				case i%2 == 0 || rec.Status == queue.StatusScheduled:
					continue
				}
				switch err := s.Cancel(ctx, tk); {
				case err == nil:
					cancelled[i] = true
					return
				case errors.Is(err, queue.ErrNotCancellable):
					return
				case errors.Is(err, queue.ErrCancelUndecided):
				default:
					t.Errorf("cancel of %s once due: %v", tk, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	// Every order is settled now (final, or cancelled); what the dispatcher took after
	// a cancel it drops unseen.
	waitFor(t, func() bool {
		q, _ := s.Queue("sched")
		d, err := q.Depth(ctx)
		return err == nil && d == 0
	})
	stop()
	dwg.Wait()
	for i, tk := range tickets {
		if d := delivered[tk]; cancelled[i] && d != 0 || !cancelled[i] && d != 1 {
			t.Errorf("order %s: cancelled %v, delivered %d times", tk, cancelled[i], d)
		}
	}
}
