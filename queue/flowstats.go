package queue

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The figures of flow keys. The orders' subjects do not name their key, so the stream
// cannot count a key's orders without reading them; the dispatcher that leads a queue
// sees every order it fetches, and counts them. Each dispatcher publishes, every few
// seconds while it holds orders of a queue with flow_by (and once more when it holds
// none), the flow keys it holds orders of or started orders of lately to the bucket
// FlowStatsBucket, under {queue}.{replica} (a random id per dispatcher). The queue API
// reads the reports of a queue (one a dispatcher, so one in the steady state: one
// dispatcher leads a queue) and sums them per key. A report costs its dispatcher an
// encoding of its keys and one write of about 20 bytes a key; a reader one read of
// each report: neither a scan of the stream nor anything per key while it is idle.

// FlowStatsBucket is the key-value bucket of the dispatchers' reports of flow keys
// (FlowStat): memory storage, FlowStatsTTL.
const FlowStatsBucket = "sluice_flow_stats"

// FlowStatsTTL is how long a report lives after its last write; a report older than
// that by its own time is not read either. Dispatchers write theirs every 2 s.
const FlowStatsTTL = 15 * time.Second

// MaxFlowStats bounds the keys of one report: the keys with the most orders held,
// then the fastest, are kept (FlowReport.Truncated counts the others). A dispatcher
// holds at most max_in_flight + dispatcher.FlowPending orders of a queue, so the keys
// with orders fit.
const MaxFlowStats = 20_000

// maxFlowStatsBytes bounds a report's value, within any server's max payload.
const maxFlowStatsBytes = 512 << 10

// FlowStat is what a dispatcher knows of one flow key of a queue.
type FlowStat struct {
	// Key is the flow key (Message.FlowKey).
	Key string
	// Depth is the key's orders the dispatcher holds, not settled: delivering, or
	// handed back until the key's turn or the end of its pause. Orders it has not
	// fetched yet (past the first FlowPending of the queue, or behind a paused
	// queue), waiting for a retry after a failed attempt, or scheduled for later are
	// not counted: the queue's depth counts them.
	Depth int
	// PerSecond is the deliveries of the key the dispatcher started per second over
	// the last FlowRateWindow.
	PerSecond float64
}

// FlowRateWindow is what FlowStat.PerSecond is measured over.
const FlowRateWindow = 10 * time.Second

// FlowReport is the sum of the dispatchers' reports of a queue's flow keys.
type FlowReport struct {
	// Keys are the flow keys, by key. A key held by two dispatchers (right after a
	// fail-over, the old one's handed-back orders until it forgets them, at most a
	// minute) counts in both.
	Keys map[string]FlowStat
	// Reports is the number of reports read (dispatchers with keys lately).
	Reports int
	// Truncated is the keys that reports left out (MaxFlowStats).
	Truncated int
}

// flowStatsMagic starts an encoded report (its version).
var flowStatsMagic = []byte("sfs1")

// encodeFlowStats encodes a report: magic, time (Unix ms), truncated count, key
// count, then each key's 16 bytes, depth and thousandths of a delivery per second as
// uvarints. Keys past maxBytes (or MaxFlowStats) count as truncated, the most held
// and fastest first kept. stats is sorted in place.
func encodeFlowStats(at time.Time, stats []FlowStat, maxBytes int) []byte {
	slices.SortFunc(stats, func(a, b FlowStat) int {
		return cmp.Or(cmp.Compare(b.Depth, a.Depth), cmp.Compare(b.PerSecond, a.PerSecond), cmp.Compare(a.Key, b.Key))
	})
	var body []byte
	n := 0
	for _, s := range stats {
		k, err := hex.DecodeString(s.Key)
		if err != nil || len(k) != flowKeyLen/2 || n == MaxFlowStats || len(body)+16+2*binary.MaxVarintLen64 > maxBytes-64 {
			continue
		}
		body = append(body, k...)
		body = binary.AppendUvarint(body, uint64(max(s.Depth, 0)))
		body = binary.AppendUvarint(body, uint64(math.Round(max(s.PerSecond, 0)*1000)))
		n++
	}
	out := append([]byte{}, flowStatsMagic...)
	out = binary.BigEndian.AppendUint64(out, uint64(at.UnixMilli()))
	out = binary.AppendUvarint(out, uint64(len(stats)-n))
	out = binary.AppendUvarint(out, uint64(n))
	return append(out, body...)
}

// errFlowStats is wrapped by the errors of a report that does not decode.
var errFlowStats = errors.New("bad flow key report")

// decodeFlowStats decodes a report written by encodeFlowStats, refusing anything
// else (it comes from the bucket, which anyone with the account's publish rights could
// write).
func decodeFlowStats(b []byte) (at time.Time, stats []FlowStat, truncated int, err error) {
	bad := func(what string) (time.Time, []FlowStat, int, error) {
		return time.Time{}, nil, 0, fmt.Errorf("%w: %s", errFlowStats, what)
	}
	if len(b) > maxFlowStatsBytes || !bytes.HasPrefix(b, flowStatsMagic) || len(b) < len(flowStatsMagic)+8 {
		return bad("not a report")
	}
	b = b[len(flowStatsMagic):]
	ms := binary.BigEndian.Uint64(b)
	b = b[8:]
	tr, w := binary.Uvarint(b)
	if w <= 0 || tr > math.MaxInt32 {
		return bad("truncated count")
	}
	b = b[w:]
	n, w := binary.Uvarint(b)
	if w <= 0 || n > MaxFlowStats {
		return bad("key count")
	}
	b = b[w:]
	stats = make([]FlowStat, 0, n)
	for range n {
		if len(b) < flowKeyLen/2 {
			return bad("short key")
		}
		key := hex.EncodeToString(b[:flowKeyLen/2])
		b = b[flowKeyLen/2:]
		depth, w := binary.Uvarint(b)
		if w <= 0 || depth > math.MaxInt32 {
			return bad("depth")
		}
		b = b[w:]
		milli, w := binary.Uvarint(b)
		if w <= 0 || milli > 1<<53 {
			return bad("rate")
		}
		b = b[w:]
		stats = append(stats, FlowStat{Key: key, Depth: int(depth), PerSecond: float64(milli) / 1000})
	}
	if len(b) != 0 {
		return bad("trailing bytes")
	}
	if ms > math.MaxInt64 {
		return bad("time")
	}
	return time.UnixMilli(int64(ms)), stats, int(tr), nil
}

// flowStatsEntry is the bucket key of replica's report of the queue.
func flowStatsEntry(queue, replica string) string { return queue + "." + replica }

// flowStats returns the bucket of flow key reports, creating it when create is set;
// without, a missing bucket is ErrNotFound.
func (s *Store) flowStats(ctx context.Context, create bool) (jetstream.KeyValue, error) {
	return s.flowBucket(ctx, create, "flow key reports", jetstream.KeyValueConfig{
		Bucket:       FlowStatsBucket,
		Description:  "sluice flow keys: each dispatcher's depth and rate per key",
		History:      1,
		TTL:          FlowStatsTTL,
		MaxValueSize: maxFlowStatsBytes,
		Storage:      jetstream.MemoryStorage,
	})
}

// PublishFlowStats writes replica's report of the queue's flow keys (replica: an id of
// the dispatcher, letters, digits, - and _); no stats removes it. Keys past
// MaxFlowStats, or past what one value may hold, are counted as truncated.
func (q *Queue) PublishFlowStats(ctx context.Context, replica string, stats []FlowStat) error {
	if replica == "" || !validToken(replica) {
		return fmt.Errorf("%w: replica id %q", ErrInvalidRequest, replica)
	}
	kv, err := q.store.flowStats(ctx, len(stats) > 0)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil
	case err != nil:
		return err
	}
	entry := flowStatsEntry(q.name, replica)
	if len(stats) == 0 {
		if err := kv.Delete(ctx, entry); err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
			return unavailable("flow key reports", err)
		}
		return nil
	}
	maxBytes := maxFlowStatsBytes
	if mp := int(q.store.nc.MaxPayload()); mp > 0 {
		maxBytes = min(maxBytes, mp-1024)
	}
	if _, err := kv.Put(ctx, entry, encodeFlowStats(time.Now(), stats, maxBytes)); err != nil {
		return unavailable("flow key reports", err)
	}
	return nil
}

// FlowStats returns the sum of the dispatchers' reports of the queue's flow keys
// (see FlowStat). Reports that do not decode, or older than FlowStatsTTL, are left
// out.
func (q *Queue) FlowStats(ctx context.Context) (FlowReport, error) {
	out := FlowReport{Keys: map[string]FlowStat{}}
	kv, err := q.store.flowStats(ctx, false)
	switch {
	case errors.Is(err, ErrNotFound):
		return out, nil
	case err != nil:
		return out, err
	}
	now := time.Now()
	err = eachEntry(ctx, kv, q.name+".*", "flow key reports", func(e jetstream.KeyValueEntry) {
		at, stats, truncated, err := decodeFlowStats(e.Value())
		if err != nil {
			q.store.log.Warn("a flow key report does not decode; ignored", "queue", q.name, "entry", e.Key(), "err", err)
			return
		}
		if now.Sub(at) > FlowStatsTTL {
			return
		}
		out.Reports++
		out.Truncated += truncated
		for _, s := range stats {
			sum := out.Keys[s.Key]
			sum.Key, sum.Depth, sum.PerSecond = s.Key, sum.Depth+s.Depth, sum.PerSecond+s.PerSecond
			out.Keys[s.Key] = sum
		}
	})
	return out, err
}

// validToken reports whether s is one token of a bucket key: letters, digits, - and _.
func validToken(s string) bool {
	for i := range len(s) {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
