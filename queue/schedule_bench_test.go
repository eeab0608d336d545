//go:build linux

package queue_test

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// BenchmarkScheduled100k parks SLUICE_BENCH_SCHEDULED (default 100,000) scheduled
// orders into one queue of an in-process NATS server (the test process is the server
// process, as `sluice serve` with its embedded NATS is), all due a while after the last
// is parked, and reports:
//
//	parks/s         park throughput of scheduled orders (32 concurrent parkers)
//	rss-MiB         resident memory with every order waiting (VmRSS of this process)
//	rss-delta-MiB   growth of VmRSS from before the first park
//	idle-cpu-%      CPU of the process while they wait (10 s; the server's scheduler timer)
//	fire-s          from the due time until every order is on the ready subjects
//	fire-cpu-s      CPU seconds the process spent meanwhile
//
// Run it with:
//
//	go test -run '^$' -bench BenchmarkScheduled100k -benchtime 1x ./queue/
func BenchmarkScheduled100k(b *testing.B) {
	n := scheduledCount()
	for range b.N {
		_, s := scheduledBenchQueue(b, n)
		rss0 := rssMiB(b)
		// Every order falls due at one time well after the parking ends.
		due := time.Now().Add(time.Hour)
		parked := parkDue(b, s, n, due)
		b.ReportMetric(float64(n)/parked.Seconds(), "parks/s")
		rss := rssMiB(b)
		b.ReportMetric(rss, "rss-MiB")
		b.ReportMetric(rss-rss0, "rss-delta-MiB")
		cpu0 := cpuSeconds()
		time.Sleep(10 * time.Second)
		b.ReportMetric((cpuSeconds()-cpu0)/10*100, "idle-cpu-%")
	}
}

// BenchmarkScheduledFire100k parks the orders due a few seconds after the last park
// and reports how long the server takes, from that due time, to put every one on the
// ready subjects, and the CPU it spends.
//
// Run it with:
//
//	go test -run '^$' -bench BenchmarkScheduledFire100k -benchtime 1x ./queue/
func BenchmarkScheduledFire100k(b *testing.B) {
	n := scheduledCount()
	for range b.N {
		srv, s := scheduledBenchQueue(b, n)
		ctx := context.Background()
		// Every order falls due at one time after the last park: parks are synced to
		// disk, a few hundred a second on a busy machine, so allow 6ms a park and a
		// minute.
		due := time.Now().Add(time.Duration(n)*6*time.Millisecond + time.Minute).Truncate(time.Second)
		parkDue(b, s, n, due)
		if time.Now().After(due) {
			b.Fatal("parking took longer than the due time's margin")
		}
		time.Sleep(time.Until(due))
		cpu0 := cpuSeconds()
		st := srv.Stream(b, queue.StreamName("bench"))
		cons, err := st.Consumer(ctx, queue.ConsumerName)
		if err != nil {
			b.Fatal(err)
		}
		for {
			info, err := cons.Info(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if info.NumPending >= uint64(n) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		b.ReportMetric(time.Since(due).Seconds(), "fire-s")
		b.ReportMetric(cpuSeconds()-cpu0, "fire-cpu-s")
		b.ReportMetric(rssMiB(b), "rss-MiB")
	}
}

// scheduledCount is SLUICE_BENCH_SCHEDULED, or 100,000 when it is unset or not a
// positive number: how many orders the scheduled benchmarks park.
func scheduledCount() int {
	if v, err := strconv.Atoi(os.Getenv("SLUICE_BENCH_SCHEDULED")); err == nil && v > 0 {
		return v
	}
	return 100_000
}

// scheduledBenchQueue starts a NATS server for b with the scheduled queue "bench"
// declared on it, room for n orders, and its consumer set up.
func scheduledBenchQueue(b *testing.B, n int) (*natstest.Server, *queue.Store) {
	b.Helper()
	srv := natstest.Start(b)
	cfg := scheduledConfig("bench")
	cfg.MaxDepth = int64(n) + 1
	s := openStore(b, srv, cfg)
	q, _ := s.Queue("bench")
	if err := q.Consumer().Ensure(context.Background(), leaseConsumer); err != nil {
		b.Fatal(err)
	}
	return srv, s
}

// parkDue parks n orders into "bench", all due at due, from 32 concurrent parkers,
// and returns how long that took; b fails (and that parker stops) at a Park's error.
func parkDue(b *testing.B, s *queue.Store, n int, due time.Time) time.Duration {
	b.Helper()
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range 32 {
		wg.Go(func() {
			for next.Add(1) <= int64(n) {
				if _, err := s.Park(context.Background(), at("bench", `{"n":1}`, due)); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	return time.Since(start)
}

func rssMiB(tb testing.TB) float64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		tb.Skip("no /proc/self/status:", err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024
		}
	}
	tb.Skip("no VmRSS")
	return 0
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}
