package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// MetadataConfig is the stream metadata key under which Declare keeps a queue's
// configuration (JSON of queueconfig.Config, defaults applied), so that any process can drain the
// queue after it left the rules.
const MetadataConfig = "sluice.queue.config"

func configMetadata(cfg queueconfig.Config) map[string]string {
	b, err := json.Marshal(cfg)
	if err != nil { // queueconfig.Config has only plain fields; cannot happen
		return nil
	}
	return map[string]string{MetadataConfig: string(b)}
}

// configFromStream rebuilds the configuration Declare stored with a queue's stream.
func configFromStream(info *jetstream.StreamInfo) (queueconfig.Config, error) {
	name := strings.TrimPrefix(info.Config.Name, StreamPrefix)
	raw, ok := info.Config.Metadata[MetadataConfig]
	if !ok {
		return queueconfig.Config{}, fmt.Errorf("%w: stream %s has no stored queue configuration (declared by an older sluice)", ErrInvalidConfig, info.Config.Name)
	}
	var cfg queueconfig.Config
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		return queueconfig.Config{}, fmt.Errorf("%w: stream %s: stored queue configuration: %w", ErrInvalidConfig, info.Config.Name, err)
	}
	if cfg.Name != name {
		return queueconfig.Config{}, fmt.Errorf("%w: stream %s stores the configuration of queue %q", ErrInvalidConfig, info.Config.Name, cfg.Name)
	}
	// The callback secret is not stored (it is a secret): without it, no callbacks.
	cfg.CallbackHosts = nil
	if err := cfg.Validate(); err != nil {
		return queueconfig.Config{}, err
	}
	return cfg.WithDefaults(), nil
}

// Orphan is a queue stream that the rules no longer declare.
type Orphan struct {
	Name  string
	Depth uint64
	// Queue is the adopted queue, draining with its stored configuration; nil when
	// the stream has no usable stored configuration (Err says why): such a stream
	// is not drained until its queue is declared again or it is retired.
	Queue *Queue
	Err   error
}

// AdoptOrphans makes the store follow queues that left the rules: every queue of the
// store not named in declared is marked orphaned (it keeps its configuration), and
// every queue stream on the server that the store does not know is added from the
// configuration stored with it, marked orphaned. Orphaned queues stay in Queues, so
// their tickets' Status works and dispatchers keep draining them; Retire deletes one.
// A queue named in declared must have been declared (Declare) before; its orphaned mark
// is not cleared here. It returns every orphan, sorted by name.
func (s *Store) AdoptOrphans(ctx context.Context, declared []string) ([]Orphan, error) {
	for _, q := range s.Queues() {
		if !slices.Contains(declared, q.name) {
			q.orphaned.Store(true)
		}
	}
	var orphans []Orphan
	streams := s.js.ListStreams(ctx, jetstream.WithStreamListSubject("sluice.q.>"))
	for info := range streams.Info() {
		name, ok := strings.CutPrefix(info.Config.Name, StreamPrefix)
		if !ok || !queueconfig.ValidName(name) || slices.Contains(declared, name) {
			continue
		}
		o := Orphan{Name: name, Depth: info.State.Msgs}
		if q, err := s.Queue(name); err == nil {
			o.Queue = q
		} else if cfg, err := configFromStream(info); err != nil {
			o.Err = err
		} else if stream, err := s.js.Stream(ctx, info.Config.Name); err != nil {
			return nil, unavailable("stream of "+name, err)
		} else {
			o.Queue = s.add(cfg, stream, nil, true)
			o.Queue.noteLanes(ctx)
		}
		orphans = append(orphans, o)
	}
	if err := streams.Err(); err != nil {
		return nil, unavailable("list queue streams", err)
	}
	// Orphans whose stream is gone (retired elsewhere) leave the store.
	for _, q := range s.Queues() {
		if q.Orphaned() && !slices.ContainsFunc(orphans, func(o Orphan) bool { return o.Name == q.name }) {
			s.forget(q)
		}
	}
	slices.SortFunc(orphans, func(a, b Orphan) int { return strings.Compare(a.Name, b.Name) })
	return orphans, nil
}

// Orphaned reports whether the queue left the rules and drains with the configuration
// it was declared with.
func (q *Queue) Orphaned() bool { return q.orphaned.Load() }

func (s *Store) forget(q *Queue) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.queues[q.name] == q {
		delete(s.queues, q.name)
	}
}

// Retire deletes the stream of a queue that the rules no longer declare. It refuses
// (ErrNotEmpty) while the queue holds orders or dead letters, unless drop is true:
// then they are deleted with it (their tickets answer ErrNotFound). A queue the rules
// declare is refused with ErrDeclared; an unknown one with ErrUnknownQueue. It returns
// the number of orders dropped.
func (s *Store) Retire(ctx context.Context, name string, drop bool) (uint64, error) {
	if !queueconfig.ValidName(name) {
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	q, err := s.Queue(name)
	if err == nil && !q.Orphaned() {
		return 0, fmt.Errorf("%w: %q: remove it from the rules first", ErrDeclared, name)
	}
	stream, err := s.js.Stream(ctx, StreamName(name))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		if q != nil {
			s.forget(q)
		}
		return 0, fmt.Errorf("%w: %q", ErrUnknownQueue, name)
	}
	if err != nil {
		return 0, unavailable("stream of "+name, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, unavailable("stream of "+name, err)
	}
	dead, err := s.DeadLetters(ctx, name, 1)
	if err != nil {
		return 0, err
	}
	depth := info.State.Msgs
	if !drop && (depth > 0 || len(dead) > 0) {
		return 0, fmt.Errorf("%w: %q has %d orders queued and %d+ dead letters", ErrNotEmpty, name, depth, len(dead))
	}
	if len(dead) > 0 {
		if _, err := s.PurgeDeadLetters(ctx, name); err != nil {
			return 0, err
		}
	}
	// With the key stream of an earlier sluice, if it is still there (see keyStream).
	for _, stream := range []string{StreamName(name), KeyStreamName(name), fileKeyStreamName(name)} {
		if err := s.js.DeleteStream(ctx, stream); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return 0, unavailable("delete stream "+stream, err)
		}
	}
	if q != nil {
		s.forget(q)
	}
	s.log.Info("queue retired", "queue", name, "dropped", depth)
	return depth, nil
}
