// Package warn keeps a warning that every failing request would repeat (an upstream
// down, the queues unreachable) to one log line per interval, so that an outage does
// not also flood the logs (and the disk they are on).
package warn

import (
	"log/slog"
	"sync"
	"time"
)

// Sometimes logs one warning: the first time, then at most once per interval. Each line
// says how many were held back since the one before (held_back). Safe for concurrent
// use. (golang.org/x/time/rate's Sometimes does the same without the count; the root
// module keeps x/time, a peer of the benchmarks, out of its direct requirements.)
type Sometimes struct {
	interval time.Duration

	mu   sync.Mutex
	last time.Time // zero until the first line
	held int64
}

// Every returns a Sometimes that lets a line through at most once per interval.
func Every(interval time.Duration) *Sometimes { return &Sometimes{interval: interval} }

// Warn logs msg with args at warning level through log, or counts it when a line went
// out within the interval.
func (w *Sometimes) Warn(log *slog.Logger, msg string, args ...any) {
	now := time.Now()
	w.mu.Lock()
	if !w.last.IsZero() && now.Sub(w.last) < w.interval {
		w.held++
		w.mu.Unlock()
		return
	}
	held := w.held
	w.last, w.held = now, 0
	w.mu.Unlock()
	log.Warn(msg, append(args, "held_back", held)...)
}
