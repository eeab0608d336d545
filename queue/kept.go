package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/maphash"
	"sort"
	"sync"
)

// DefaultKeptRecordsBytes bounds the ticket records held in memory by the leases whose
// records could not be written (see Lease).
const DefaultKeptRecordsBytes = 64 << 20

// ErrKeptRecordsFull: there is no room left for another record.
var ErrKeptRecordsFull = errors.New("queue: too many ticket records waiting to be written")

// keptRecords holds ticket records that could not be written (JetStream full or
// unreachable) until FlushRecords writes them. One entry per ticket, the newest.
type keptRecords struct {
	// write is held, for the stripe of a record's ticket (writeLock), shared by
	// saveRecord and exclusively by FlushRecords for each write, so that a flush never
	// puts a kept copy over a newer record. Striped so that a flush's write waiting on
	// a store that does not answer holds up the records of few other tickets, not
	// every delivery's.
	write [keptStripes]sync.RWMutex
	seed  maphash.Seed
	// flushing lets one FlushRecords run at a time (others return at once).
	flushing sync.Mutex

	mu    sync.Mutex
	recs  map[string]*keptRecord
	bytes int64
	limit int64
	seq   uint64
}

type keptRecord struct {
	rec  Record
	size int64
	seq  uint64 // order of keeping, so that a flush writes the oldest first
}

// keptStripes is the number of stripes of keptRecords.write.
const keptStripes = 64

func newKeptRecords(limit int64) *keptRecords {
	return &keptRecords{recs: map[string]*keptRecord{}, limit: limit, seed: maphash.MakeSeed()}
}

// writeLock returns the lock of ticket's stripe (see keptRecords.write).
func (k *keptRecords) writeLock(ticket string) *sync.RWMutex {
	return &k.write[maphash.String(k.seed, ticket)%keptStripes]
}

func (k *keptRecords) get(ticket string) *Record {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.recs[ticket]
	if e == nil {
		return nil
	}
	rec := e.rec
	return &rec
}

// drop removes the kept copy of ticket; with only set, only when it is still that copy.
func (k *keptRecords) drop(ticket string, only *keptRecord) {
	k.mu.Lock()
	defer k.mu.Unlock()
	e := k.recs[ticket]
	if e == nil || (only != nil && e != only) {
		return
	}
	delete(k.recs, ticket)
	k.bytes -= e.size
}

func (k *keptRecords) len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.recs)
}

// keepRecord holds rec in memory until FlushRecords writes it: for a record that could
// not be written (the JetStream store full, or unreachable) where waiting for it would
// hold up deliveries. Record and Status read the kept copy on this Store (not on other
// processes) until it is written; a process that exits before the write loses it.
// The copies are bounded by size (WithKeptRecordsBytes); past that a record is kept
// without its result body, and when even that does not fit keepRecord returns
// ErrKeptRecordsFull.
func (s *Store) keepRecord(rec *Record) error {
	if !ValidTicket(rec.Ticket) {
		return fmt.Errorf("%w: bad ticket %q", ErrInvalidRequest, rec.Ticket)
	}
	k := s.kept
	c := *rec
	size := recordSize(&c)
	k.mu.Lock()
	defer k.mu.Unlock()
	var prev int64
	if e := k.recs[c.Ticket]; e != nil {
		prev = e.size
	}
	if k.bytes-prev+size > k.limit && c.Result != nil && len(c.Result.Body) > 0 {
		r := *c.Result
		r.Body, r.Truncated = nil, true
		c.Result = &r
		size = recordSize(&c)
	}
	if k.bytes-prev+size > k.limit {
		s.metrics.keptLost.Inc()
		return ErrKeptRecordsFull
	}
	if len(k.recs) == 0 {
		s.log.Warn("JetStream refuses ticket records; keeping them in memory until they can be written", "ticket", c.Ticket)
	}
	k.seq++
	k.recs[c.Ticket] = &keptRecord{rec: c, size: size, seq: k.seq}
	k.bytes += size - prev
	return nil
}

// recordSize estimates the memory a kept record takes.
func recordSize(rec *Record) int64 {
	b, _ := json.Marshal(rec)
	return int64(len(b)) + 256
}

// KeptRecords returns the number of ticket records waiting in memory to be written.
func (s *Store) KeptRecords() int { return s.kept.len() }

// FlushRecords writes the records held in memory (see Lease), oldest first, and
// returns how many are left. It stops at the first failed write (the store is still full or
// unreachable; the next call tries again). Calls while another one runs return at once.
func (s *Store) FlushRecords(ctx context.Context) (left int, err error) {
	k := s.kept
	if !k.flushing.TryLock() {
		return k.len(), nil
	}
	defer k.flushing.Unlock()
	k.mu.Lock()
	todo := make([]*keptRecord, 0, len(k.recs))
	for _, e := range k.recs {
		todo = append(todo, e)
	}
	k.mu.Unlock()
	sort.Slice(todo, func(i, j int) bool { return todo[i].seq < todo[j].seq })
	for _, e := range todo {
		if err := s.flushOne(ctx, e); err != nil {
			return k.len(), err
		}
	}
	left = k.len()
	if len(todo) > 0 && left == 0 {
		s.log.Info("ticket records kept in memory are written", "records", len(todo))
	}
	return left, nil
}

func (s *Store) flushOne(ctx context.Context, e *keptRecord) error {
	k := s.kept
	lock := k.writeLock(e.rec.Ticket)
	lock.Lock()
	defer lock.Unlock()
	k.mu.Lock()
	current := k.recs[e.rec.Ticket] == e
	k.mu.Unlock()
	if !current { // written directly since, or replaced by a newer copy
		return nil
	}
	rec := e.rec
	if err := s.writeRecord(ctx, &rec); err != nil {
		return err
	}
	k.drop(rec.Ticket, e)
	return nil
}
