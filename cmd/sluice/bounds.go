package main

// What bounds the memory of the front door: deferred bodies are read only as far as
// their queue can store them, into a budget of --defer-memory; the embedded NATS
// server's max payload makes room for the largest body a queue takes; the Go runtime's
// memory limit makes the garbage collector return what bodies leave behind.

import (
	"log/slog"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice/ingress/envoy"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/rules"
)

// largestMaxBody is the largest max_body of the queues of set (0 without queues).
func largestMaxBody(set *rules.Set) int64 {
	var n int64
	for _, q := range set.Queues() {
		n = max(n, q.MaxBody)
	}
	return n
}

// embeddedPayload is the embedded NATS server's max payload for queues whose largest
// max_body is maxBody: that body (at least the default), the request headers the front
// door reads at most, and sluice's own headers. 0 (no queues) is NATS's default.
func embeddedPayload(maxBody int64) int32 {
	if maxBody <= 0 {
		return 0
	}
	return int32(max(maxBody, queueconfig.DefaultMaxBody) + maxHeaderBytes + queue.MetadataRoom)
}

// setMemoryLimit gives the Go runtime a soft memory limit (unless GOMEMLIMIT is set):
// the bodies of deferred requests are garbage moments after they are parked, and the
// collector, left to its pace, lets the heap grow to twice its peak before collecting
// them. The limit is what the process is expected to need: memoryLimit.
func setMemoryLimit(deferMemory int64, set *rules.Set, dispatching bool, log *slog.Logger) {
	if _, given := os.LookupEnv("GOMEMLIMIT"); given {
		return
	}
	limit := memoryLimit(deferMemory, set, dispatching)
	debug.SetMemoryLimit(limit)
	log.Debug("Go memory limit set", "bytes", limit)
}

// setRLSGCPercent sets the garbage collector's target of sluice rls to
// envoy.GCPercent (unless GOGC is set): a small live heap and per-call garbage.
func setRLSGCPercent(log *slog.Logger) {
	if _, given := os.LookupEnv("GOGC"); given {
		return
	}
	debug.SetGCPercent(envoy.GCPercent)
	log.Debug("Go GC target set", "gogc", envoy.GCPercent)
}

// memoryLimit is twice --defer-memory (the bodies being read, and their copies inside
// NATS while they are stored), plus for a dispatching process the deliveries under way
// (max_in_flight × max_body of each queue), plus 64 MiB for the rest of the process.
// It is soft: a process that needs more collects more often, it does not fail.
func memoryLimit(deferMemory int64, set *rules.Set, dispatching bool) int64 {
	limit := 2*deferMemory + 64<<20
	if dispatching {
		for _, q := range set.Queues() {
			limit += int64(q.MaxInFlight) * q.MaxBody
		}
	}
	return limit
}

// sizeFlag is a flag holding a byte count, written as in rules files (rules.ParseSize,
// the one size parser of sluice): plain bytes (67108864) or with a unit (64MiB, 1GB,
// 512KiB). "0" is taken too, for the flags where it means "none" or "no limit"; the
// commands check the range each flag allows.
type sizeFlag int64

func (s *sizeFlag) Set(v string) error {
	if strings.TrimSpace(v) == "0" {
		*s = 0
		return nil
	}
	n, err := rules.ParseSize(v)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

// String writes the size in the largest binary unit that divides it, so that
// --print-config shows 10MiB, not 10485760.
func (s *sizeFlag) String() string {
	n := int64(*s)
	for _, u := range []struct {
		name string
		size int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// Type names the kind of value in the flags' help (--max-body size) and for want.
func (s *sizeFlag) Type() string { return "size" }

// sizeDetail is the part of rules.ParseSize's error that the generic message of want
// does not already say.
func sizeDetail(err error) string {
	if err != nil && strings.Contains(err.Error(), "too large") {
		return " (too large)"
	}
	return ""
}

// rateFlag is a flag holding a rate (COUNT/PERIOD, see limiter.ParseRate), or 0 for
// none.
type rateFlag limiter.Rate

func (f *rateFlag) Set(v string) error {
	if strings.TrimSpace(v) == "0" {
		*f = rateFlag{}
		return nil
	}
	r, err := limiter.ParseRate(v)
	if err != nil {
		return err
	}
	*f = rateFlag(r)
	return nil
}

func (f *rateFlag) String() string {
	if limiter.Rate(*f).IsZero() {
		return "0"
	}
	return limiter.Rate(*f).String()
}

// Type names the kind of value in the flags' help.
func (f *rateFlag) Type() string { return "rate" }
