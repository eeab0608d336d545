package queue

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter/promshare"
)

type storeMetrics struct {
	store    *Store
	parked   *prometheus.CounterVec
	unacked  *prometheus.CounterVec
	keptLost prometheus.Counter
	// callbacksLost counts completion callbacks that could not be stored.
	callbacksLost prometheus.Counter
	kept          prometheus.GaugeFunc
	depth         *prometheus.Desc
	maxDepth      *prometheus.Desc
	outflow       *prometheus.Desc
	orphaned      *prometheus.Desc
	storeUsed     *prometheus.Desc
	storeLimit    *prometheus.Desc
	diskFree      *prometheus.Desc
}

func newStoreMetrics(s *Store) *storeMetrics {
	return &storeMetrics{
		store: s,
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_parked_total",
			Help: "Requests parked in a queue (acknowledged by JetStream), not counting idempotent repeats.",
		}, []string{"queue"}),
		unacked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_park_unacknowledged_total",
			Help: "Parks whose publish JetStream did not acknowledge within the publish timeout: the order may be stored, and is then delivered; its client was answered 503 naming its ticket. A park whose caller left while it was written is not counted.",
		}, []string{"queue"}),
		keptLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_queue_records_lost_total",
			Help: "Ticket records that could not be written nor kept in memory for a later write (their orders were still settled; their status reads as unknown).",
		}),
		callbacksLost: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_callbacks_lost_total",
			Help: "Completion callbacks that could not be stored when their order ended, so were never sent (the orders were settled all the same).",
		}),
		kept: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_queue_records_kept",
			Help: "Ticket records held in memory because JetStream refused them (store full or unreachable), waiting to be written.",
		}, func() float64 { return float64(s.KeptRecords()) }),
		depth: prometheus.NewDesc("sluice_queue_depth",
			"Messages waiting in a queue (from the stream state, at most a second old).",
			[]string{"queue"}, nil),
		maxDepth: prometheus.NewDesc("sluice_queue_max_depth",
			"The configured max_depth of a queue (absent when it has none).",
			[]string{"queue"}, nil),
		outflow: prometheus.NewDesc("sluice_queue_outflow_per_second",
			"The configured outflow rate of a queue, shared by all its dispatchers.",
			[]string{"queue"}, nil),
		orphaned: prometheus.NewDesc("sluice_queue_orphaned",
			"1 for a queue that left the rules and drains with the configuration it was declared with (retire it once empty), 0 for a declared one.",
			[]string{"queue"}, nil),
		storeUsed: prometheus.NewDesc("sluice_queue_store_used_bytes",
			"JetStream storage the account uses (present when the store has a limit: parking stops at 85% of it).",
			nil, nil),
		storeLimit: prometheus.NewDesc("sluice_queue_store_limit_bytes",
			"The JetStream storage limit parking's high-water mark applies to: the embedded server's, or the account's (absent without one).",
			nil, nil),
		diskFree: prometheus.NewDesc("sluice_queue_store_disk_free_bytes",
			"Bytes free on the embedded NATS server's disk (absent with --nats); parking stops below 15% of the store limit, at least 16 MiB.",
			nil, nil),
	}
}

func (m *storeMetrics) register(r prometheus.Registerer) error {
	var err error
	for _, c := range []**prometheus.CounterVec{&m.parked, &m.unacked} {
		if *c, err = promshare.Register(r, *c); err != nil {
			return err
		}
	}
	for _, c := range []*prometheus.Counter{&m.keptLost, &m.callbacksLost} {
		if *c, err = promshare.Register(r, *c); err != nil {
			return err
		}
	}
	// A second Store in one registry (tests) keeps the first one's gauge and queues.
	if _, err := promshare.Register(r, m.kept); err != nil {
		return err
	}
	if _, err := promshare.Register(r, queueCollector{m}); err != nil {
		return err
	}
	return nil
}

// queueCollector reports each declared queue's depth (from the stream state) and its
// configured limits when scraped, so dashboards can draw depth against max_depth and
// deliveries against the outflow.
type queueCollector struct{ m *storeMetrics }

func (c queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.m.depth
	ch <- c.m.maxDepth
	ch <- c.m.outflow
	ch <- c.m.orphaned
	ch <- c.m.storeUsed
	ch <- c.m.storeLimit
	ch <- c.m.diskFree
}

func (c queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	u := &c.m.store.usage
	used, free := u.current(ctx)
	if u.limit > 0 {
		ch <- prometheus.MustNewConstMetric(c.m.storeUsed, prometheus.GaugeValue, float64(used))
		ch <- prometheus.MustNewConstMetric(c.m.storeLimit, prometheus.GaugeValue, float64(u.limit))
	}
	if u.diskFree != nil {
		ch <- prometheus.MustNewConstMetric(c.m.diskFree, prometheus.GaugeValue, float64(free))
	}
	for _, q := range c.m.store.Queues() {
		cfg := q.Config()
		ch <- prometheus.MustNewConstMetric(c.m.outflow, prometheus.GaugeValue, cfg.Outflow.PerSecondFloat(), q.name)
		orphaned := 0.0
		if q.Orphaned() {
			orphaned = 1
		}
		ch <- prometheus.MustNewConstMetric(c.m.orphaned, prometheus.GaugeValue, orphaned, q.name)
		if cfg.MaxDepth > 0 {
			ch <- prometheus.MustNewConstMetric(c.m.maxDepth, prometheus.GaugeValue, float64(cfg.MaxDepth), q.name)
		}
		info, err := q.streamInfo(ctx, time.Second)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.m.depth, prometheus.GaugeValue, float64(info.State.Msgs), q.name)
	}
}
