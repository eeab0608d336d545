package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/internal/jsproto"
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
	return s.flowBucket(ctx, create, "flow settings", jetstream.KeyValueConfig{
		Bucket:      FlowsBucket,
		Description: "sluice settings of flow keys (pause, pinned rate)",
		History:     1,
		Storage:     jetstream.FileStorage,
		// A pause or rate of an idle key must not stay forever: the longest pause,
		// and then the setting goes.
		TTL: 367 * 24 * time.Hour,
	})
}

// flowBucket returns the bucket of cfg, creating it (with the store's replicas) when
// create is set; without, a missing bucket is ErrNotFound. what names it in errors.
func (s *Store) flowBucket(ctx context.Context, create bool, what string, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := s.js.KeyValue(ctx, cfg.Bucket)
	switch {
	case err == nil:
		return kv, nil
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, unavailable(what, err)
	case !create:
		return nil, ErrNotFound
	}
	cfg.Replicas = max(s.opts.replicas, 1)
	kv, err = s.js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) { // created meanwhile: used as it is, as above
		kv, err = s.js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, unavailable(what, err)
	}
	return kv, nil
}

// flowChangeTries bounds the reads and writes of one ChangeFlow that meets changes
// made meanwhile by other replicas.
const flowChangeTries = 10

// SetFlow sets the settings of value's flow key in the queue (value as the request
// carries it, such as a merchant's id; it is hashed at once, as Park does, and
// neither stored nor logged), whatever they were. A zero fc removes them. Errors as
// ChangeFlow's.
func (q *Queue) SetFlow(ctx context.Context, value string, fc FlowControl) error {
	_, err := q.ChangeFlow(ctx, value, func(c *FlowControl) { *c = fc })
	return err
}

// ChangeFlow applies change to the settings of value's flow key (see SetFlow for
// value) and stores the result, which it returns: zero settings remove the entry, and
// a pause already past is dropped. The read and the write are one step checked against
// the entry's revision: when another replica changed the entry in between, it is read
// again and change applied to what it holds now (at most flowChangeTries times, then
// ErrUnavailable), so two concurrent changes (a pause here, a rate there) both hold.
// change may be called more than once. Errors: ErrInvalidRequest (the queue has no
// flow_by, a rate that is not valid, too many keys with settings), ErrUnavailable.
func (q *Queue) ChangeFlow(ctx context.Context, value string, change func(*FlowControl)) (FlowControl, error) {
	cfg := q.Config()
	if !cfg.FlowBy.Enabled() {
		return FlowControl{}, fmt.Errorf("%w: queue %q has no flow_by", ErrInvalidRequest, q.name)
	}
	key := q.store.flowKeyFor(cfg, value)
	entry := flowEntry(q.name, key)
	for range flowChangeTries {
		kv, err := q.store.flowControls(ctx, false)
		var have FlowControl
		var rev uint64
		switch {
		case errors.Is(err, ErrNotFound):
			// No bucket yet: made below if the change sets something.
		case err != nil:
			return FlowControl{}, err
		default:
			if have, rev, err = q.readFlow(ctx, kv, entry); err != nil {
				return FlowControl{}, err
			}
		}
		fc := have
		change(&fc)
		now := time.Now()
		if !fc.Paused(now) {
			fc.PausedUntil = time.Time{}
		}
		if !fc.Rate.IsZero() {
			f := cfg.FlowBy
			f.Rate = fc.Rate
			if err := f.Limit().Validate(); err != nil {
				return FlowControl{}, fmt.Errorf("%w: rate %s: %w", ErrInvalidRequest, fc.Rate, err)
			}
		}
		switch {
		case fc.IsZero() && rev == 0:
			return fc, nil // nothing to remove
		case fc.IsZero():
			err = kv.Delete(ctx, entry, jetstream.LastRevision(rev))
		default:
			if kv == nil {
				if kv, err = q.store.flowControls(ctx, true); err != nil {
					return FlowControl{}, err
				}
			}
			err = q.writeFlow(ctx, kv, entry, fc, rev)
		}
		switch {
		case revisionConflict(err):
			continue // changed meanwhile: read it again
		case err != nil:
			return FlowControl{}, err
		}
		if fc.IsZero() {
			q.store.log.Info("flow key settings removed", "queue", q.name, "flow_key", key)
		} else {
			q.store.log.Info("flow key settings set", "queue", q.name, "flow_key", key,
				"paused_until", fc.PausedUntil.UTC().Format(time.RFC3339), "rate", fc.Rate.String())
		}
		return fc, nil
	}
	return FlowControl{}, fmt.Errorf("%w: flow settings of %s in queue %q: changed by others %d times in a row", ErrUnavailable, key, q.name, flowChangeTries)
}

// readFlow returns the settings entry holds in kv and its revision (0: none). An
// entry that does not verify reads as no settings, with its revision, so that a write
// replaces it.
func (q *Queue) readFlow(ctx context.Context, kv jetstream.KeyValue, entry string) (FlowControl, uint64, error) {
	e, err := kv.Get(ctx, entry)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return FlowControl{}, 0, nil
	case err != nil:
		return FlowControl{}, 0, unavailable("flow settings", err)
	}
	var fc FlowControl
	if err := q.store.unseal("flow", entry, e.Value(), &fc); err != nil {
		q.store.log.Warn("flow key settings do not verify; ignored", "queue", q.name, "entry", entry, "err", err)
		return FlowControl{}, e.Revision(), nil
	}
	return fc, e.Revision(), nil
}

// writeFlow stores fc as entry in kv if the entry is still at revision rev (0: it does
// not exist; then the queue's keys with settings must be fewer than MaxFlowControls).
// A changed entry is an error revisionConflict tells.
func (q *Queue) writeFlow(ctx context.Context, kv jetstream.KeyValue, entry string, fc FlowControl, rev uint64) error {
	val, err := q.store.seal("flow", entry, fc)
	if err != nil {
		return err
	}
	if rev != 0 {
		_, err = kv.Update(ctx, entry, val, rev)
	} else {
		n, cerr := q.countFlows(ctx, kv)
		if cerr != nil {
			return cerr
		}
		if n >= MaxFlowControls {
			return fmt.Errorf("%w: queue %q has settings for %d flow keys already (at most %d)", ErrInvalidRequest, q.name, n, MaxFlowControls)
		}
		_, err = kv.Create(ctx, entry, val)
	}
	if err != nil && !revisionConflict(err) {
		return unavailable("flow settings", err)
	}
	return err
}

// revisionConflict reports whether err is JetStream's refusal of a write or delete
// expecting another revision of the entry (the entry changed since it was read).
func revisionConflict(err error) bool {
	return errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) ||
		jsproto.IsWrongLastSequence(err)
}

// Flow returns the settings of value's flow key (zero: none).
func (q *Queue) Flow(ctx context.Context, value string) (FlowControl, error) {
	kv, err := q.store.flowControls(ctx, false)
	if errors.Is(err, ErrNotFound) {
		return FlowControl{}, nil
	}
	if err != nil {
		return FlowControl{}, err
	}
	fc, _, err := q.readFlow(ctx, kv, flowEntry(q.name, q.store.flowKeyFor(q.Config(), value)))
	return fc, err
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
	return eachEntry(ctx, kv, q.name+".*", "flow settings", f)
}

// eachEntry calls f with each current entry of kv whose key matches pattern; what
// names the bucket in errors.
func eachEntry(ctx context.Context, kv jetstream.KeyValue, pattern, what string, f func(jetstream.KeyValueEntry)) error {
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	w, err := kv.Watch(wctx, pattern, jetstream.IgnoreDeletes())
	if err != nil {
		return unavailable(what, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return unavailable(what, errors.New("watch ended"))
			}
			if e == nil {
				return nil // every current entry was read
			}
			f(e)
		case <-wctx.Done():
			return unavailable(what, wctx.Err())
		}
	}
}
