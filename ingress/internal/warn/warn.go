// Package warn keeps a warning that every failing request would repeat (an upstream
// down, the queues unreachable) to one log line per interval, so that an outage does
// not also flood the logs (and the disk they are on).
package warn

import (
	"log/slog"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Sometimes logs one warning: the first time, then at most once per interval. Each line
// says how many were held back since the one before (held_back). Safe for concurrent
// use.
type Sometimes struct {
	s     rate.Sometimes
	count atomic.Int64
	last  int64 // count at the last line; only touched inside s.Do, which runs one f at a time
}

// Every returns a Sometimes that lets a line through at most once per interval.
func Every(interval time.Duration) *Sometimes {
	return &Sometimes{s: rate.Sometimes{First: 1, Interval: interval}}
}

// Warn logs msg with args at warning level through log, or counts it when a line went
// out within the interval.
func (w *Sometimes) Warn(log *slog.Logger, msg string, args ...any) {
	n := w.count.Add(1)
	w.s.Do(func() {
		held := n - w.last - 1
		w.last = n
		log.Warn(msg, append(args, "held_back", max(held, 0))...)
	})
}
