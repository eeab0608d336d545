package ingress

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ProxyOption configures NewProxy.
type ProxyOption func(*proxyConfig)

type proxyConfig struct {
	log *slog.Logger
	reg prometheus.Registerer
	ids *ClientIdentity
}

// WithProxyLogger sets the proxy's logger (default slog.Default()).
func WithProxyLogger(l *slog.Logger) ProxyOption { return func(c *proxyConfig) { c.log = l } }

// WithProxyRegisterer registers the upstream metrics (sluice_upstream_requests_total,
// sluice_upstream_duration_seconds) on reg.
func WithProxyRegisterer(reg prometheus.Registerer) ProxyOption {
	return func(c *proxyConfig) { c.reg = reg }
}

// WithProxyClientIdentity keeps the X-Forwarded-For chain of requests that come from
// trusted proxies (others start a new chain with their peer address).
func WithProxyClientIdentity(id *ClientIdentity) ProxyOption {
	return func(c *proxyConfig) { c.ids = id }
}

// NewProxy returns a reverse proxy to upstream, built on httputil.ReverseProxy with the
// Rewrite hook. It keeps many idle connections per upstream host so that under load
// requests reuse connections instead of dialling (the default of 2 idle connections per
// host would make the proxy itself the bottleneck), sets X-Forwarded-For / -Host /
// -Proto from the real client connection (dropping whatever the client sent), and
// answers 502 with a problem body when the upstream cannot be reached.
func NewProxy(upstream *url.URL, opts ...ProxyOption) *httputil.ReverseProxy {
	cfg := proxyConfig{log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	log := cfg.log
	transport := &http.Transport{
		Proxy:                 nil, // the upstream is addressed directly, whatever the environment says
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   512,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   5 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(upstream)
			if cfg.ids != nil && cfg.ids.peerTrusted(pr.In) {
				pr.Out.Header["X-Forwarded-For"] = pr.In.Header["X-Forwarded-For"]
			}
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host // the upstream sees the host the client asked for
		},
		Transport: instrumentedTransport{next: transport, metrics: newUpstreamMetrics(cfg.reg)},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if errors.Is(err, r.Context().Err()) {
				return // the client went away; nobody to answer
			}
			if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
				writeProblem(w, simpleProblem(http.StatusRequestEntityTooLarge,
					"The request body is larger than "+strconv.FormatInt(tooLarge.Limit, 10)+" bytes."))
				return
			}
			log.Warn("upstream request failed", "err", err, "method", r.Method, "path", r.URL.Path)
			writeProblem(w, simpleProblem(http.StatusBadGateway, "The upstream could not be reached."))
		},
	}
}
