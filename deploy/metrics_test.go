package deploy_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/rules/watch"
)

// metricKind is the Prometheus type of an exported metric.
type metricKind string

const (
	kindCounter   metricKind = "counter"
	kindGauge     metricKind = "gauge"
	kindHistogram metricKind = "histogram"
	kindSummary   metricKind = "summary"
	kindUntyped   metricKind = "untyped" // a custom collector that emitted nothing to look at
)

type exportedMetric struct {
	kind   metricKind
	labels []string
}

// recordingRegisterer is a prometheus.Registerer that registers on a real registry
// (so duplicate and inconsistent registrations fail as they would in sluice) and
// records every descriptor of every collector registered through it.
type recordingRegisterer struct {
	reg *prometheus.Registry

	mu      sync.Mutex
	metrics map[string]exportedMetric
}

func newRecordingRegisterer() *recordingRegisterer {
	return &recordingRegisterer{reg: prometheus.NewRegistry(), metrics: map[string]exportedMetric{}}
}

func (r *recordingRegisterer) Register(c prometheus.Collector) error {
	if err := r.reg.Register(c); err != nil {
		return err
	}
	kind := collectorKind(c)
	descs := make(chan *prometheus.Desc, 64)
	go func() { c.Describe(descs); close(descs) }()
	r.mu.Lock()
	defer r.mu.Unlock()
	for d := range descs {
		name, labels := parseDesc(d)
		r.metrics[name] = exportedMetric{kind: kind, labels: labels}
	}
	return nil
}

func (r *recordingRegisterer) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// Unregister unregisters from the registry; what was exported stays recorded.
func (r *recordingRegisterer) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

var descRE = regexp.MustCompile(`^Desc\{fqName: "([^"]+)".*variableLabels: \{([^}]*)\}\}$`)

// parseDesc reads a descriptor's name and variable labels from its String (Desc
// exports no accessors for them).
func parseDesc(d *prometheus.Desc) (string, []string) {
	m := descRE.FindStringSubmatch(d.String())
	if m == nil {
		panic("unexpected Desc format: " + d.String())
	}
	var labels []string
	for _, l := range strings.Split(m[2], ",") {
		l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")") // constrained labels
		if l != "" {
			labels = append(labels, l)
		}
	}
	return m[1], labels
}

// collectorKind tells the type of the metrics of a collector: from the vector type,
// or from what a plain metric or a custom collector writes.
func collectorKind(c prometheus.Collector) metricKind {
	switch c.(type) {
	case *prometheus.CounterVec:
		return kindCounter
	case *prometheus.GaugeVec:
		return kindGauge
	case *prometheus.HistogramVec:
		return kindHistogram
	case *prometheus.SummaryVec:
		return kindSummary
	}
	if m, ok := c.(prometheus.Metric); ok {
		return metricKindOf(m)
	}
	ch := make(chan prometheus.Metric, 1024)
	go func() { c.Collect(ch); close(ch) }()
	kind := kindUntyped
	for m := range ch {
		kind = metricKindOf(m)
	}
	return kind
}

func metricKindOf(m prometheus.Metric) metricKind {
	var pb dto.Metric
	if err := m.Write(&pb); err != nil {
		return kindUntyped
	}
	switch {
	case pb.Counter != nil:
		return kindCounter
	case pb.Gauge != nil:
		return kindGauge
	case pb.Histogram != nil:
		return kindHistogram
	case pb.Summary != nil:
		return kindSummary
	}
	return kindUntyped
}

// exportedMetrics builds every part of sluice that registers metrics, the way
// sluice serve builds them (cmd/sluice/gateway.go), on a recording registerer, and
// returns what they registered by name. Nothing is dialled but the in-process NATS
// server: the Redis client points at a closed port and is never called.
func exportedMetrics(t *testing.T) map[string]exportedMetric {
	t.Helper()
	rec := newRecordingRegisterer()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))

	w, err := watch.New([]string{rulesDir}, watch.Options{Registerer: rec, Logger: log, Poll: true, PollInterval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })

	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	store, err := redisstore.New(rdb, redisstore.WithRegisterer(rec), redisstore.WithLogger(log))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })

	if _, err := ingress.New(w, store, ingress.WithRegisterer(rec), ingress.WithLogger(log)); err != nil {
		t.Fatal(err)
	}
	if _, err := ingress.NewProxy(&url.URL{Scheme: "http", Host: "127.0.0.1:1"}, ingress.WithProxyRegisterer(rec), ingress.WithProxyLogger(log)); err != nil {
		t.Fatal(err)
	}
	deps, err := ingress.NewDependencies()
	if err != nil {
		t.Fatal(err)
	}
	rec.MustRegister(deps) // sluice_dependency_up, as serve registers it

	ns := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	qs, err := queue.Open(ctx, ns.Conn, queue.WithRegisterer(rec), queue.WithLogger(log), queue.WithSigningKey(natstest.SigningKey()))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dispatcher.New(qs, dispatcher.WithRegisterer(rec), dispatcher.WithLogger(log)); err != nil {
		t.Fatal(err)
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	out := map[string]exportedMetric{}
	for k, v := range rec.metrics {
		out[k] = v
	}
	if len(out) < 10 {
		t.Fatalf("only %d metrics recorded: %v", len(out), out)
	}
	// Completeness: a metric named in the source of these packages that none of the
	// parts built above registered means a part is missing here.
	for _, dir := range []string{"limiter", "rules", "ingress", "queue", "dispatcher"} {
		files, _ := filepath.Glob(filepath.Join(moduleRoot, dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range sourceMetricRE.FindAllSubmatch(data, -1) {
				if _, ok := out[string(m[1])]; !ok {
					t.Errorf("%s names metric %s, which the parts built by exportedMetrics did not register: build the part that does", f, m[1])
				}
			}
		}
	}
	return out
}

// sourceMetricRE finds metric names written as literals in Go source.
var sourceMetricRE = regexp.MustCompile(`(?:Name:\s*|NewDesc\(\s*)"(sluice_[a-z0-9_]+)"`)

// scrapeSeries are the series Prometheus itself adds for every target.
var scrapeSeries = map[string]exportedMetric{
	"up":                      {kind: kindGauge},
	"scrape_duration_seconds": {kind: kindGauge},
}

// targetLabels are the labels Prometheus attaches to every series of a target.
var targetLabels = []string{"job", "instance"}

// resolveMetric maps a series name of a query to the exported metric: histograms
// are queried as NAME_bucket / _sum / _count, summaries as NAME, _sum, _count. It
// returns the labels the series has.
func resolveMetric(exported map[string]exportedMetric, series string) ([]string, bool) {
	if m, ok := exported[series]; ok && m.kind != kindHistogram {
		if m.kind == kindSummary {
			return append(slices.Clone(m.labels), "quantile"), true
		}
		return m.labels, true
	}
	if m, ok := scrapeSeries[series]; ok {
		return m.labels, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, suffix)
		if !ok {
			continue
		}
		m, ok := exported[base]
		if !ok {
			continue
		}
		switch {
		case m.kind == kindHistogram && suffix == "_bucket":
			return append(slices.Clone(m.labels), "le"), true
		case m.kind == kindHistogram || m.kind == kindSummary && suffix != "_bucket":
			return m.labels, true
		}
	}
	return nil, false
}

// --- A small PromQL reader: enough to find the series, label matchers and grouping
// labels of an expression (no evaluation). Unknown functions are errors, so a typo in
// a function name is not mistaken for a metric.

var promFunctions = map[string]bool{}

func init() {
	for _, f := range strings.Fields(`abs absent absent_over_time acos acosh asin asinh atan atanh avg_over_time
		ceil changes clamp clamp_max clamp_min cos cosh count_over_time days_in_month day_of_month day_of_week
		day_of_year deg delta deriv exp floor histogram_avg histogram_count histogram_fraction histogram_quantile
		histogram_stddev histogram_stdvar histogram_sum holt_winters double_exponential_smoothing hour idelta
		increase info irate label_join label_replace last_over_time ln log10 log2 mad_over_time max_over_time
		min_over_time minute month pi predict_linear present_over_time quantile_over_time rad rate resets round
		scalar sgn sin sinh sort sort_desc sort_by_label sort_by_label_desc sqrt stddev_over_time stdvar_over_time
		sum_over_time tan tanh time timestamp vector year
		sum min max avg group stddev stdvar count count_values bottomk topk quantile limitk limit_ratio
		label_values`) {
		promFunctions[f] = true
	}
}

// promAggregations may put their grouping before the parentheses: sum by (x) (…).
var promAggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true,
	"stddev": true, "stdvar": true, "count": true, "count_values": true, "bottomk": true, "topk": true,
	"quantile": true, "limitk": true, "limit_ratio": true}

var promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
	"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true,
	"nan": true, "atan2": true, "start": true, "end": true}

// promSelector is one series selector: a metric name and its label matchers.
type promSelector struct {
	metric   string
	matchers map[string]string // label → value (the last one when a label repeats)
	ops      map[string]string
}

type promQuery struct {
	selectors []promSelector
	grouping  []string // labels of by / without / on / ignoring / group_x clauses
}

type promToken struct {
	kind byte // 'i' identifier, 's' string, 'n' number or variable, 'p' punctuation
	text string
}

func tokenizePromQL(expr string) ([]promToken, error) {
	var toks []promToken
	isIdentStart := func(c byte) bool { return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
	isIdent := func(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#':
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' {
					j++
				}
			}
			if j >= len(expr) {
				return nil, fmt.Errorf("unterminated string at %d", i)
			}
			toks = append(toks, promToken{'s', expr[i+1 : j]})
			i = j + 1
		case c == '$': // a Grafana variable: $name, ${name}, ${name:fmt}
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("unterminated ${ at %d", i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isIdent(expr[j]) {
					j++
				}
			}
			toks = append(toks, promToken{'n', expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			j := i
			for j < len(expr) && (isIdent(expr[j]) || expr[j] == '.' ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E')) {
				j++
			}
			toks = append(toks, promToken{'n', expr[i:j]})
			i = j
		case isIdentStart(c):
			j := i
			for j < len(expr) && isIdent(expr[j]) {
				j++
			}
			toks = append(toks, promToken{'i', expr[i:j]})
			i = j
		default:
			two := ""
			if i+1 < len(expr) {
				two = expr[i : i+2]
			}
			switch two {
			case "==", "!=", ">=", "<=", "=~", "!~":
				toks = append(toks, promToken{'p', two})
				i += 2
				continue
			}
			if !strings.ContainsRune("(){}[],+-*/%^<>=@:", rune(c)) {
				return nil, fmt.Errorf("unexpected %q at %d", c, i)
			}
			toks = append(toks, promToken{'p', string(c)})
			i++
		}
	}
	return toks, nil
}

func parsePromQL(expr string) (promQuery, error) {
	toks, err := tokenizePromQL(expr)
	if err != nil {
		return promQuery{}, err
	}
	var q promQuery
	depth := 0
	at := func(i int) promToken {
		if i < len(toks) {
			return toks[i]
		}
		return promToken{}
	}
	// matchers reads {a="x", b=~"y"} starting at toks[i] == "{"; it returns the index
	// after the closing brace.
	matchers := func(i int, sel *promSelector) (int, error) {
		i++
		for at(i).text != "}" {
			name, op, val := at(i), at(i+1), at(i+2)
			if name.kind != 'i' && name.kind != 's' || op.kind != 'p' || val.kind != 's' {
				return 0, fmt.Errorf("malformed label matcher near %q", name.text)
			}
			switch op.text {
			case "=", "!=", "=~", "!~":
			default:
				return 0, fmt.Errorf("bad matcher operator %q", op.text)
			}
			if name.text == "__name__" && op.text == "=" {
				sel.metric = val.text
			} else {
				sel.matchers[name.text] = val.text
				sel.ops[name.text] = op.text
			}
			i += 3
			if at(i).text == "," {
				i++
			} else if at(i).text != "}" {
				return 0, fmt.Errorf("expected , or } after matcher %s", name.text)
			}
		}
		return i + 1, nil
	}
	labelList := func(i int) (int, []string, error) {
		if at(i).text != "(" {
			return 0, nil, fmt.Errorf("expected ( after %s", at(i-1).text)
		}
		var labels []string
		for i++; at(i).text != ")"; i++ {
			switch {
			case at(i).kind == 'i':
				labels = append(labels, at(i).text)
			case at(i).text == ",":
			default:
				return 0, nil, fmt.Errorf("unexpected %q in label list", at(i).text)
			}
		}
		return i + 1, labels, nil
	}
	for i := 0; i < len(toks); {
		tk := toks[i]
		switch {
		case tk.kind == 'p' && tk.text == "[": // range or subquery: durations only
			j := i
			for j < len(toks) && toks[j].text != "]" {
				j++
			}
			i = j + 1
		case tk.kind == 'p' && tk.text == "{": // a selector without a name
			sel := promSelector{matchers: map[string]string{}, ops: map[string]string{}}
			if i, err = matchers(i, &sel); err != nil {
				return q, err
			}
			if sel.metric == "" {
				return q, fmt.Errorf("selector without a metric name")
			}
			q.selectors = append(q.selectors, sel)
		case tk.kind == 'p':
			switch tk.text {
			case "(":
				depth++
			case ")":
				depth--
			}
			i++
		case tk.kind == 'i':
			lower := strings.ToLower(tk.text)
			switch {
			case lower == "by" || lower == "without" || lower == "on" || lower == "ignoring" ||
				lower == "group_left" || lower == "group_right":
				if at(i+1).text != "(" && (lower == "group_left" || lower == "group_right") {
					i++
					continue
				}
				var labels []string
				if i, labels, err = labelList(i + 1); err != nil {
					return q, err
				}
				q.grouping = append(q.grouping, labels...)
			case promKeywords[lower]:
				i++
			case promAggregations[tk.text] && (at(i+1).text == "by" || at(i+1).text == "without"):
				i++ // sum by (…) (…): the grouping is read next
			case at(i+1).text == "(":
				if !promFunctions[tk.text] {
					return q, fmt.Errorf("unknown function %s", tk.text)
				}
				if tk.text == "label_values" { // Grafana: label_values(metric{…}, label)
					j := i + 2
					if at(j).kind != 'i' {
						return q, fmt.Errorf("label_values: want a metric first")
					}
					sel := promSelector{metric: at(j).text, matchers: map[string]string{}, ops: map[string]string{}}
					j++
					if at(j).text == "{" {
						if j, err = matchers(j, &sel); err != nil {
							return q, err
						}
					}
					if at(j).text != "," || at(j+1).kind != 'i' || at(j+2).text != ")" {
						return q, fmt.Errorf("label_values: want (metric, label)")
					}
					sel.matchers[at(j+1).text] = ""
					sel.ops[at(j+1).text] = "label_values"
					q.selectors = append(q.selectors, sel)
					i = j + 3
					continue
				}
				i++
			default:
				sel := promSelector{metric: tk.text, matchers: map[string]string{}, ops: map[string]string{}}
				i++
				if at(i).text == "{" {
					if i, err = matchers(i, &sel); err != nil {
						return q, err
					}
				}
				q.selectors = append(q.selectors, sel)
			}
		default:
			i++
		}
	}
	if depth != 0 {
		return q, fmt.Errorf("unbalanced parentheses")
	}
	return q, nil
}

// checkQuery checks one PromQL expression against the exported metrics: every
// series is exported, every matcher and grouping label is one of its labels (or a
// target label), matchers of job name a scrape job, and every label the template
// refers to exists. It returns the metric names the query reads.
func checkQuery(t *testing.T, where, expr string, exported map[string]exportedMetric, jobs []string, templateLabels []string) []string {
	t.Helper()
	q, err := parsePromQL(expr)
	if err != nil {
		t.Errorf("%s: %v in %q", where, err, expr)
		return nil
	}
	if len(q.selectors) == 0 && !strings.Contains(expr, "vector(") {
		t.Errorf("%s: no metric in %q", where, expr)
	}
	available := map[string]bool{}
	for _, l := range targetLabels {
		available[l] = true
	}
	var names []string
	for _, sel := range q.selectors {
		labels, ok := resolveMetric(exported, sel.metric)
		if !ok {
			t.Errorf("%s: %s is not a metric sluice exports (query %q)", where, sel.metric, expr)
			continue
		}
		names = append(names, sel.metric)
		has := map[string]bool{}
		for _, l := range append(slices.Clone(labels), targetLabels...) {
			has[l] = true
			available[l] = true
		}
		for l := range sel.matchers {
			if !has[l] {
				t.Errorf("%s: %s has no label %q (it has %v)", where, sel.metric, l, labels)
			}
		}
		if v, ok := sel.matchers["job"]; ok && sel.ops["job"] == "=" && !slices.Contains(jobs, v) {
			t.Errorf("%s: job=%q is no scrape job (%v)", where, v, jobs)
		}
	}
	for _, l := range append(q.grouping, templateLabels...) {
		if !available[l] {
			t.Errorf("%s: label %q is not a label of the series of %q", where, l, expr)
		}
	}
	return names
}

var (
	alertLabelRE  = regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`)
	legendLabelRE = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
)

type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Record      string            `yaml:"record"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// TestMetricsQueried checks every PromQL expression of the Grafana dashboard and of
// the alert rules against the metrics sluice exports.
func TestMetricsQueried(t *testing.T) {
	exported := exportedMetrics(t)
	var names []string
	for n, m := range exported {
		names = append(names, fmt.Sprintf("%s (%s %v)", n, m.kind, m.labels))
	}
	sort.Strings(names)
	t.Logf("sluice exports:\n  %s", strings.Join(names, "\n  "))
	jobs := scrapeJobs(t)
	used := map[string]bool{}

	t.Run("alerts", func(t *testing.T) {
		var ar alertRules
		decodeYAMLInto(t, "prometheus/alerts.yaml", &ar)
		if len(ar.Groups) == 0 {
			t.Fatal("no groups")
		}
		seen := map[string]bool{}
		for _, g := range ar.Groups {
			for _, r := range g.Rules {
				where := "alerts.yaml " + g.Name + "/" + r.Alert + r.Record
				if r.Alert == "" || r.Expr == "" {
					t.Errorf("%s: want alert and expr", where)
					continue
				}
				if seen[r.Alert] {
					t.Errorf("%s: duplicate alert", where)
				}
				seen[r.Alert] = true
				if r.For != "" {
					if _, err := parsePromDuration(r.For); err != nil {
						t.Errorf("%s: for: %v", where, err)
					}
				}
				if r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
					t.Errorf("%s: want a severity label and a summary", where)
				}
				var tl []string
				for _, a := range r.Annotations {
					for _, m := range alertLabelRE.FindAllStringSubmatch(a, -1) {
						tl = append(tl, m[1])
					}
				}
				for _, n := range checkQuery(t, where, r.Expr, exported, jobs, tl) {
					used[n] = true
				}
			}
		}
		for _, want := range []string{"sluice_queue_dead_total", "sluice_queue_depth", "sluice_limiter_fallback_total", "sluice_rules_reload_total", "sluice_upstream_requests_total"} {
			if !used[want] {
				t.Errorf("no alert on %s", want)
			}
		}
	})

	t.Run("dashboard", func(t *testing.T) {
		dash := loadDashboard(t)
		exprs := dashboardQueries(t, dash)
		if len(exprs) < 10 {
			t.Fatalf("only %d queries in the dashboard", len(exprs))
		}
		dashUsed := map[string]bool{}
		for _, e := range exprs {
			for _, n := range checkQuery(t, "dashboard "+e.where, e.expr, exported, jobs, e.labels) {
				used[n] = true
				dashUsed[n] = true
			}
		}
		// What the issue asks the dashboard to show.
		for _, want := range []string{"sluice_decisions_total", "sluice_queue_depth", "sluice_queue_delivered_total",
			"sluice_queue_retried_total", "sluice_queue_dead_total", "sluice_limiter_fallback_total",
			"sluice_decision_duration_seconds_bucket", "sluice_upstream_duration_seconds_bucket",
			"sluice_delivery_duration_seconds_bucket", "sluice_rules_reload_total"} {
			if !dashUsed[want] {
				t.Errorf("the dashboard does not show %s", want)
			}
		}
	})

	var unused []string
	for n := range exported {
		if !used[n] && !used[n+"_bucket"] && !used[n+"_count"] && !used[n+"_sum"] {
			unused = append(unused, n)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Logf("exported but neither on the dashboard nor in an alert: %v", unused)
	}
}

// parsePromDuration parses Prometheus durations (1h30m, 5m, 1d, 2w).
func parsePromDuration(s string) (time.Duration, error) {
	re := regexp.MustCompile(`^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$`)
	m := re.FindStringSubmatch(s)
	if s == "" || m == nil {
		return 0, fmt.Errorf("not a duration: %q", s)
	}
	units := []time.Duration{365 * 24 * time.Hour, 7 * 24 * time.Hour, 24 * time.Hour, time.Hour, time.Minute, time.Second, time.Millisecond}
	var d time.Duration
	for i, u := range units {
		if m[i+1] != "" {
			var n int64
			fmt.Sscan(m[i+1], &n)
			d += time.Duration(n) * u
		}
	}
	return d, nil
}

// TestPromQLReader guards the PromQL reader the metric checks rely on.
func TestPromQLReader(t *testing.T) {
	q, err := parsePromQL(`histogram_quantile(0.99, sum by (le, queue) (rate(a_bucket{queue=~"$queue",x!="y"}[$__rate_interval])))
		/ on (queue) group_left max without (z) (b offset 5m) > 1e3 unless c{__name__="d"} and {__name__="e"} + vector($v) + label_values(f{g="h"}, i)`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, s := range q.selectors {
		keys := make([]string, 0, len(s.matchers))
		for k := range s.matchers {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		got = append(got, s.metric+fmt.Sprint(keys))
	}
	want := []string{"a_bucket[queue x]", "b[]", "d[]", "e[]", "f[g i]"}
	if !slices.Equal(got, want) {
		t.Errorf("selectors %v, want %v", got, want)
	}
	if !slices.Equal(q.grouping, []string{"le", "queue", "queue", "z"}) {
		t.Errorf("grouping %v", q.grouping)
	}
	for _, bad := range []string{`rat(x[5m])`, `sum(x`, `x{a="b"`, `x{a}`} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
