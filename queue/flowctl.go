package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
)

// FlowsBucket is the key-value bucket of the operators' settings of flow keys (see
// FlowControl). It is made by the first Queue.SetFlow.
const FlowsBucket = "sluice_flows"

// MaxFlowControls caps the flow keys of one queue with settings of their own.
const MaxFlowControls = 10_000

// FlowControl is what an operator set for one flow key of a queue with flow_by
// (queueconfig.FlowBy), on every replica: a pause and a pinned rate. The zero value
// sets nothing.
type FlowControl struct {
	// PausedUntil holds the key's orders until then (zero or past: not paused); the
	// queue's other keys go on.
	PausedUntil time.Time `json:"paused_until,omitzero"`
	// Rate replaces the queue's flow_by rate for this key (zero: the queue's).
	Rate limiter.Rate `json:"rate,omitzero"`
}

// IsZero reports whether fc sets nothing (a past pause counts as none).
func (fc FlowControl) IsZero() bool { return fc.Rate.IsZero() && fc.PausedUntil.IsZero() }

// Paused reports whether the key is paused at now.
func (fc FlowControl) Paused(now time.Time) bool { return fc.PausedUntil.After(now) }

// flowEntry is the bucket key of a flow key's settings.
func flowEntry(queue, key string) string { return queue + "." + key }

// flowControls returns the bucket of flow settings, creating it when create is set;
// without, a missing bucket is ErrNotFound.
func (s *Store) flowControls(ctx context.Context, create bool) (jetstream.KeyValue, error) {
	kv, err := s.js.KeyValue(ctx, FlowsBucket)
	switch {
	case err == nil:
		return kv, nil
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, unavailable("flow settings", err)
	case !create:
		return nil, ErrNotFound
	}
	kv, err = s.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      FlowsBucket,
		Description: "sluice settings of flow keys (pause, pinned rate)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    max(s.opts.replicas, 1),
		// A pause or rate of an idle key must not stay forever: the longest pause,
		// and then the setting goes.
		TTL: 367 * 24 * time.Hour,
	})
	if err != nil {
		return nil, unavailable("flow settings", err)
	}
	return kv, nil
}

// SetFlow sets the flow key of value's settings in the queue (value as the
// request carries it, such as a merchant's id; it is hashed at once, as Park does,
// and neither stored nor logged). A zero fc removes them. Errors: ErrInvalidRequest
// (the queue has no flow_by, a rate that is not valid, too many keys with settings),
// ErrUnavailable.
func (q *Queue) SetFlow(ctx context.Context, value string, fc FlowControl) error {
	f := q.Config().FlowBy
	if !f.Enabled() {
		return fmt.Errorf("%w: queue %q has no flow_by", ErrInvalidRequest, q.name)
	}
	if !fc.Rate.IsZero() {
		f.Rate = fc.Rate
		if err := f.Limit().Validate(); err != nil {
			return fmt.Errorf("%w: rate %s: %w", ErrInvalidRequest, fc.Rate, err)
		}
	}
	key := q.store.flowKeyFor(q.Config(), value)
	kv, err := q.store.flowControls(ctx, !fc.IsZero())
	if errors.Is(err, ErrNotFound) {
		return nil // nothing to remove
	}
	if err != nil {
		return err
	}
	entry := flowEntry(q.name, key)
	if fc.IsZero() {
		if err := kv.Delete(ctx, entry); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return unavailable("flow settings", err)
		}
		q.store.log.Info("flow key settings removed", "queue", q.name, "flow_key", key)
		return nil
	}
	if _, err := kv.Get(ctx, entry); errors.Is(err, jetstream.ErrKeyNotFound) {
		n, err := q.countFlows(ctx, kv)
		if err != nil {
			return err
		}
		if n >= MaxFlowControls {
			return fmt.Errorf("%w: queue %q has settings for %d flow keys already (at most %d)", ErrInvalidRequest, q.name, n, MaxFlowControls)
		}
	}
	val, err := q.store.seal("flow", entry, fc)
	if err != nil {
		return err
	}
	if _, err := kv.Put(ctx, entry, val); err != nil {
		return unavailable("flow settings", err)
	}
	q.store.log.Info("flow key settings set", "queue", q.name, "flow_key", key,
		"paused_until", fc.PausedUntil.UTC().Format(time.RFC3339), "rate", fc.Rate.String())
	return nil
}

// Flow returns the settings of value's flow key (zero: none).
func (q *Queue) Flow(ctx context.Context, value string) (FlowControl, error) {
	all, err := q.Flows(ctx)
	return all[q.store.flowKeyFor(q.Config(), value)], err
}

// Flows returns the settings of the queue's flow keys, by flow key (Message.FlowKey).
// Entries that do not verify (not written by a sluice with the store's key) are
// left out.
func (q *Queue) Flows(ctx context.Context) (map[string]FlowControl, error) {
	out := map[string]FlowControl{}
	kv, err := q.store.flowControls(ctx, false)
	if errors.Is(err, ErrNotFound) {
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	err = q.eachFlow(ctx, kv, func(e jetstream.KeyValueEntry) {
		var fc FlowControl
		if err := q.store.unseal("flow", e.Key(), e.Value(), &fc); err != nil {
			q.store.log.Warn("flow key settings do not verify; ignored", "queue", q.name, "entry", e.Key(), "err", err)
			return
		}
		out[strings.TrimPrefix(e.Key(), q.name+".")] = fc
	})
	return out, err
}

func (q *Queue) countFlows(ctx context.Context, kv jetstream.KeyValue) (int, error) {
	n := 0
	err := q.eachFlow(ctx, kv, func(jetstream.KeyValueEntry) { n++ })
	return n, err
}

// eachFlow calls f with each entry of the queue's flow keys in kv.
func (q *Queue) eachFlow(ctx context.Context, kv jetstream.KeyValue, f func(jetstream.KeyValueEntry)) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := kv.Watch(wctx, q.name+".*", jetstream.IgnoreDeletes())
	if err != nil {
		return unavailable("flow settings", err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return unavailable("flow settings", errors.New("watch ended"))
			}
			if e == nil {
				return nil // every current entry was read
			}
			f(e)
		case <-wctx.Done():
			return unavailable("flow settings", wctx.Err())
		}
	}
}
