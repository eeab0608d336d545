package dispatcher

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter/promshare"
)

type metrics struct {
	delivered *prometheus.CounterVec
	retried   *prometheus.CounterVec
	failed    *prometheus.CounterVec
	dead      *prometheus.CounterVec
	rejected  *prometheus.CounterVec
	callbacks *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	wait      *prometheus.HistogramVec
	paused    *prometheus.GaugeVec
	circuit   *prometheus.GaugeVec
	flowPause *prometheus.GaugeVec
}

func newMetrics() *metrics {
	return &metrics{
		delivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_delivered_total",
			Help: "Messages delivered (2xx, or publish acknowledged).",
		}, []string{"queue"}),
		retried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_retried_total",
			Help: "Deliveries to be retried, by reason: throttled (downstream 429/503, queue paused, attempt not counted), unreachable (no connection, attempt not counted), circuit (downstream down while the circuit is open, attempt not counted), flow (its flow key had no turn yet: the key's rate or max_in_flight, attempt not counted) or error (5xx, timeout, other network errors).",
		}, []string{"queue", "reason"}),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_failed_total",
			Help: "Messages refused for good by the downstream (4xx other than 429).",
		}, []string{"queue"}),
		dead: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_dead_total",
			Help: "Messages moved to the dead-letter stream: out of attempts, expired, forged or invalid.",
		}, []string{"queue"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_queue_rejected_total",
			Help: "Messages dead-lettered without any delivery attempt, by reason: forged (no valid signature) or invalid (cannot be delivered, e.g. a path without a leading '/').",
		}, []string{"queue", "reason"}),
		callbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_callbacks_total",
			Help: "Completion callbacks by outcome: delivered (2xx), retried (an attempt failed), failed (given up after the last attempt), deferred (handed back untried: its receiver at its share of the senders, or cooling down after failures) or dropped (forged, or its queue no longer allows it; queue label empty).",
		}, []string{"queue", "outcome"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_delivery_duration_seconds",
			Help:    "Duration of delivery attempts, any outcome.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2.5, 12),
		}, []string{"queue"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_queue_wait_seconds",
			Help:    "Time from parking to the start of the successful delivery.",
			Buckets: prometheus.ExponentialBuckets(0.01, 3, 14),
		}, []string{"queue"}),
		paused: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_queue_paused",
			Help: "1 while the queue is paused by a downstream 429/503 Retry-After or an open circuit.",
		}, []string{"queue"}),
		circuit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_queue_circuit_open",
			Help: "1 while the queue's circuit is open: its downstream refused connections or timed out on consecutive orders; one order at a time probes it.",
		}, []string{"queue"}),
		flowPause: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "sluice_queue_flow_keys_paused",
			Help: "Flow keys of a queue with flow_by that an operator paused, as this dispatcher last read them (every 2 s).",
		}, []string{"queue"}),
	}
}

// register registers every metric; vectors already registered (by another dispatcher
// in the same process) are shared.
func (m *metrics) register(r prometheus.Registerer) error {
	var err error
	for _, p := range []**prometheus.CounterVec{&m.delivered, &m.retried, &m.failed, &m.dead, &m.rejected, &m.callbacks} {
		if *p, err = promshare.Register(r, *p); err != nil {
			return err
		}
	}
	for _, p := range []**prometheus.HistogramVec{&m.duration, &m.wait} {
		if *p, err = promshare.Register(r, *p); err != nil {
			return err
		}
	}
	for _, p := range []**prometheus.GaugeVec{&m.paused, &m.circuit, &m.flowPause} {
		if *p, err = promshare.Register(r, *p); err != nil {
			return err
		}
	}
	return nil
}

type queueMetrics struct {
	m         *metrics
	queue     string
	delivered prometheus.Counter
	failed    prometheus.Counter
	dead      prometheus.Counter
	duration  prometheus.Observer
	wait      prometheus.Observer
	paused    prometheus.Gauge
	circuit   prometheus.Gauge
}

func (m *metrics) forQueue(q string) queueMetrics {
	return queueMetrics{
		m:         m,
		queue:     q,
		delivered: m.delivered.WithLabelValues(q),
		failed:    m.failed.WithLabelValues(q),
		dead:      m.dead.WithLabelValues(q),
		duration:  m.duration.WithLabelValues(q),
		wait:      m.wait.WithLabelValues(q),
		paused:    m.paused.WithLabelValues(q),
		circuit:   m.circuit.WithLabelValues(q),
	}
}

func (q queueMetrics) retried(reason string) prometheus.Counter {
	return q.m.retried.WithLabelValues(q.queue, reason)
}

func (q queueMetrics) rejected(reason string) prometheus.Counter {
	return q.m.rejected.WithLabelValues(q.queue, reason)
}
