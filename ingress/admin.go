package ingress

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// Admin serves the operations endpoints, on a listener of their own:
//
//	/healthz                  200 while the process runs (never behind the token)
//	/readyz                   200 while this process can serve: rules loaded, every
//	                          readiness check passing, not shutting down (see Drain)
//	/metrics                  Prometheus metrics
//	/sluice/v1/rules          the active rules, as JSON
//	/sluice/v1/status         the shared dependencies (Redis, NATS), as JSON
//	/sluice/v1/queues…        queue operations (ingress/queueapi), when Queues is set
//	/sluice/v1/openapi.json   the OpenAPI document of these endpoints
//
// With a Token, everything but /healthz needs `Authorization: Bearer TOKEN`; an address
// that keeps presenting wrong tokens is locked out for a while (429, see TokenGuard).
type Admin struct {
	Gatherer prometheus.Gatherer
	Rules    RulesSource
	// Ready are named readiness checks of this process, each bounded by a short
	// timeout. Services shared by every replica belong in Dependencies instead: their
	// outage would make every replica unready at once.
	Ready map[string]func(context.Context) error
	// Dependencies are shown by /sluice/v1/status; nil: none.
	Dependencies *Dependencies
	Token        string
	// Guard checks the token and locks out addresses that keep presenting wrong ones
	// (see TokenGuard); nil: a guard of Token of its own.
	Guard *TokenGuard
	// Extra adds handlers under their patterns ("GET /path").
	Extra map[string]http.Handler
	// Queues serves the queue operations: a *queueapi.API (package ingress/queueapi);
	// nil: none.
	Queues interface{ Routes() []Route }

	draining atomic.Bool
}

// Route is an endpoint: a net/http ServeMux pattern ("GET /path/{name}") and its handler.
type Route struct {
	Pattern string
	Handler http.Handler
}

// Routes returns every endpoint of Handler; all but the first (/healthz) are behind
// the token.
func (a *Admin) Routes() []Route {
	routes := []Route{
		{"GET /healthz", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			_, _ = w.Write([]byte("ok\n"))
		})},
		{"GET /readyz", http.HandlerFunc(a.readyz)},
		// OpenMetrics on request (Accept), for the exemplars that name traces; the
		// text format otherwise, as before.
		{"GET /metrics", promhttp.HandlerFor(a.Gatherer, promhttp.HandlerOpts{EnableOpenMetrics: true})},
		{"GET /sluice/v1/rules", http.HandlerFunc(a.rules)},
		{"GET /sluice/v1/status", http.HandlerFunc(a.status)},
		{"GET " + OpenAPIPath, http.HandlerFunc(serveOpenAPI)},
	}
	if a.Queues != nil {
		routes = append(routes, a.Queues.Routes()...)
	}
	for _, pattern := range slices.Sorted(maps.Keys(a.Extra)) {
		routes = append(routes, Route{pattern, a.Extra[pattern]})
	}
	return routes
}

// Drain makes /readyz answer 503 from now on: the process is shutting down, and load
// balancers should stop sending before its listeners close.
func (a *Admin) Drain() { a.draining.Store(true) }

// Handler returns the admin endpoints' handler.
func (a *Admin) Handler() http.Handler {
	routes := a.Routes()
	mux := http.NewServeMux()
	mux.Handle(routes[0].Pattern, routes[0].Handler)
	gated := http.NewServeMux()
	for _, rt := range routes[1:] {
		gated.Handle(rt.Pattern, rt.Handler)
	}
	mux.Handle("/", a.authorize(gated))
	return mux
}

func (a *Admin) authorize(next http.Handler) http.Handler {
	if a.Token == "" {
		return next
	}
	guard := a.Guard
	if guard == nil {
		guard = NewTokenGuard(a.Token, nil)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// No credentials at all is not a guess (a scraper without the token, say).
		var ok bool
		var retryAfter time.Duration
		if h := r.Header.Get("Authorization"); h != "" {
			ok, retryAfter = guard.Check(r, bearerToken(h))
		}
		switch {
		case retryAfter > 0:
			WriteLockedOut(w, retryAfter)
			return
		case !ok:
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice admin"`)
			writeProblem(w, simpleProblem(http.StatusUnauthorized, "A valid bearer token is required."))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// bearerToken is the token of an Authorization value of the Bearer scheme, whose name
// is case-insensitive (RFC 9110 section 11.1) and followed by one or more spaces
// (RFC 6750); "" for any other value (a wrong guess: the token is never empty).
func bearerToken(h string) string {
	scheme, token, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimLeft(token, " ")
}

const readyTimeout = 2 * time.Second

func (a *Admin) readyz(w http.ResponseWriter, r *http.Request) {
	failures := a.unready(r.Context())
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if len(failures) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		_ = json.NewEncoder(w).Encode(map[string]any{"ready": false, "failures": failures})
		return
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"ready": true})
}

// unready returns why this process cannot serve, by check; empty: ready.
func (a *Admin) unready(ctx context.Context) map[string]string {
	failures := map[string]string{}
	if a.draining.Load() {
		failures["shutdown"] = "shutting down"
	}
	if a.Rules == nil || a.Rules.Set() == nil {
		failures["rules"] = "no rules loaded"
	}
	for name, check := range a.Ready {
		cctx, cancel := context.WithTimeout(ctx, readyTimeout)
		if err := check(cctx); err != nil {
			failures[name] = err.Error()
		}
		cancel()
	}
	return failures
}

// statusView is the JSON shape of /sluice/v1/status.
type statusView struct {
	// Ready is what /readyz says; the dependencies do not change it.
	Ready        bool                        `json:"ready"`
	ShuttingDown bool                        `json:"shutting_down,omitempty"`
	Dependencies map[string]DependencyStatus `json:"dependencies"`
}

func (a *Admin) status(w http.ResponseWriter, r *http.Request) {
	v := statusView{Ready: len(a.unready(r.Context())) == 0, ShuttingDown: a.draining.Load(),
		Dependencies: map[string]DependencyStatus{}}
	if a.Dependencies != nil {
		v.Dependencies = a.Dependencies.Status(r.Context())
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

// rulesView is the JSON shape of /sluice/v1/rules.
type rulesView struct {
	Version string      `json:"version"`
	Files   []string    `json:"files"`
	Summary string      `json:"summary"`
	Routes  []routeView `json:"routes"`
	Rules   []ruleView  `json:"rules"`
	Queues  []queueView `json:"queues"`
}

type routeView struct {
	Name        string   `json:"name"`
	Domain      string   `json:"domain"`
	Descriptors []string `json:"descriptors"`
	Source      string   `json:"source"`
}

type ruleView struct {
	Name       string      `json:"name"`
	Domain     string      `json:"domain"`
	Descriptor string      `json:"descriptor"`
	Limits     []limitView `json:"limits,omitempty"`
	Unlimited  bool        `json:"unlimited,omitempty"`
	Deny       bool        `json:"deny,omitempty"`
	OnLimit    string      `json:"on_limit"`
	Queue      string      `json:"queue,omitempty"`
	Shadow     bool        `json:"shadow,omitempty"`
	Quota      bool        `json:"quota,omitempty"` // quota_mode
	Source     string      `json:"source"`
}

type limitView struct {
	Algorithm   limiter.Algorithm   `json:"algorithm"`
	Rate        int64               `json:"rate"`
	Period      string              `json:"period"`
	Burst       int64               `json:"burst,omitempty"`
	FailureMode limiter.FailureMode `json:"failure_mode,omitempty"`
}

type queueView struct {
	Name        string `json:"name"`
	Outflow     string `json:"outflow"`
	MaxDepth    int64  `json:"max_depth"`
	MaxAttempts int    `json:"max_attempts"`
	Downstream  string `json:"downstream"`
}

func (a *Admin) rules(w http.ResponseWriter, _ *http.Request) {
	var set *rules.Set
	if a.Rules != nil {
		set = a.Rules.Set()
	}
	if set == nil {
		writeProblem(w, simpleProblem(http.StatusServiceUnavailable, "No rules are loaded."))
		return
	}
	v := rulesView{Version: set.Version(), Files: set.Files(), Summary: set.Summary().String(),
		Routes: []routeView{}, Rules: []ruleView{}, Queues: []queueView{}}
	for _, rt := range set.Routes() {
		rv := routeView{Name: rt.Name, Domain: rt.Domain, Source: source(rt.File, rt.Line)}
		for _, d := range rt.Descriptors {
			parts := make([]string, len(d))
			for i, e := range d {
				parts[i] = e.String()
			}
			rv.Descriptors = append(rv.Descriptors, strings.Join(parts, ", "))
		}
		v.Routes = append(v.Routes, rv)
	}
	for _, r := range set.Rules() {
		rv := ruleView{Name: r.Name, Domain: r.Domain, Descriptor: r.Descriptor, Unlimited: r.Unlimited,
			Deny: r.Deny, OnLimit: string(r.OnLimit), Shadow: r.Shadow, Quota: r.Quota, Source: source(r.File, r.Line)}
		if r.Queue != nil {
			rv.Queue = r.Queue.Name
		}
		for _, l := range r.Limits {
			rv.Limits = append(rv.Limits, limitView{Algorithm: l.Algorithm, Rate: l.Rate,
				Period: l.Period.String(), Burst: l.Burst, FailureMode: l.FailureMode})
		}
		v.Rules = append(v.Rules, rv)
	}
	for _, q := range set.Queues() {
		v.Queues = append(v.Queues, queueView{Name: q.Name, Outflow: q.Outflow.String(),
			MaxDepth: q.MaxDepth, MaxAttempts: q.MaxAttempts, Downstream: q.Downstream})
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func source(file string, line int) string {
	return file + ":" + strconv.Itoa(line)
}
