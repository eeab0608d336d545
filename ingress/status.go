package ingress

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DependencyState is how a service shared by every replica (Redis, NATS) is doing,
// as this process sees it.
type DependencyState string

const (
	// DependencyUp: it answers and is used.
	DependencyUp DependencyState = "up"
	// DependencyDegraded: it answers, but not everything works yet (queues not
	// declared, decisions still falling back).
	DependencyDegraded DependencyState = "degraded"
	// DependencyDown: it does not answer within the check's timeout.
	DependencyDown DependencyState = "down"
)

// DependencyCheck checks a dependency once. It must return by ctx's deadline; a check
// that does not is reported down all the same.
type DependencyCheck func(ctx context.Context) DependencyReport

// DependencyReport is the result of one check.
type DependencyReport struct {
	State DependencyState
	// Err says why the state is not up.
	Err error
	// Detail is shown as is in the status (JSON): what else an operator needs, such
	// as the fallback in force.
	Detail any
}

// DependencyStatus is one dependency in GET /sluice/v1/status.
type DependencyStatus struct {
	State DependencyState `json:"state"`
	// Since is when the state was first seen (the first check at the latest).
	Since     time.Time `json:"since"`
	CheckedAt time.Time `json:"checked_at"`
	// LastError and LastErrorAt are of the latest failed check, also once up again.
	LastError   string     `json:"last_error,omitempty"`
	LastErrorAt *time.Time `json:"last_error_at,omitempty"`
	Detail      any        `json:"detail,omitempty"`
}

// DependencyOption configures Dependencies.
type DependencyOption func(*Dependencies)

// WithCheckTimeout bounds each check (default 2s; it must be positive).
func WithCheckTimeout(d time.Duration) DependencyOption {
	return func(s *Dependencies) { s.timeout = d }
}

// WithSecrets names strings that must never appear in a status (passwords that a
// client library might repeat in an error); they are replaced by "REDACTED".
func WithSecrets(secrets ...string) DependencyOption {
	return func(s *Dependencies) {
		for _, v := range secrets {
			if v != "" {
				s.secrets = append(s.secrets, v)
			}
		}
	}
}

// WithDependencyLogger logs each change of a dependency's state (default: discard).
func WithDependencyLogger(l *slog.Logger) DependencyOption {
	return func(s *Dependencies) { s.log = l }
}

// dependencyFresh is how long a round of checks is reused: status calls and scrapes
// that come together cost Redis and NATS one round trip each.
const dependencyFresh = time.Second

// Dependencies watches the services shared by every replica, for GET
// /sluice/v1/status and the sluice_dependency_up gauge. They are deliberately not
// part of readiness: a Redis or NATS outage is every replica's at once, and marking
// all of them unready would take the whole front door down while it can still serve
// (limits fall back, defers answer 503). Checks run when asked for, each bounded by
// its own timeout; a round is reused for a second. It is a prometheus.Collector.
type Dependencies struct {
	timeout time.Duration
	secrets []string
	log     *slog.Logger

	names  []string
	checks map[string]DependencyCheck

	mu     sync.Mutex // one round at a time
	last   map[string]*DependencyStatus
	lastAt time.Time

	upDesc, stateDesc *prometheus.Desc
}

// NewDependencies returns a watcher without dependencies; add them with Add. It fails
// when WithCheckTimeout was given a duration that is not positive.
func NewDependencies(opts ...DependencyOption) (*Dependencies, error) {
	d := &Dependencies{timeout: 2 * time.Second, checks: map[string]DependencyCheck{}, last: map[string]*DependencyStatus{},
		upDesc: prometheus.NewDesc("sluice_dependency_up",
			"1 while the dependency (redis, nats) is up as this process sees it, else 0 (degraded or down). Not part of readiness.",
			[]string{"dependency"}, nil),
		stateDesc: prometheus.NewDesc("sluice_dependency_state",
			"1 for the dependency's current state (up, degraded, down), 0 for the others.",
			[]string{"dependency", "state"}, nil),
	}
	for _, o := range opts {
		o(d)
	}
	if d.timeout <= 0 {
		return nil, fmt.Errorf("ingress: the dependency check timeout must be positive, got %v", d.timeout)
	}
	if d.log == nil {
		d.log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return d, nil
}

// Add adds a dependency named name (a metric label: keep it a constant). Add before
// the first Status.
func (d *Dependencies) Add(name string, check DependencyCheck) {
	if _, ok := d.checks[name]; !ok {
		d.names = append(d.names, name)
		sort.Strings(d.names)
	}
	d.checks[name] = check
}

// Status checks every dependency (or reuses a round less than a second old) and
// returns their statuses by name.
func (d *Dependencies) Status(ctx context.Context) map[string]DependencyStatus {
	d.mu.Lock()
	defer d.mu.Unlock()
	if time.Since(d.lastAt) >= dependencyFresh {
		// A caller that hangs up must not make a dependency look down.
		d.round(context.WithoutCancel(ctx))
	}
	out := make(map[string]DependencyStatus, len(d.last))
	for name, st := range d.last {
		out[name] = *st
	}
	return out
}

// round runs every check at once, each bounded by the timeout.
func (d *Dependencies) round(ctx context.Context) {
	reports := make([]DependencyReport, len(d.names))
	var wg sync.WaitGroup
	for i, name := range d.names {
		wg.Go(func() { reports[i] = d.check(ctx, d.checks[name]) })
	}
	wg.Wait()
	now := time.Now()
	for i, name := range d.names {
		d.record(name, reports[i], now)
	}
	d.lastAt = now
}

// check runs one check and returns shortly after the timeout even if the check does
// not: its goroutine then ends on its own, and the dependency is reported down. The
// grace lets a check that honours its deadline report what it knows.
func (d *Dependencies) check(ctx context.Context, check DependencyCheck) DependencyReport {
	cctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	done := make(chan DependencyReport, 1)
	go func() { done <- check(cctx) }()
	ctx, cancelGrace := context.WithTimeout(ctx, d.timeout+d.timeout/4)
	defer cancelGrace()
	select {
	case r := <-done:
		if r.State == "" {
			r.State = DependencyUp
		}
		if r.State != DependencyUp && r.Err == nil {
			r.Err = errors.New(string(r.State))
		}
		return r
	case <-ctx.Done():
		return DependencyReport{State: DependencyDown, Err: errors.New("no answer within " + d.timeout.String())}
	}
}

func (d *Dependencies) record(name string, r DependencyReport, now time.Time) {
	st := d.last[name]
	if st == nil {
		st = &DependencyStatus{State: r.State, Since: now}
		d.last[name] = st
		if r.State != DependencyUp {
			d.log.Warn("dependency "+string(r.State), "dependency", name, "err", d.redact(r.Err.Error()))
		}
	} else if st.State != r.State {
		if r.State == DependencyUp {
			d.log.Info("dependency up", "dependency", name, "was", st.State, "for", now.Sub(st.Since).Round(time.Millisecond))
		} else {
			d.log.Warn("dependency "+string(r.State), "dependency", name, "was", st.State, "err", d.redact(r.Err.Error()))
		}
		st.State, st.Since = r.State, now
	}
	st.CheckedAt, st.Detail = now, r.Detail
	if r.Err != nil {
		at := now
		st.LastError, st.LastErrorAt = d.redact(r.Err.Error()), &at
	}
}

func (d *Dependencies) redact(s string) string {
	for _, secret := range d.secrets {
		s = strings.ReplaceAll(s, secret, "REDACTED")
	}
	return s
}

// Describe implements prometheus.Collector.
func (d *Dependencies) Describe(ch chan<- *prometheus.Desc) {
	ch <- d.upDesc
	ch <- d.stateDesc
}

// Collect implements prometheus.Collector: a scrape checks like a status call.
func (d *Dependencies) Collect(ch chan<- prometheus.Metric) {
	for name, st := range d.Status(context.Background()) {
		up := 0.0
		if st.State == DependencyUp {
			up = 1
		}
		ch <- prometheus.MustNewConstMetric(d.upDesc, prometheus.GaugeValue, up, name)
		for _, s := range []DependencyState{DependencyUp, DependencyDegraded, DependencyDown} {
			v := 0.0
			if st.State == s {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(d.stateDesc, prometheus.GaugeValue, v, name, string(s))
		}
	}
}
