package ingress

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter/promshare"
	"github.com/sluicehq/sluice/queue/telemetry"
)

// statusClasses are the values of the upstream series' class label: 1xx..5xx at
// 0..4 (see classIndex), error (no response) last.
var statusClasses = [...]string{"1xx", "2xx", "3xx", "4xx", "5xx", "error"}

// upstreamMetrics count what the reverse proxy gets from the upstream.
type upstreamMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newUpstreamMetrics(reg prometheus.Registerer) (*upstreamMetrics, error) {
	m := &upstreamMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_upstream_requests_total",
			Help: "Requests proxied to the upstream, by response status class (error: no response).",
		}, []string{"class"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_upstream_duration_seconds",
			Help:    "Time until the upstream's response headers, by status class.",
			Buckets: prometheus.DefBuckets,
		}, []string{"class"}),
	}
	for _, class := range statusClasses {
		m.requests.WithLabelValues(class)
		m.duration.WithLabelValues(class)
	}
	if reg != nil {
		var err error
		if m.requests, err = promshare.Register(reg, m.requests); err != nil {
			return nil, err
		}
		if m.duration, err = promshare.Register(reg, m.duration); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// RoundTrip-side instrumentation of the proxy's transport.
type instrumentedTransport struct {
	next    http.RoundTripper
	metrics *upstreamMetrics
}

func (t instrumentedTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(r)
	class := "error"
	if err == nil {
		class = statusClass(resp.StatusCode)
	}
	t.metrics.requests.WithLabelValues(class).Inc()
	// An exemplar when the request carries a sampled span (an outer instrumentation's).
	telemetry.Observe(r.Context(), t.metrics.duration.WithLabelValues(class), time.Since(start).Seconds())
	return resp, err
}

func statusClass(code int) string {
	if code < 100 || code > 599 {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}
