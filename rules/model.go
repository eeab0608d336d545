package rules

import (
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// OnLimit says what happens to a request that a rule finds over its limit.
type OnLimit string

const (
	// Reject answers 429 at once (the default).
	Reject OnLimit = "reject"
	// Defer parks the request in the rule's queue and answers 202 Accepted.
	Defer OnLimit = "defer"
	// Wait holds the request until its paced slot comes, at most MaxWait, and then
	// forwards it; a request whose slot would come later falls back to Then.
	Wait OnLimit = "wait"
)

// DefaultMaxWaiting is a wait rule's max_waiting when the file gives none.
const DefaultMaxWaiting = 1000

// MaxWaitLimit is the longest max_wait a rules file may give: a held request's body
// is read after the hold, and the front door reads a request within 60 seconds.
const MaxWaitLimit = 30 * time.Second

// Rule is one descriptor of a rules file that says something about rate: it carries a
// rate_limit (or rate_limits), is unlimited, or denies everything. A Rule is immutable
// and shared by every request that matches it.
type Rule struct {
	// Name names the rule in logs, metrics and the RateLimit-Policy header. It is the
	// descriptor's `name` when it has one (characters other than letters, digits and
	// `_.:-` replaced by `_`), otherwise `DOMAIN.` followed by the descriptor path, each
	// level `key` or `key_value`. A value is written out only when it cannot come from a
	// request (routes set that key with constants only) and looks harmless; otherwise
	// it is replaced by a short hash, so an API key or client IP written in a rules file
	// to single it out never reaches a log line or a metric label. Names are at most
	// 128 bytes. Two rules may share a name (an explicit one); keys never collide.
	Name string
	// Domain is the domain (file) the rule belongs to.
	Domain string
	// Descriptor is the descriptor path as written in the file, `key=value` or `key`
	// per level, joined by `/`. It is meant for operators (check --explain, admin
	// pages); unlike Name it may show values written in the file.
	Descriptor string
	// Limits are the rate limits; a request must fit all of them. Empty when Unlimited
	// or Deny.
	Limits []limiter.Limit
	// Unlimited rules always allow (Envoy's `unlimited: true`); there is nothing to count.
	Unlimited bool
	// Deny rules allow nothing: Envoy's `requests_per_unit: 0` block-list idiom (only
	// in a plain Envoy rate_limit; with sluice's fields a zero limit is a problem).
	Deny bool
	// OnLimit is what happens over the limit: Reject, Defer or Wait.
	OnLimit OnLimit
	// Queue is the queue a Defer rule (or a Wait rule whose Then is Defer) parks
	// requests in; nil otherwise.
	Queue *Queue
	// MaxWait, MaxWaiting and Then are a Wait rule's (see the package doc, "Waiting"):
	// the longest a request is held for its slot, the most requests held at once per
	// rule in one process, and what happens to a request that cannot wait (Reject or
	// Defer). Zero for other rules.
	MaxWait    time.Duration
	MaxWaiting int64
	Then       OnLimit
	// Shadow rules are computed, counted and logged but never enforced. True when the
	// descriptor or its whole file is in shadow mode.
	Shadow bool
	// Quota is Envoy's `quota_mode`: the rule over its limit does not deny a request by
	// itself. A request is denied by its quota rules only when every quota rule it
	// reaches is over its limit (then as over any rule: 429, or 202 for a defer rule);
	// while one of them has room it passes, and the exhausted ones are reported (the
	// OVER_LIMIT status of their descriptor over gRPC; remaining 0 in the rate-limit
	// headers, which describe the rule closest to running out). Rules without quota
	// mode deny as always, whatever the quota rules say. A quota rule in shadow mode
	// is never exhausted (Envoy reports its descriptor OK), so a request reaching one
	// is never denied by quota. Always false for Unlimited rules, which Envoy leaves
	// out of the count.
	Quota bool
	// DetailedMetric is Envoy's `detailed_metric`. Envoy then puts the request's value
	// into the stats name; sluice never puts request values into metric labels, so the
	// flag is only carried for the ingress to log the (hashed) key.
	DetailedMetric bool
	// Metadata is Envoy's per-descriptor `metadata`, as written: a JSON-like mapping
	// (map[string]any, []any, string, int, float64, bool, nil). Envoy's service returns
	// it to the client when the descriptor is under its limit; so does sluice's gRPC
	// service when asked to (envoy.WithDynamicMetadata), never into logs or metric
	// labels. Shared: do not modify.
	Metadata map[string]any
	// Replaces lists the names of rules this one replaces when both match one request
	// (Envoy's `replaces`).
	Replaces []string
	// File and Line locate the descriptor.
	File string
	Line int

	envoyName string   // the `name` as written: what `replaces` refers to
	prefixes  []string // per limit, the constant start of its limiter key
	offsets   []int    // per limit, the sum of the lengths of the prefixes before it
	// staticKeys are the keys when no request value selects the counter.
	staticKeys string
}

// Check is one rule a request must pass, with the keys it is counted under.
type Check struct {
	// Rule is the matched rule.
	Rule *Rule
	// Descriptor is the index of the descriptor list that produced the check: in the
	// route's Descriptors for Match, in the descriptors given to Evaluate.
	Descriptor int

	keys    string // the keys of every limit, one after the other
	hashLen int    // length of the request-dependent end of each key
}

// Key returns the limiter key of Rule.Limits[i]. Keys are namespaced by domain, by the
// descriptor (so different rules never share a counter) and by the limit's algorithm and
// window (so several limits on one descriptor have a counter each); request values that
// select the counter (the user of a per-user limit) are hashed (SHA-256, truncated to
// 128 bits), so a key never contains a raw API key or client IP and is at most about
// 90 bytes. Keys are stable across reloads and replicas: the same rule and values give
// the same key as long as the descriptor path and the limit's algorithm and window do
// not change. The shape is
//
//	sl:DOMAIN:RULEHASH:LIMIT[:VALUESHASH]
//
// where DOMAIN is the domain cut to 32 characters of [A-Za-z0-9_.-], RULEHASH is 16 hex
// digits of the domain and descriptor path, LIMIT is the algorithm and window (fw1m for
// a fixed window of a minute, tb1s, swc10m) and VALUESHASH (22 base64url characters) is
// the hash of the request values that select the counter; it is absent when no value
// does (every level of the descriptor has a value written in the file).
func (c *Check) Key(i int) string {
	r := c.Rule
	start := r.offsets[i] + i*c.hashLen
	return c.keys[start : start+len(r.prefixes[i])+c.hashLen]
}

// Entry is one key/value pair of a descriptor, as the Envoy rate limit service receives
// it from Envoy.
type Entry struct {
	Key   string
	Value string
}

// SourceKind is where a route's descriptor entry takes its value from.
type SourceKind uint8

const (
	// FromConstant: the entry's Value, written in the file.
	FromConstant SourceKind = iota
	// FromHeader: the value of the request header Name (Host for `header:Host`); a
	// request giving it more than one is refused (Set.Repeated).
	FromHeader
	// FromQuery: the value of the query parameter Name, URL-decoded; present more than
	// once, the request is refused (Set.Repeated).
	FromQuery
	// FromClientIP: the client address the ingress determined (IPv4-mapped IPv6
	// addresses are written as IPv4).
	FromClientIP
	// FromPath: the path segment the route's path_pattern names {Name}.
	FromPath
	// FromMethod: the request method.
	FromMethod
	// FromHost: the request host without port, in lower case.
	FromHost
)

// RouteEntry is one entry of a route's descriptor list.
type RouteEntry struct {
	Key string
	// From is where the value comes from; Name is the header, query parameter or path
	// parameter name for the kinds that have one.
	From SourceKind
	Name string
	// Value is the constant (FromConstant), or the value used when the request has no
	// value for the source (empty: the whole descriptor list is skipped).
	Value string
}

// String writes e as the rules file would: `key=value` or `key<-from`.
func (e RouteEntry) String() string {
	if e.From == FromConstant {
		return e.Key + "=" + e.Value
	}
	s := e.Key + "<-" + e.source()
	if e.Value != "" {
		s += " (default " + e.Value + ")"
	}
	return s
}

func (e RouteEntry) source() string {
	switch e.From {
	case FromHeader:
		return "header:" + e.Name
	case FromQuery:
		return "query:" + e.Name
	case FromClientIP:
		return "client_ip"
	case FromPath:
		return "path:{" + e.Name + "}"
	case FromMethod:
		return "method"
	case FromHost:
		return "host"
	}
	return "value"
}

// DefaultIdempotencyScope is the idempotency scope of a route that names none: the
// caller's credentials as HTTP carries them.
var DefaultIdempotencyScope = []RouteEntry{
	{Key: "idempotency_scope", From: FromHeader, Name: "Authorization"},
	{Key: "idempotency_scope", From: FromHeader, Name: "Cookie"},
}

// HeaderMatch is one header condition of a route: the header equals Value, or (when
// Present is non-nil) is present or absent.
type HeaderMatch struct {
	Name    string
	Value   string
	Present *bool
}

// RouteMatch is what a request must look like for a route to apply. Empty fields match
// anything.
type RouteMatch struct {
	Methods     []string
	Host        string
	Path        string
	PathPrefix  string
	PathPattern string
	Headers     []HeaderMatch
}

// Route turns matching HTTP requests into descriptors of its domain.
type Route struct {
	Name   string
	Domain string
	Match  RouteMatch
	// Descriptors are the route's descriptor lists; each one that can be built from a
	// request is checked.
	Descriptors [][]RouteEntry
	// IdempotencyScope are the sources that, with the client's address group, tell
	// callers apart for Idempotency-Key scoping (default DefaultIdempotencyScope).
	IdempotencyScope []RouteEntry
	// Priority is the source of the priority level of the orders the route defers
	// (nil: none, the queue's default level): a constant (`priority: {value: high}`)
	// or a request source with an optional default (`{from: "header:X-Priority",
	// default: normal}`). A value that names no level of the queue is its default.
	Priority *RouteEntry
	File     string
	Line     int

	order     int // position in the set, for ties
	scope     []compiledEntry
	priority  []compiledEntry
	methods   []string
	host      string // lower case; "*.x" matches subdomains of x
	headers   []compiledHeader
	params    map[string]int // path pattern parameter → segment index
	descs     []compiledDesc
	dom       *domain
	allStatic bool // every descriptor list is made of constants
	clientIP  bool // a descriptor list takes the client's address
}

// Queue is where Defer rules park requests and how they are delivered: the queue
// package's configuration (defaults applied, Downstream in its canonical form:
// an http(s) URL or nats:SUBJECT), and where the queue was written.
type Queue struct {
	queueconfig.Config
	Domain string
	File   string
	Line   int

	fairBy []compiledEntry // the FairBy source (none without)
	flowBy []compiledEntry // the FlowBy.From source (none without)
}

// Summary counts what a set holds.
type Summary struct {
	Domains     int
	Descriptors int
	Rules       int
	Routes      int
	Queues      int
}

func (s Summary) String() string {
	return plural(s.Domains, "domain") + ", " + plural(s.Descriptors, "descriptor") + ", " +
		plural(s.Routes, "route") + ", " + plural(s.Queues, "queue")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return formatInt(int64(n)) + " " + what + "s"
}

// safeName replaces every character outside letters, digits and `_.:-` by `_`.
func safeName(s string) string {
	if strings.IndexFunc(s, unsafeRune) < 0 {
		return s
	}
	return strings.Map(func(r rune) rune {
		if unsafeRune(r) {
			return '_'
		}
		return r
	}, s)
}

func unsafeRune(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '.' || r == ':' || r == '-')
}

// DescribeLimit writes l for people: `fixed_window 100/1m`, `token_bucket 2/1s burst 4`,
// plus the failure mode when it is not the default.
func DescribeLimit(l limiter.Limit) string {
	s := string(l.Algorithm) + " " + formatInt(l.Rate) + "/" + limiter.FormatDuration(l.Period)
	if (l.Algorithm == limiter.TokenBucket || l.Algorithm == limiter.LeakyBucket) && l.Burst > 0 {
		s += " burst " + formatInt(l.Burst)
	}
	if l.ForgiveRejected {
		s += " forgive_rejected"
	}
	if l.FailureMode != "" && l.FailureMode != limiter.FailLocal {
		s += " failure_mode " + string(l.FailureMode)
	}
	return s
}

// Parks reports whether a request over r's limit is parked in its queue: a Defer
// rule, or a Wait rule whose request cannot wait (Then is Defer).
func (r *Rule) Parks() bool {
	return r.OnLimit == Defer || r.OnLimit == Wait && r.Then == Defer
}

// Pace is a Wait rule's leaking bucket: a slot every Period/Rate of its limit, a
// request waiting at most MaxWait for its slot.
func (r *Rule) Pace() limiter.Pace {
	if len(r.Limits) == 0 {
		return limiter.Pace{}
	}
	return limiter.PaceOf(r.Limits[0], r.MaxWait)
}
