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
)

// NewProxy returns a reverse proxy to upstream, built on httputil.ReverseProxy with the
// Rewrite hook. It keeps many idle connections per upstream host so that under load
// requests reuse connections instead of dialling (the default of 2 idle connections per
// host would make the proxy itself the bottleneck), sets X-Forwarded-For / -Host /
// -Proto from the real client connection (dropping whatever the client sent), and
// answers 502 with a problem body when the upstream cannot be reached.
func NewProxy(upstream *url.URL, log *slog.Logger) *httputil.ReverseProxy {
	if log == nil {
		log = slog.Default()
	}
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
			pr.SetXForwarded()
			pr.Out.Host = pr.In.Host // the upstream sees the host the client asked for
		},
		Transport: transport,
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
