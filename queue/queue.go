package queue

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Queue is a declared queue, or an orphaned one (see AdoptOrphans).
type Queue struct {
	store    *Store
	name     string
	cfg      atomic.Pointer[queueconfig.Config]
	stream   jetstream.Stream
	keys     jetstream.Stream            // key slots (KeyStreamName); nil for an orphan
	orders   atomic.Pointer[groupCommit] // Park's writes to stream
	slots    atomic.Pointer[groupCommit] // Park's writes to keys; nil with keys
	slotsMu  sync.Mutex                  // held while the key stream moves to file (see slotsToFile)
	orphaned atomic.Bool
	// schedules: the stream holds scheduled orders (see scheduledStream); Park then
	// enforces MaxDepth and MaxBytes itself.
	schedules atomic.Bool

	samples outflowSamples

	// mayHaveLanes is true when a ticket's order may wait in a lane (see parked): the
	// queue is laned, was when this store declared it before, or its stream held a
	// laned order when this store first declared it (lanesChecked).
	mayHaveLanes atomic.Bool
	lanesChecked atomic.Bool

	infoMu   sync.Mutex
	info     *jetstream.StreamInfo
	infoAt   time.Time
	infoLock sync.Mutex // held while one caller refreshes
	// firstReady is, in a queue that takes schedules, the sequence of its first ready
	// order (see position), looked up at firstReadyAt along with a refresh of info.
	firstReady   uint64
	firstReadyAt time.Time
}

// Name returns the queue name.
func (q *Queue) Name() string { return q.name }

// Config returns the queue's configuration (with defaults applied).
func (q *Queue) Config() queueconfig.Config { return *q.cfg.Load() }

// StreamName returns the name of the queue's stream.
func (q *Queue) StreamName() string { return StreamName(q.name) }

// Store returns the store the queue belongs to.
func (q *Queue) Store() *Store { return q.store }

// subject is the subject of a ticket's order without a lane (see ReadySubject).
func (q *Queue) subject(ticket string) string { return ReadySubject(q.name, "", ticket) }

// Depth returns the number of queued messages (fresh from the server).
func (q *Queue) Depth(ctx context.Context) (uint64, error) {
	info, err := q.streamInfo(ctx, 0)
	if err != nil {
		return 0, err
	}
	return info.State.Msgs, nil
}

// streamInfo returns stream info at most maxAge old (maxAge 0: fresh). When a refresh
// is due and another caller is already refreshing, the older value is returned rather
// than waiting; a failed refresh also falls back to it, and so does one without an
// answer within jsproto.LeaderWait: only a stream's leader answers, and a leader that
// is stopped or being replaced drops the request without a word, which would hold the
// caller (a Park whose order is already stored) until its own deadline.
func (q *Queue) streamInfo(ctx context.Context, maxAge time.Duration) (*jetstream.StreamInfo, error) {
	q.infoMu.Lock()
	cached, at, readyAt := q.info, q.infoAt, q.firstReadyAt
	q.infoMu.Unlock()
	useCached := cached != nil && maxAge > 0
	switch {
	case useCached && time.Since(at) < maxAge:
		return cached, nil
	case useCached:
		if !q.infoLock.TryLock() {
			return cached, nil
		}
	default:
		q.infoLock.Lock()
	}
	defer q.infoLock.Unlock()
	if useCached {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, jsproto.LeaderWait)
		defer cancel()
	}
	fresh, err := jsproto.AskAgain(ctx, func(ctx context.Context) (*jetstream.StreamInfo, error) { return q.stream.Info(ctx) })
	if err != nil {
		if useCached {
			return cached, nil
		}
		return nil, fmt.Errorf("%w: stream info of %q: %w", ErrUnavailable, q.name, err)
	}
	now := time.Now()
	// At most one lookup a second: a failed one keeps the older sequence, which is
	// lower than the true one (the first ready order only moves on), until then.
	lookUp := q.schedules.Load() && now.Sub(readyAt) >= time.Second
	var first uint64
	if lookUp {
		first = q.lookUpFirstReady(ctx, fresh)
	}
	q.infoMu.Lock()
	q.info, q.infoAt = fresh, now
	if lookUp {
		q.firstReadyAt = now
		if first != 0 {
			q.firstReady = first
		}
	}
	q.infoMu.Unlock()
	q.samples.add(now, fresh.State)
	return fresh, nil
}

// lookUpFirstReady returns the sequence of the queue's first ready order, in any lane
// (the stream's first sequence may be a schedule message waiting for a distant time):
// with none, the sequence the next message gets (as of info, just fetched); 0 when the
// lookup fails.
func (q *Queue) lookUpFirstReady(ctx context.Context, info *jetstream.StreamInfo) uint64 {
	raw, err := q.store.readMsg(ctx, q.stream, jsproto.MsgQuery{Seq: 1, Next: readyFilter(q.name)})
	switch {
	case err == nil:
		return raw.Sequence
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return info.State.LastSeq + 1
	}
	q.store.log.Debug("cannot look up the first ready order", "queue", q.name, "err", err)
	return 0
}

// position estimates how many queued messages are ahead of seq, plus one: the
// sequences from the first waiting order to seq, from stream information up to a
// second old. In a queue that takes schedules the first waiting order is its first
// ready one (looked up at a refresh of that information, at most once a second, so up
// to about two seconds old), not the stream's first message, which may be a schedule
// waiting for a distant time. The estimate still counts everything in between that is
// not waiting ahead of seq: schedule messages parked in between, orders already gone
// out of turn (cancelled, or delivered from another lane), and what was delivered
// since the lookup.
func (q *Queue) position(ctx context.Context, seq uint64) uint64 {
	info, err := q.streamInfo(ctx, time.Second)
	if err != nil {
		return 1
	}
	first := info.State.FirstSeq
	if q.schedules.Load() {
		q.infoMu.Lock()
		first = max(first, q.firstReady)
		q.infoMu.Unlock()
	}
	if first == 0 || seq < first {
		return 1
	}
	return seq - first + 1
}

// eta estimates when the message at position pos starts delivery.
func (q *Queue) eta(now time.Time, pos uint64) time.Time {
	if pos <= 1 {
		return now
	}
	r := q.Config().Outflow
	d := float64(pos-1) * float64(r.Period) / float64(r.Count)
	if d > float64(math.MaxInt64/2) {
		d = float64(math.MaxInt64 / 2)
	}
	return now.Add(time.Duration(d))
}

// softCapAge is how old the stream info may be by which Park keeps the caps of a queue
// with schedules: concurrent parks within it may each find the last free place, so such
// a queue can exceed MaxDepth by about as many orders as it takes in softCapAge.
const softCapAge = 100 * time.Millisecond

// checkRoom keeps MaxDepth and MaxBytes for a queue whose stream cannot (one with
// schedules, see scheduledStream): ErrFull (a *FullError) once they are reached,
// counting the scheduled orders. For any other queue JetStream itself refuses.
func (q *Queue) checkRoom(ctx context.Context) error {
	if !q.schedules.Load() {
		return nil
	}
	cfg := q.Config()
	info, err := q.streamInfo(ctx, softCapAge)
	if err != nil {
		return err
	}
	if (cfg.MaxDepth > 0 && info.State.Msgs >= uint64(cfg.MaxDepth)) || (cfg.MaxBytes > 0 && info.State.Bytes >= uint64(cfg.MaxBytes)) {
		return q.fullError(ctx)
	}
	return nil
}

// fullError describes the queue full now: its depth, the limit it reached (max_depth
// or max_bytes, by the stream's state), and when to come back.
func (q *Queue) fullError(ctx context.Context) *FullError {
	cfg := q.Config()
	fe := &FullError{Queue: q.name}
	if info, err := q.streamInfo(ctx, 0); err == nil {
		fe.Depth = info.State.Msgs
		switch {
		case cfg.MaxDepth > 0 && info.State.Msgs >= uint64(cfg.MaxDepth):
			fe.Limit, fe.Max = "max_depth", cfg.MaxDepth
		case cfg.MaxBytes > 0:
			// Not its depth, so its bytes: JetStream refuses a message that would take
			// the stream past them, however far below they are now.
			fe.Limit, fe.Max = "max_bytes", cfg.MaxBytes
		}
	}
	r := cfg.Outflow
	ra := time.Duration(float64(fe.Depth) / 10 * float64(r.Period) / float64(r.Count))
	fe.RetryAfter = max(ra.Round(time.Second), time.Second)
	return fe
}

// connected reports whether the connection can publish right now.
