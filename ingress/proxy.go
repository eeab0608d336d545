package ingress

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
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
// answers 502 with a problem body when the upstream cannot be reached. It fails when
// upstream is not an absolute URL, an option was given nil, or the metrics cannot be
// registered (several proxies share the series of one registry).
func NewProxy(upstream *url.URL, opts ...ProxyOption) (*httputil.ReverseProxy, error) {
	if upstream == nil || upstream.Scheme == "" || upstream.Host == "" {
		return nil, fmt.Errorf("ingress: proxy upstream %v is not an absolute URL", upstream)
	}
	cfg := proxyConfig{log: slog.Default()}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.log == nil {
		return nil, errors.New("ingress: WithProxyLogger(nil)")
	}
	metrics, err := newUpstreamMetrics(cfg.reg)
	if err != nil {
		return nil, err
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
			setForwarded(cfg.ids, pr.In, pr.Out.Header)
			pr.Out.Host = pr.In.Host // the upstream sees the host the client asked for
		},
		Transport: instrumentedTransport{next: transport, metrics: metrics},
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
	}, nil
}

// forwardingHeaders are the headers that tell a server who asked and how; setForwarded
// writes them from the real connection, whatever the client sent.
var forwardingHeaders = []string{"Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"}

// setForwarded sets the forwarding headers of a request made on behalf of in, into out:
// the client's Forwarded and X-Forwarded-* are dropped; X-Forwarded-For is the peer
// address, appended to the chain the peer sent only when the peer is a trusted proxy
// (ids); X-Forwarded-Host and -Proto come from in's host and connection. Proxied
// requests and parked (deferred) ones both get their headers here, so a downstream sees
// the same either way.
func setForwarded(ids *ClientIdentity, in *http.Request, out http.Header) {
	for _, h := range forwardingHeaders {
		delete(out, h)
	}
	if ids != nil && ids.peerTrusted(in) {
		if chain := in.Header["X-Forwarded-For"]; len(chain) > 0 {
			out["X-Forwarded-For"] = slices.Clone(chain)
		}
	}
	(&httputil.ProxyRequest{In: in, Out: &http.Request{Header: out}}).SetXForwarded()
}
