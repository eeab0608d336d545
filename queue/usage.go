package queue

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// storeUsage follows how much JetStream storage the account uses, for Park's
// high-water check (see WithStoreLimit).
type storeUsage struct {
	js       jetstream.JetStream
	limit    int64                  // bytes; 0: no check
	diskFree func() (uint64, error) // nil: the disk is not watched (see WithDiskFree)

	mu   sync.Mutex
	used uint64
	free uint64 // bytes free on the disk, when diskFree is set
	at   time.Time

	refresh sync.Mutex // held by the one caller refreshing
}

// usageMaxAge is how stale the usage Park checks may be: at most this long's worth of
// parking passes the mark.
const usageMaxAge = 250 * time.Millisecond

func (u *storeUsage) init(ctx context.Context, js jetstream.JetStream, limit int64, diskFree func() (uint64, error), log *slog.Logger) {
	u.js, u.diskFree = js, diskFree
	if diskFree != nil {
		free, err := diskFree()
		if err != nil {
			// Without the figure only the store limit stops parking.
			log.Warn("cannot read the free space of the store's disk; parking keeps no disk reserve", "err", err)
			u.diskFree = nil
		}
		u.free = free
	}
	info, err := js.AccountInfo(ctx)
	if err != nil {
		// Without the account's numbers only JetStream's own refusal stops parking.
		log.Warn("cannot read the JetStream account usage; parking has no high-water mark", "err", err)
		return
	}
	if l := info.Limits.MaxStore; l > 0 && (limit <= 0 || l < limit) {
		limit = l
	}
	u.limit = max(limit, 0)
	u.used, u.at = info.Store, time.Now()
}

// check returns ErrStorageFull (with ErrUnavailable) when the account uses HighWater of
// its limit or more, or the disk has less than DiskReserve free.
func (u *storeUsage) check(ctx context.Context) error {
	if u.limit <= 0 && u.diskFree == nil {
		return nil
	}
	used, free := u.current(ctx)
	if reserve := DiskReserve(u.limit); u.diskFree != nil && free < reserve {
		return fmt.Errorf("%w: %w: %d bytes free on the disk, %d kept for draining the queues", ErrUnavailable, ErrStorageFull, free, reserve)
	}
	if u.limit <= 0 {
		return nil
	}
	if mark := uint64(float64(u.limit) * HighWater); used >= mark {
		return fmt.Errorf("%w: %w: %d of %d bytes used, the high-water mark is %d", ErrUnavailable, ErrStorageFull, used, u.limit, mark)
	}
	return nil
}

// add counts n bytes just stored, until the next refresh brings the real figure.
func (u *storeUsage) add(n int) {
	u.mu.Lock()
	u.used += uint64(n)
	u.mu.Unlock()
}

// current returns the usage and the free disk, refreshed when older than usageMaxAge;
// when another caller is refreshing, or a refresh fails, the last known values.
func (u *storeUsage) current(ctx context.Context) (used, free uint64) {
	u.mu.Lock()
	used, free, at := u.used, u.free, u.at
	u.mu.Unlock()
	if time.Since(at) < usageMaxAge || !u.refresh.TryLock() {
		return used, free
	}
	defer u.refresh.Unlock()
	free = u.readFree(free)
	if u.limit > 0 {
		if info, err := u.js.AccountInfo(ctx); err == nil {
			used = info.Store
		}
	}
	u.mu.Lock()
	u.used, u.free, u.at = used, free, time.Now()
	u.mu.Unlock()
	return used, free
}

// readFree reads the free disk, or returns last when it cannot (or is not asked to):
// a disk whose figure could be read at Open does not stop answering statfs.
func (u *storeUsage) readFree(last uint64) uint64 {
	if u.diskFree == nil {
		return last
	}
	free, err := u.diskFree()
	if err != nil {
		return last
	}
	return free
}

// StorageUsage returns the JetStream storage the account uses and the limit Park's
// high-water mark applies to (0: none), at most a moment old.
func (s *Store) StorageUsage(ctx context.Context) (used uint64, limit int64) {
	used, _ = s.usage.current(ctx)
	return used, s.usage.limit
}
