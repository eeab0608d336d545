package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Declare creates the queue's stream, or updates it to cfg, and adds the queue to the
// store (replacing an earlier declaration of the same name: rules reloads call Declare
// again). The configuration is kept with the stream (its metadata), so that a queue
// that later leaves the rules still drains as declared: see AdoptOrphans.
func (s *Store) Declare(ctx context.Context, cfg queueconfig.Config) (*Queue, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.WithDefaults()
	if cfg.Scheduled() {
		if err := checkServerVersion(s.nc, MinScheduleServerVersion, "scheduled delivery (delay, max_delay)"); err != nil {
			return nil, fmt.Errorf("%w: queue %q: %w", ErrInvalidConfig, cfg.Name, err)
		}
	}
	if err := s.checkDownstreamStream(ctx, cfg); err != nil {
		return nil, err
	}
	cfg.DropHeaders = append([]string(nil), cfg.DropHeaders...)
	cfg.ResultHeaders = append([]string(nil), cfg.ResultHeaders...)
	qs := s.queueStream(cfg)
	// JetStream cannot turn message schedules off again: a stream that once had them
	// keeps them, whatever the queue's configuration says now.
	if cfg.Scheduled() || s.allowsSchedules(ctx, qs.Name) {
		scheduledStream(&qs, cfg.Name)
	}
	stream, err := s.ensureStream(ctx, qs)
	if err != nil {
		return nil, fmt.Errorf("%w: stream of queue %q: %w", ErrUnavailable, cfg.Name, err)
	}
	keys, err := s.ensureKeyStream(ctx, s.keyStream(cfg))
	if err != nil {
		return nil, fmt.Errorf("%w: key stream of queue %q: %w", ErrUnavailable, cfg.Name, err)
	}
	// Callback jobs are written when an order ends, by whichever process settles it:
	// their stream must exist from the moment such a queue takes orders.
	if len(cfg.CallbackHosts) > 0 {
		if _, err := s.ensureCallbackStream(ctx); err != nil {
			return nil, err
		}
	}
	q := s.add(cfg, stream, keys, false)
	q.noteLanes(ctx)
	return q, nil
}

// queueStream is the configuration of the stream of a queue of cfg (without
// schedules: see scheduledStream).
func (s *Store) queueStream(cfg queueconfig.Config) jetstream.StreamConfig {
	maxMsgs := cfg.MaxDepth
	if maxMsgs < 0 {
		maxMsgs = -1
	}
	maxBytes := cfg.MaxBytes
	if maxBytes == 0 {
		maxBytes = -1
	}
	return jetstream.StreamConfig{
		Name:        StreamName(cfg.Name),
		Description: "sluice queue " + cfg.Name,
		// Unlaned orders on sluice.q.{queue}.{ticket}, laned ones one token deeper
		// (ReadySubject); a stream of an older sluice is widened by this update.
		Subjects:  []string{"sluice.q." + cfg.Name + ".*", "sluice.q." + cfg.Name + ".*.*"},
		Retention: jetstream.WorkQueuePolicy,
		Storage:   jetstream.FileStorage,
		Discard:   jetstream.DiscardNew,
		MaxMsgs:   maxMsgs,
		MaxBytes:  maxBytes,
		// No MaxAge on the stream: JetStream would delete an expired order silently.
		// The dispatcher dead-letters orders older than cfg.MaxAge when it reaches
		// them, so every accepted order ends delivered, failed or dead, and visible.
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
		AllowDirect: true,
		// Park writes concurrent orders as one atomic batch (see groupCommit).
		AllowAtomicPublish: s.batches,
		Metadata:           configMetadata(cfg),
	}
}

// keyStream is the configuration of the key stream of a queue of cfg. Its slots are
// kept in memory, not on disk: a slot is no acceptance record (the order is, in the
// queue's file stream, and then the idempotency bucket's key), it only counts a key
// against its client's MaxIdempotencyKeys. Whatever a crash or a power cut takes of
// the slots therefore takes no order, ticket or key: every order accepted before it is
// still found by its key's repeats (its ticket is derived from the key, see
// Store.parkKeyed). It only resets the clients' counts, so the cap is exact while the
// servers run and starts afresh when they restart: a single server loses the stream
// with its slots (takeSlot declares it again); a cluster keeps the stream and its slots
// while a majority of its replicas runs (a memory stream replicates like a file one),
// and loses the slots when every server restarts. A server that refuses memory
// streams gets the stream on file (see ensureKeyStream), and so does one that makes
// the stream in memory and then refuses to store in it (see slotsToFile).
//
// The count cap bounds the memory that clients together can fill, however many they
// are: keySlots of the idempotency byte cap, so about that many bytes of each
// replica's memory a queue (the default 256 MiB: 419,430 slots, keys accepted within
// the IdempotencyTTL).
//
// A key stream on file of an earlier sluice (fileKeyStreamName) is left as it is: an
// older replica still running in a rolling upgrade parks with it, and would answer
// every keyed request 503 were it deleted; its slots expire with their TTL, and Retire
// deletes the stream. Meanwhile the older and the newer replicas count a client's
// slots apart, so its cap is up to twice MaxIdempotencyKeys until every replica runs
// this version and the older slots have expired.
func (s *Store) keyStream(cfg queueconfig.Config) jetstream.StreamConfig {
	storage := jetstream.MemoryStorage
	if s.slotsOnFile.Load() {
		storage = jetstream.FileStorage
	}
	return jetstream.StreamConfig{
		Name:                 KeyStreamName(cfg.Name),
		Description:          "sluice idempotency key slots of queue " + cfg.Name,
		Subjects:             []string{keySubjectFor(cfg.Name, "*")},
		Retention:            jetstream.LimitsPolicy,
		Storage:              storage,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		MaxMsgsPerSubject:    int64(cfg.MaxIdempotencyKeys),
		// A count, not a byte cap: JetStream reserves a byte cap from the store for
		// every stream that has one, and there is a key stream per queue.
		MaxMsgs:     keySlots(s.opts.idemMaxBytes),
		AllowMsgTTL: true,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    cfg.Replicas,
		AllowDirect: true,
		// Slots go out as plain publishes: a batch that failed or timed out is
		// published again one by one, and a slot of it that was stored after all comes
		// back a duplicate, which takeSlot cannot tell from a racing request's slot and
		// so never frees (TestRefusedKeyedParksLeaveNoSlots: 400 keyed parks of 4
		// clients racing into a full queue left 5 slots for 3 orders with batches). In
		// memory a publish waits for no disk that a batch could share.
		AllowAtomicPublish: false,
	}
}

// ensureStream creates the stream, or updates it when the settings sluice chooses
// differ from those it has. A stream that matches is left alone: every replica declares
// every stream at start (queues also on each reload), and a needless update rewrites
// the stream's configuration while other replicas, or this one's dispatchers, create
// consumers on it, which nats-server does not serialise (the race detector saw it when
// two dispatchers of a laned queue started together, when a queue's declaration met
// the callback sender's consumer on the callback stream, and when two replicas that
// started together both found the results stream absent).
func (s *Store) ensureStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := s.js.Stream(ctx, want.Name)
	if err != nil {
		st = nil // absent, or not known: creating or updating it says more
	}
	return s.ensureFrom(ctx, st, want)
}

// ensureFrom is ensureStream for the stream have as just looked up (nil: none).
func (s *Store) ensureFrom(ctx context.Context, have jetstream.Stream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	if have != nil && sameStream(have.CachedInfo().Config, want) {
		return have, nil
	}
	if have == nil {
		// Created, not updated: another replica starting together may have just
		// created it, with the same settings (the server then answers with the
		// stream, untouched) or with others (only then is it updated).
		st, err := s.js.CreateStream(ctx, want)
		if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return st, err
		}
	}
	return s.js.CreateOrUpdateStream(ctx, want)
}

// ensureKeyStream is ensureStream for a queue's key stream (see keyStream). A server
// that refuses the stream in memory (its JetStream or the account has no memory store,
// or too little) gets it on file, with a warning: slots then survive restarts of the
// server. JetStream cannot move a stream between storage types, so a key stream stays
// where it was made; delete it to have it made in memory.
func (s *Store) ensureKeyStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	st, err := s.js.Stream(ctx, want.Name)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		st = nil
	case err != nil:
		return nil, err
	default:
		want.Storage = st.CachedInfo().Config.Storage
	}
	got, err := s.ensureSlots(ctx, st, want)
	if err == nil || want.Storage != jetstream.MemoryStorage || !jsproto.IsNoMemory(err) {
		return got, err
	}
	s.slotsOnFile.Store(true) // the next queues' too
	want.Storage = jetstream.FileStorage
	got, ferr := s.ensureSlots(ctx, nil, want)
	if ferr != nil {
		return nil, errors.Join(err, ferr)
	}
	s.log.Warn("the idempotency key slots are on file: the server refused them in memory (give JetStream a memory store, or allow the account memory streams)",
		"stream", want.Name, "err", err)
	return got, nil
}

// ensureSlots is ensureFrom for a key stream, have as just looked up (nil: none). A
// single-replica key stream on file is written without waiting for the disk
// (nats-server's async persist mode, from 2.12 on), for the reasons a memory one is
// used (see keyStream); a crash of the server or its host loses the slots (and the
// deletions of freed slots) of its last sync interval, which lets their clients past
// the cap, or holds them to it by slots already freed, until the slots' TTL ends.
//
// JetStream cannot change a stream's persist mode. A synced key stream stays synced;
// an async one that must become replicated is made anew, and its clients' caps start
// afresh.
func (s *Store) ensureSlots(ctx context.Context, have jetstream.Stream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	if want.Storage == jetstream.FileStorage && want.Replicas <= 1 && s.batches {
		want.PersistMode = jetstream.AsyncPersistMode
	}
	if have != nil {
		switch cfg := have.CachedInfo().Config; {
		case cfg.PersistMode == want.PersistMode:
		case want.PersistMode == jetstream.AsyncPersistMode:
			want.PersistMode = cfg.PersistMode
		default:
			s.log.Warn("making the key stream anew: a replicated stream cannot skip disk syncs, and JetStream cannot change that on a stream",
				"stream", want.Name, "replicas", want.Replicas)
			if err := s.js.DeleteStream(ctx, want.Name); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				return nil, err
			}
			have = nil
		}
	}
	st, err := s.ensureFrom(ctx, have, want)
	if err != nil {
		// Another process declaring the queue may have made it meanwhile.
		if again, aerr := s.js.Stream(ctx, want.Name); aerr == nil && sameStream(again.CachedInfo().Config, want) {
			return again, nil
		}
	}
	return st, err
}

// sameStream reports whether have holds every setting sluice chooses in want (the
// server fills in the rest, and adds metadata of its own).
func sameStream(have, want jetstream.StreamConfig) bool {
	for k, v := range want.Metadata {
		if have.Metadata[k] != v {
			return false
		}
	}
	return have.Description == want.Description && slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention && have.Storage == want.Storage && have.Discard == want.Discard &&
		have.DiscardNewPerSubject == want.DiscardNewPerSubject && limit(have.MaxMsgs) == limit(want.MaxMsgs) &&
		limit(have.MaxBytes) == limit(want.MaxBytes) && limit(have.MaxMsgsPerSubject) == limit(want.MaxMsgsPerSubject) &&
		have.MaxAge == want.MaxAge && have.Duplicates == want.Duplicates && have.Replicas == want.Replicas &&
		have.AllowDirect == want.AllowDirect && have.AllowAtomicPublish == want.AllowAtomicPublish &&
		have.AllowMsgSchedules == want.AllowMsgSchedules && have.AllowRollup == want.AllowRollup &&
		have.AllowMsgTTL == want.AllowMsgTTL && have.SubjectDeleteMarkerTTL == want.SubjectDeleteMarkerTTL &&
		limit(have.MaxMsgSize) == limit(want.MaxMsgSize) && have.PersistMode == want.PersistMode
}

// sameBucket reports whether the stream of a key-value bucket, have, holds every
// setting of want that sluice chooses (the byte cap only when withCap).
func sameBucket(have jetstream.StreamConfig, want jetstream.KeyValueConfig, withCap bool) bool {
	return have.Description == want.Description && have.MaxMsgsPerSubject == int64(want.History) &&
		have.Storage == want.Storage && have.Replicas == want.Replicas &&
		(!withCap || limit(have.MaxBytes) == limit(want.MaxBytes)) &&
		have.SubjectDeleteMarkerTTL == want.LimitMarkerTTL && have.AllowMsgTTL
}

// limit is a stream limit as the server keeps it: none (0 when asked for) is -1.
func limit[T int32 | int64](v T) T {
	if v <= 0 {
		return -1
	}
	return v
}

// scheduledStream turns a queue's stream config into one that holds scheduled orders:
// JetStream message schedules on the schedule subjects, which fire onto the ready
// subjects of the same stream. JetStream refuses schedules on a discard-new stream (a
// due order could find no room and be lost), so the stream has no MaxMsgs or MaxBytes
// of its own: Park keeps the queue's caps itself (see Queue.checkRoom), and an order
// once accepted always finds room when it falls due. Roll-ups, which schedules need,
// are allowed: whoever may publish on the stream's subjects may therefore purge them
// too, which NATS permissions guard as they guard deletes.
func scheduledStream(c *jetstream.StreamConfig, queue string) {
	c.Subjects = append(c.Subjects, scheduleFilter(queue))
	c.Discard = jetstream.DiscardOld
	c.MaxMsgs, c.MaxBytes = -1, -1
	c.AllowMsgSchedules = true
	c.AllowRollup = true
}

// allowsSchedules reports whether the named stream exists and has message schedules
// on (a lookup failure counts as no: creating or updating the stream then says more).
func (s *Store) allowsSchedules(ctx context.Context, name string) bool {
	st, err := s.js.Stream(ctx, name)
	return err == nil && st.CachedInfo().Config.AllowMsgSchedules
}

// add adds (or updates) a queue of the store. keys is nil for an orphaned queue: the
// rules no longer name it, so nothing is parked in it.
func (s *Store) add(cfg queueconfig.Config, stream, keys jetstream.Stream, orphaned bool) *Queue {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[cfg.Name]
	if q == nil {
		q = &Queue{store: s, name: cfg.Name}
		s.queues[cfg.Name] = q
		// Every queue's series from 0 on: an alert on their increase sees the first one.
		s.metrics.parked.WithLabelValues(cfg.Name)
		s.metrics.unacked.WithLabelValues(cfg.Name)
	}
	// A stream handle names its stream: the first one serves for good, so readers
	// never race a re-declaration. A key stream is added when an orphan (which has
	// none) is declared again, before rules that park in it go live.
	if q.stream == nil {
		q.stream = stream
	}
	if q.keys == nil && keys != nil {
		q.keys = keys
	}
	if keys != nil {
		q.slots.Store(s.writer(q.slots.Load(), KeyStreamName(cfg.Name), keys))
	}
	q.orders.Store(s.writer(q.orders.Load(), StreamName(cfg.Name), stream))
	q.cfg.Store(&cfg)
	q.orphaned.Store(orphaned)
	if info := stream.CachedInfo(); info != nil {
		q.schedules.Store(info.Config.AllowMsgSchedules)
	}
	return q
}

// noteLanes keeps mayHaveLanes. A stream's laned orders are looked for once, at the
// first declaration, in case an earlier configuration laned the queue. Another process
// that parks in lanes later (a configuration rolling out) is seen when this one's
// configuration lanes the queue too.
func (q *Queue) noteLanes(ctx context.Context) {
	if q.Config().Laned() {
		q.mayHaveLanes.Store(true)
		return
	}
	if q.lanesChecked.Swap(true) {
		return
	}
	// A laned order, or a schedule message (whose target lane shows only when it fires).
	subjects := []string{ReadySubject(q.name, "*", "*")}
	if q.schedules.Load() {
		subjects = append(subjects, scheduleFilter(q.name))
	}
	for _, subject := range subjects {
		_, err := q.store.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: 1, Next: subject})
		if !errors.Is(err, jetstream.ErrMsgNotFound) { // found, or not known: look in lanes
			q.mayHaveLanes.Store(true)
			return
		}
	}
}

// writer returns w, Park's writer of the named stream, or a new one when w is nil or
// batches otherwise than the stream's settings (as just declared) call for: a queue
// that became replicated, or a key stream made anew (see ensureKeyStream). Writes
// under way finish on the writer they started with.
func (s *Store) writer(w *groupCommit, name string, stream jetstream.Stream) *groupCommit {
	if d := directWrites(stream); w == nil || w.direct != d {
		return newGroupCommit(s.nc, s.js, name, s.opts.publishTimeout, d)
	}
	return w
}

// fileDirectWrites is directWrites for a single-replica file stream. nats-server
// stages each atomic batch of such a stream in a file store of its own, made and
// removed for the batch: measured on 2.15.2 (sluice-bench parking on a shared disk),
// 15–30ms a batch against 1–4ms a synced publish, so a batch pays only for more
// waiting writes than this; at 16 concurrent Parks batches and plain publishes came
// out even, at 64 batches won.
const fileDirectWrites = 16

// directWrites returns how many of Park's writes to stream go out as plain publishes
// at once before the others wait for an atomic batch (see groupCommit): 0 when the
// stream takes no atomic batches (a server older than 2.12 drops AllowAtomicPublish),
// 1 when the server stages a batch in memory (a replicated stream, or one in memory),
// fileDirectWrites else.
func directWrites(stream jetstream.Stream) int {
	info := stream.CachedInfo()
	switch {
	case info == nil || !info.Config.AllowAtomicPublish:
		return 0
	case info.Config.Replicas > 1 || info.Config.Storage == jetstream.MemoryStorage:
		return 1
	}
	return fileDirectWrites
}

// checkDownstreamStream makes sure the subject of an at-least-once nats: downstream is
// captured by a stream. Checked at every declaration (start, reload); a stream deleted
// later makes deliveries fail as a downstream that is down.
func (s *Store) checkDownstreamStream(ctx context.Context, cfg queueconfig.Config) error {
	subj := cfg.NATSSubject()
	if subj == "" || cfg.Delivery == queueconfig.AtMostOnce {
		return nil
	}
	_, err := s.js.StreamNameBySubject(ctx, subj)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return fmt.Errorf("%w: queue %q, subject %q: create a stream for it (for example nats stream add --subjects %s), or give the queue delivery: at_most_once", ErrNoStream, cfg.Name, subj, subj)
	}
	return fmt.Errorf("%w: queue %q: looking up the stream of subject %q: %w", ErrUnavailable, cfg.Name, subj, err)
}
