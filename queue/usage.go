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
	js    jetstream.JetStream
	limit int64 // bytes; 0: no check

	mu   sync.Mutex
	used uint64
	at   time.Time

	refresh sync.Mutex // held by the one caller refreshing
}

// usageMaxAge is how stale the usage Park checks may be: at most this long's worth of
// parking passes the mark.
const usageMaxAge = 250 * time.Millisecond

func (u *storeUsage) init(ctx context.Context, js jetstream.JetStream, limit int64, log *slog.Logger) {
	u.js = js
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
// its limit or more.
func (u *storeUsage) check(ctx context.Context) error {
	if u.limit <= 0 {
		return nil
	}
	used := u.current(ctx)
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

// current returns the usage, refreshed when older than usageMaxAge; when another caller
// is refreshing, or the refresh fails, the last known value.
func (u *storeUsage) current(ctx context.Context) uint64 {
	u.mu.Lock()
	used, at := u.used, u.at
	u.mu.Unlock()
	if time.Since(at) < usageMaxAge || !u.refresh.TryLock() {
		return used
	}
	defer u.refresh.Unlock()
	info, err := u.js.AccountInfo(ctx)
	if err != nil {
		return used
	}
	u.mu.Lock()
	u.used, u.at = info.Store, time.Now()
	u.mu.Unlock()
	return info.Store
}

// StorageUsage returns the JetStream storage the account uses and the limit Park's
// high-water mark applies to (0: none), at most a moment old.
func (s *Store) StorageUsage(ctx context.Context) (used uint64, limit int64) {
	return s.usage.current(ctx), s.usage.limit
}
