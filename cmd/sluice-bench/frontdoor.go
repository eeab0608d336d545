package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/h1"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
)

// frontServer is the http.Server that sluice serve puts its front door on
// (cmd/sluice's newHTTPServer): every timeout, a 64 KiB header limit.
func frontServer(h http.Handler) *http.Server {
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		WriteTimeout: 90 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10}
}

// Front door servers (--server): sluice serve's default, and --fast-path=false.
const (
	serverFast    = "fast"
	serverNetHTTP = "net/http"
)

// serveFront serves h on a loopback port with frontServer's settings, on the front
// door's fast path (ingress/h1 before net/http's server, as sluice serve runs it by
// default) unless server is serverNetHTTP (net/http alone: sluice serve
// --fast-path=false). It returns the server's base URL and what stops it.
func serveFront(h http.Handler, server string) (baseURL string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := frontServer(h)
	serve, shutdown := srv.Serve, srv.Shutdown
	if server != serverNetHTTP {
		fast := &h1.Server{Fallback: srv}
		serve, shutdown = fast.Serve, fast.Shutdown
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
			_ = srv.Close()
		}
		<-done
	}, nil
}

// parkingFrontDoor is sluice serve's front door handler (cmd/sluice's frontDoor and
// middleware) with serve's default flags, on store and the rules set: ticket status
// and cancel, and every other request through the middleware (the memory limiter,
// idempotency scopes keyed, metrics on a registry, tracing off) to a deferrer with
// serve's body memory, ticket lookup limit and waits. A NotFound handler stands in
// for the proxy: the measurement sends only orders over a defer rule's limit. stop
// ends the deferrer's waits.
func parkingFrontDoor(set *rules.Set, store *queue.Store) (h http.Handler, stop func(), err error) {
	ids, err := ingress.NewClientIdentity(nil, 64)
	if err != nil {
		return nil, nil, err
	}
	log := slog.New(slog.DiscardHandler)
	deferrer := deferral.New(store, deferral.WithLogger(log), deferral.WithBodyMemory(deferral.DefaultBodyMemory),
		deferral.WithLookupLimit(ids, limiter.PerSecond(100)),
		deferral.WithWaits(deferral.WaitLimits{Max: time.Minute, PerClient: deferral.DefaultWaitsPerClient, Total: deferral.DefaultWaits, IDs: ids}))
	mw, err := ingress.New(ingress.StaticRules{S: set}, limiter.NewMemory(limiter.WithMaxKeys(1_000_000)),
		ingress.WithClientIdentity(ids), ingress.WithMaxBody(ingress.DefaultMaxBody), ingress.WithLogger(log),
		ingress.WithRegisterer(prometheus.NewRegistry()), ingress.WithTracerProvider(noop.NewTracerProvider()),
		ingress.WithDeferrer(deferrer), ingress.WithIdempotencyScopeKey(benchKey()))
	if err != nil {
		deferrer.Close()
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+deferral.Path+"{ticket}", deferrer.StatusHandler())
	mux.Handle("DELETE "+deferral.Path+"{ticket}", deferrer.CancelHandler())
	mux.Handle("/", mw.Wrap(http.NotFoundHandler()))
	return mux, deferrer.Close, nil
}

// acceptedBody is the shape of the front door's 202 for --ceiling, with a ticket of
// a ticket's length.
const acceptedBody = `{"ticket":"abcdefghijklmnopqrstuvwxyz","queue":"bench","status":"queued","position":1,` +
	`"estimated_delivery":"2026-01-01T00:00:00Z","monitor":"/sluice/v1/deferred/abcdefghijklmnopqrstuvwxyz",` +
	`"monitor_wait":60,"monitor_events":true}` + "\n"

// answerAccepted reads the request's body and answers 202 as the front door does for a
// parked order (its headers and a body of the same length), without parking anything:
// what HTTP alone costs on the front door's server.
func answerAccepted(w http.ResponseWriter, r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	h := w.Header()
	h.Set("Location", "/sluice/v1/deferred/abcdefghijklmnopqrstuvwxyz")
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusAccepted)
	_, _ = io.WriteString(w, acceptedBody)
}
