package queue

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

type storeMetrics struct {
	store  *Store
	parked *prometheus.CounterVec
	depth  *prometheus.Desc
}

func newStoreMetrics(s *Store) *storeMetrics {
	return &storeMetrics{
		store: s,
		parked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_parked_total",
			Help: "Requests parked in a queue (acknowledged by JetStream), not counting idempotent repeats.",
		}, []string{"queue"}),
		depth: prometheus.NewDesc("sluice_queue_depth",
			"Messages waiting in a queue (from the stream state, at most a second old).",
			[]string{"queue"}, nil),
	}
}

func (m *storeMetrics) register(r prometheus.Registerer) error {
	if err := r.Register(m.parked); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return err
		}
		existing, ok := are.ExistingCollector.(*prometheus.CounterVec)
		if !ok {
			return err
		}
		m.parked = existing
	}
	if err := r.Register(depthCollector{m}); err != nil {
		var are prometheus.AlreadyRegisteredError
		if !errors.As(err, &are) {
			return err
		}
	}
	return nil
}

// depthCollector reads queue depths from the stream state when scraped.
type depthCollector struct{ m *storeMetrics }

func (c depthCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.m.depth }

func (c depthCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for _, q := range c.m.store.Queues() {
		info, err := q.streamInfo(ctx, time.Second)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.m.depth, prometheus.GaugeValue, float64(info.State.Msgs), q.name)
	}
}
