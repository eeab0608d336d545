package rules

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Set is a validated, compiled rules set. It is immutable: every method is safe for
// concurrent use, and a reload builds a new Set instead of changing one, so a request
// that holds a *Set sees one rules set from start to end.
type Set struct {
	files       []string
	version     string
	domains     map[string]*domain
	domainNames []string
	routes      []*Route
	rules       []*Rule
	queues      map[string]*Queue
	queueNames  []string
	table       routeTable
	choosing    []choosingHeader // see Repeated
}

// Match finds the route for r and appends to dst the checks r must pass, returning the
// route (nil when none matches) and the extended slice. clientIP is the client address
// the ingress determined (the zero Addr when unknown: descriptors that need it are
// skipped).
//
// Route choice: the path is cleaned first (path.Clean: `//`, `.` and `..` removed, no
// trailing slash), then the most specific path wins: an exact `path`, then a
// `path_pattern` (literal segments before {params}, left to right), then the longest
// `path_prefix` (whole segments: /v1/orders covers /v1/orders and /v1/orders/7, not
// /v1/orders-old), then routes without a path. Among routes with the same path the first
// one (in file order, files in the order loaded) whose method, host and headers match
// wins. Exactly one route applies to a request.
//
// Checks: each of the route's descriptor lists whose values are all present (or have a
// default) is looked up in the route's domain as Envoy's rate limit service does and
// yields a check if it reaches a rule; a list with a value missing is skipped. Then a
// matched rule that `replaces` another's name removes that one, and a list that
// reaches the same rule with the same values as an earlier one is dropped (so one
// request is never counted twice on one counter). The caller checks every limit of
// every check; the most restrictive outcome wins.
//
// Values: a header or query parameter gives its first value; a caller refuses a
// request for which Repeated reports more than one (the front door does), since the
// upstream may read another.
//
// Match does not allocate, except one string per check whose keys hold request values
// (the keys of a rule fully given by constants are precomputed). Pass a reused dst.
func (s *Set) Match(r *http.Request, clientIP netip.Addr, dst []Check) (*Route, []Check) {
	p, host := cleanPath(r.URL.Path), requestHost(r)
	rt := s.table.find(r, p, host)
	if rt == nil {
		return nil, dst
	}
	return rt, rt.eval(r, clientIP, p, host, dst)
}

// Evaluate looks descriptors up in domain as Envoy's rate limit service answers a
// RateLimitRequest, for programs that build descriptors themselves: each descriptor
// yields a check when it reaches a rule (Check.Descriptor is its index), then
// `replaces` is applied as in Match. Unlike Match, a descriptor sent twice yields two
// checks on the same counter, so the request is charged twice, as Envoy's service
// charges every descriptor it is sent. Unknown domains yield nothing.
func (s *Set) Evaluate(domain string, descriptors [][]Entry, dst []Check) []Check {
	d := s.domains[domain]
	if d == nil {
		return dst
	}
	start := len(dst)
	var (
		vals [maxDepth]val
		hb   hashBuf
	)
	for i, desc := range descriptors {
		if len(desc) == 0 || len(desc) > maxDepth {
			continue
		}
		for j, e := range desc {
			vals[j] = val{key: e.Key, s: e.Value}
		}
		hb.n = 0
		if rule, hashed := d.walk(vals[:len(desc)], nil, &hb); rule != nil {
			dst = append(dst, makeCheck(rule, i, hashed, &hb))
		}
	}
	return settle(dst, start, false)
}

// val is one descriptor entry's key and value while a request is matched. A client
// address is not turned into a string (that would allocate): ip says to read it from the
// request's ipText.
type val struct {
	key string
	s   string
	ip  bool
}

// ipText is the client address in canonical text form, written once per request.
type ipText struct {
	b [48]byte
	n int
	s string // the text as a string, made when a wildcard pattern needs it
}

func (t *ipText) str() string {
	if t.s == "" && t.n > 0 {
		t.s = string(t.b[:t.n])
	}
	return t.s
}

func (t *ipText) set(a netip.Addr) {
	if a.IsValid() {
		t.n = len(a.Unmap().WithZone("").AppendTo(t.b[:0]))
	}
}

func (g *group) lookup(v *val) (*node, bool) {
	return g.lookupIP(v, nil)
}

// lookupIP finds the most specific descriptor of g for v, as Envoy ranks them: the
// exact value, then the first wildcard (a value with *) in file order that matches,
// then the descriptor without value. exact reports the first case, where the value
// needs no hashing into the key.
func (g *group) lookupIP(v *val, t *ipText) (n *node, exact bool) {
	if v.ip {
		n = g.exact[string(t.b[:t.n])]
	} else {
		n = g.exact[v.s]
	}
	if n != nil {
		return n, true
	}
	for i := range g.wild {
		w := &g.wild[i]
		switch {
		case !v.ip:
			if w.matches(v.s) {
				return w.n, false
			}
		case w.parts == nil: // a prefix: compared in place, without a string
			if t.n >= len(w.prefix) && string(t.b[:len(w.prefix)]) == w.prefix {
				return w.n, false
			}
		case w.matches(t.str()):
			return w.n, false
		}
	}
	return g.any, false
}

// walk follows vals down d's tree as Envoy does: one level per entry, no backtracking,
// and the rule counts only on the level of the last entry. Values matched by a
// wildcard or a descriptor without value are written into hb: they select the counter,
// as the request's values make Envoy's cache key; except under a share_threshold
// wildcard, whose values all count on one counter.
func (d *domain) walk(vals []val, t *ipText, hb *hashBuf) (rule *Rule, hashed bool) {
	n := d.root
	for i := range vals {
		v := &vals[i]
		g := n.kids[v.key]
		if g == nil {
			return nil, false
		}
		m, exact := g.lookupIP(v, t)
		if m == nil {
			return nil, false
		}
		if !exact && !m.share {
			hb.add(i, v, t)
			hashed = true
		}
		if i == len(vals)-1 {
			return m.rule, hashed
		}
		if len(m.kids) == 0 {
			return nil, false
		}
		n = m
	}
	return nil, false
}

// staticCheck resolves a descriptor list made of constants once, at compile time.
func (d *domain) staticCheck(vals []val) (Check, bool) {
	var hb hashBuf
	rule, hashed := d.walk(vals, nil, &hb)
	if rule == nil {
		return Check{}, false
	}
	return makeCheck(rule, 0, hashed, &hb), true
}

// hashBuf collects the values that select a counter, to hash them into the key. Each is
// written with its level and length, so different values never give the same input.
type hashBuf struct {
	n int
	b [1024 + maxDepth*34]byte // raw values up to 1 KiB, room for every level hashed
}

// rawMax is the longest value written into hashBuf as is; a longer one, or one that no
// longer fits, is hashed first (which allocates). The encoding depends only on the
// values, so the same values always give the same key.
const rawMax = 255

func (h *hashBuf) add(level int, v *val, t *ipText) {
	n := len(v.s)
	if v.ip {
		n = t.n
	}
	if n <= rawMax && h.n+3+n <= len(h.b)-maxDepth*34 {
		h.b[h.n], h.b[h.n+1], h.b[h.n+2] = byte(level), 0, byte(n)
		h.n += 3
		if v.ip {
			h.n += copy(h.b[h.n:], t.b[:t.n])
		} else {
			h.n += copy(h.b[h.n:], v.s)
		}
		return
	}
	var sum [32]byte
	if v.ip {
		sum = sha256.Sum256(t.b[:t.n])
	} else {
		sum = sha256.Sum256([]byte(v.s))
	}
	h.b[h.n], h.b[h.n+1] = byte(level), 1
	h.n += 2
	h.n += copy(h.b[h.n:], sum[:])
}

// hashLen is the length of the request-dependent end of a key: a colon and 128 bits in
// base64url.
const hashLen = 23

func makeCheck(rule *Rule, desc int, hashed bool, hb *hashBuf) Check {
	c := Check{Rule: rule, Descriptor: desc}
	if len(rule.prefixes) == 0 {
		return c
	}
	if !hashed {
		c.keys = rule.staticKeys
		return c
	}
	sum := sha256.Sum256(hb.b[:hb.n])
	var vh [hashLen]byte
	vh[0] = ':'
	base64.RawURLEncoding.Encode(vh[1:], sum[:16])
	var b strings.Builder
	b.Grow(len(rule.staticKeys) + len(rule.prefixes)*hashLen)
	for _, p := range rule.prefixes {
		b.WriteString(p)
		b.Write(vh[:])
	}
	c.keys, c.hashLen = b.String(), hashLen
	return c
}

// settle applies `replaces` among the checks dst[start:] and, with dedupe, drops
// repeats of an earlier check.
func settle(dst []Check, start int, dedupe bool) []Check {
	cs := dst[start:]
	if len(cs) < 2 {
		return dst
	}
	var d dropSet
	d.compute(cs, dedupe)
	out := start
	for i := range cs {
		if !d.has(i) {
			dst[out] = cs[i]
			out++
		}
	}
	clear(dst[out:])
	return dst[:out]
}

// dropSet marks the checks settle removes: those whose rule another matched rule
// replaces, and repeats of an earlier check (same rule, same keys). Up to 64 checks
// (a route's most) fit in a word; more take a slice.
type dropSet struct {
	small uint64
	big   []bool
}

func (d *dropSet) mark(i int) {
	if d.big != nil {
		d.big[i] = true
	} else {
		d.small |= 1 << i
	}
}

func (d *dropSet) has(i int) bool {
	if d.big != nil {
		return d.big[i]
	}
	return d.small&(1<<i) != 0
}

func (d *dropSet) compute(cs []Check, dedupe bool) {
	if len(cs) > 64 {
		d.big = make([]bool, len(cs))
	}
	for i := range cs {
		for _, name := range cs[i].Rule.Replaces {
			for j := range cs {
				if cs[j].Rule.envoyName == name {
					d.mark(j)
				}
			}
		}
		for j := range i {
			if dedupe && cs[j].Rule == cs[i].Rule && cs[j].keys == cs[i].keys {
				d.mark(i)
				break
			}
		}
	}
}

// compiledDesc is a route's descriptor list, ready for requests.
type compiledDesc struct {
	index   int
	entries []compiledEntry
	// static lists are made of constants only: their check is computed once.
	static      bool
	staticCheck Check
	staticOK    bool
}

type compiledEntry struct {
	key        string
	kind       SourceKind
	name       string // header (canonical) or query parameter name
	value      string // the constant, or the default
	hasDefault bool
	seg        int // path segment of a FromPath entry
}

func compileDesc(index int, entries []RouteEntry, params map[string]int) compiledDesc {
	cd := compiledDesc{index: index, static: true}
	for _, e := range entries {
		ce := compiledEntry{key: e.Key, kind: e.From, name: e.Name, value: e.Value}
		switch e.From {
		case FromConstant:
		case FromHeader:
			if e.Name == "Host" {
				ce.kind = FromHost // net/http moves Host out of the header map
			}
			fallthrough
		default:
			cd.static = false
			ce.hasDefault = e.Value != ""
		}
		if e.From == FromPath {
			ce.seg = params[e.Name]
		}
		cd.entries = append(cd.entries, ce)
	}
	return cd
}

func (cd *compiledDesc) constVals() []val {
	vals := make([]val, len(cd.entries))
	for i, e := range cd.entries {
		vals[i] = val{key: e.key, s: e.value}
	}
	return vals
}

// get reads the entry's value from the request into v; false when it has none.
func (e *compiledEntry) get(r *http.Request, t *ipText, p, host string, v *val) bool {
	v.key, v.ip = e.key, false
	switch e.kind {
	case FromConstant:
		v.s = e.value
		return true
	case FromHeader:
		if vs := r.Header[e.name]; len(vs) > 0 && vs[0] != "" {
			v.s = vs[0]
			return true
		}
	case FromQuery:
		if s, ok := queryValue(r.URL.RawQuery, e.name); ok {
			v.s = s
			return true
		}
	case FromClientIP:
		if t.n > 0 {
			v.ip = true
			return true
		}
	case FromPath:
		if s := segmentAt(p, e.seg); s != "" {
			v.s = s
			return true
		}
	case FromMethod:
		if r.Method != "" {
			v.s = r.Method
			return true
		}
	case FromHost:
		if host != "" {
			v.s = host
			return true
		}
	}
	if e.hasDefault {
		v.s = e.value
		return true
	}
	return false
}

// eval appends the checks of the route's descriptor lists for r.
func (rt *Route) eval(r *http.Request, clientIP netip.Addr, p, host string, dst []Check) []Check {
	start := len(dst)
	if rt.allStatic {
		for i := range rt.descs {
			if cd := &rt.descs[i]; cd.staticOK {
				dst = append(dst, cd.staticCheck)
			}
		}
		return settle(dst, start, true)
	}
	// The scratch space is zeroed once per request, not once per descriptor list.
	var (
		t    ipText
		vals [maxDepth]val
		hb   hashBuf
	)
	t.set(clientIP)
	for i := range rt.descs {
		cd := &rt.descs[i]
		if cd.static {
			if cd.staticOK {
				dst = append(dst, cd.staticCheck)
			}
			continue
		}
		if c, ok := rt.evalDynamic(cd, r, &t, p, host, &vals, &hb); ok {
			dst = append(dst, c)
		}
	}
	return settle(dst, start, true)
}

func (rt *Route) evalDynamic(cd *compiledDesc, r *http.Request, t *ipText, p, host string, vals *[maxDepth]val, hb *hashBuf) (Check, bool) {
	for j := range cd.entries {
		if !cd.entries[j].get(r, t, p, host, &vals[j]) {
			return Check{}, false
		}
	}
	hb.n = 0
	rule, hashed := rt.dom.walk(vals[:len(cd.entries)], t, hb)
	if rule == nil {
		return Check{}, false
	}
	return makeCheck(rule, cd.index, hashed, hb), true
}

// queryValue returns the first value of query parameter name in raw, decoded, as
// url.Values.Get would, without parsing the whole query. An empty value counts as absent.
func queryValue(raw, name string) (string, bool) {
	v, _, found := nextParam(raw, name)
	if !found {
		return "", false
	}
	if strings.ContainsAny(v, "%+") {
		uv, err := url.QueryUnescape(v)
		if err != nil {
			return "", false
		}
		v = uv
	}
	return v, v != ""
}

// nextParam finds the next occurrence of parameter name in the raw query raw, names
// compared after URL-decoding, and returns its raw value and the query after it.
func nextParam(raw, name string) (v, rest string, found bool) {
	for raw != "" {
		var kv, k string
		kv, raw, _ = strings.Cut(raw, "&")
		k, v, _ = strings.Cut(kv, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			if uk, err := url.QueryUnescape(k); err != nil || uk != name {
				continue
			}
		}
		return v, raw, true
	}
	return "", "", false
}

// segmentAt returns segment i of the clean path p ("" when p is shorter).
func segmentAt(p string, i int) string {
	p = strings.TrimPrefix(p, "/")
	for ; i > 0; i-- {
		j := strings.IndexByte(p, '/')
		if j < 0 {
			return ""
		}
		p = p[j+1:]
	}
	if j := strings.IndexByte(p, '/'); j >= 0 {
		return p[:j]
	}
	return p
}

// cleanPath is path.Clean for request paths; it allocates only for unclean paths.
func cleanPath(p string) string {
	if p == "" {
		return "/"
	}
	if p[0] != '/' {
		p = "/" + p
	}
	return path.Clean(p)
}

// requestHost is the request's host without port or trailing dot, in lower case.
func requestHost(r *http.Request) string {
	h := r.Host
	if h == "" && r.URL != nil {
		h = r.URL.Host
	}
	if strings.HasPrefix(h, "[") {
		if i := strings.IndexByte(h, ']'); i > 0 {
			h = h[1:i]
		}
	} else if i := strings.LastIndexByte(h, ':'); i >= 0 && strings.IndexByte(h, ':') == i {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}

type compiledHeader struct {
	HeaderMatch
	host bool
}

// accepts reports whether r meets the route's method, host and header conditions.
func (rt *Route) accepts(r *http.Request, host string) bool {
	if len(rt.methods) > 0 && !slices.Contains(rt.methods, r.Method) {
		return false
	}
	if rt.host != "" && !hostMatch(rt.host, host) {
		return false
	}
	for i := range rt.headers {
		h := &rt.headers[i]
		var v string
		var present bool
		if h.host {
			v, present = r.Host, r.Host != ""
		} else if vs := r.Header[h.Name]; len(vs) > 0 {
			v, present = vs[0], true
		}
		if h.Present != nil {
			if present != *h.Present {
				return false
			}
			continue
		}
		if !present || v != h.Value {
			return false
		}
	}
	return true
}

func hostMatch(pattern, host string) bool {
	if suffix, ok := strings.CutPrefix(pattern, "*"); ok {
		return len(host) > len(suffix) && strings.HasSuffix(host, suffix)
	}
	return pattern == host
}

// routeTable finds a request's route without trying every route.
type routeTable struct {
	exact   map[string][]*Route
	prefix  map[string][]*Route
	pattern *patNode
	rest    []*Route
}

// patNode is one segment position of the path patterns.
type patNode struct {
	lit    map[string]*patNode
	param  *patNode
	routes []*Route
}

func buildTable(routes []*Route) routeTable {
	t := routeTable{exact: map[string][]*Route{}, prefix: map[string][]*Route{}}
	for _, rt := range routes {
		m := &rt.Match
		switch {
		case m.Path != "":
			t.exact[m.Path] = append(t.exact[m.Path], rt)
		case m.PathPrefix != "":
			t.prefix[m.PathPrefix] = append(t.prefix[m.PathPrefix], rt)
		case m.PathPattern != "":
			if t.pattern == nil {
				t.pattern = &patNode{}
			}
			n := t.pattern
			for _, seg := range segments(m.PathPattern) {
				if strings.HasPrefix(seg, "{") {
					if n.param == nil {
						n.param = &patNode{}
					}
					n = n.param
					continue
				}
				if n.lit == nil {
					n.lit = map[string]*patNode{}
				}
				if n.lit[seg] == nil {
					n.lit[seg] = &patNode{}
				}
				n = n.lit[seg]
			}
			n.routes = append(n.routes, rt)
		default:
			t.rest = append(t.rest, rt)
		}
	}
	return t
}

func firstAccepting(rs []*Route, r *http.Request, host string) *Route {
	for _, rt := range rs {
		if rt.accepts(r, host) {
			return rt
		}
	}
	return nil
}

func (t *routeTable) find(r *http.Request, p, host string) *Route {
	if rt := firstAccepting(t.exact[p], r, host); rt != nil {
		return rt
	}
	if t.pattern != nil {
		if rt := t.pattern.find(p, r, host); rt != nil {
			return rt
		}
	}
	if len(t.prefix) > 0 {
		for q := p; ; {
			if rt := firstAccepting(t.prefix[q], r, host); rt != nil {
				return rt
			}
			if q == "/" {
				break
			}
			q = q[:max(strings.LastIndexByte(q, '/'), 1)]
		}
	}
	return firstAccepting(t.rest, r, host)
}

// find matches rest (a clean path, or what is left of it) literal-first.
func (n *patNode) find(rest string, r *http.Request, host string) *Route {
	if rest == "" || rest == "/" {
		return firstAccepting(n.routes, r, host)
	}
	seg, tail := rest[1:], ""
	if i := strings.IndexByte(seg, '/'); i >= 0 {
		seg, tail = seg[:i], seg[i:]
	}
	if c := n.lit[seg]; c != nil {
		if rt := c.find(tail, r, host); rt != nil {
			return rt
		}
	}
	if n.param != nil && seg != "" {
		return n.param.find(tail, r, host)
	}
	return nil
}

// WriteScope writes to w what tells the caller of r apart for idempotency keys, beside
// its address: for each of the route's IdempotencyScope sources, its name and the
// request's values (every value of a header), each length-prefixed so that different
// inputs never write the same bytes. The values are credentials: callers hash them.
func (rt *Route) WriteScope(w io.Writer, r *http.Request, clientIP netip.Addr) {
	var (
		p, host = cleanPath(r.URL.Path), requestHost(r)
		t       ipText
		n       [8]byte
	)
	t.set(clientIP)
	scope := rt.scope
	if len(scope) != len(rt.IdempotencyScope) { // a Route not made by Load
		scope = compileDesc(0, rt.IdempotencyScope, rt.params).entries
	}
	field := func(s string) {
		binary.BigEndian.PutUint64(n[:], uint64(len(s)))
		_, _ = w.Write(n[:])
		_, _ = io.WriteString(w, s)
	}
	for i, e := range rt.IdempotencyScope {
		field(e.source())
		ce := &scope[i]
		if ce.kind == FromHeader {
			vs := r.Header[ce.name]
			field(strconv.Itoa(len(vs)))
			for _, s := range vs {
				field(s)
			}
			continue
		}
		var v val
		switch {
		case !ce.get(r, &t, p, host, &v):
			field("-")
		case v.ip:
			field("+" + string(t.b[:t.n]))
		default:
			field("+" + v.s)
		}
	}
}

// Lane returns what places an order that rt defers into q in q's lanes: the value of
// the route's priority source and of the queue's fair_by source ("" for a source the
// route or queue does not have, or that has no value and no default). q may be nil.
func (rt *Route) Lane(r *http.Request, clientIP netip.Addr, q *Queue) (priority, tenant string) {
	if rt != nil && len(rt.priority) == 1 {
		priority = sourceValue(&rt.priority[0], r, clientIP)
	}
	if q != nil && len(q.fairBy) == 1 {
		tenant = sourceValue(&q.fairBy[0], r, clientIP)
	}
	return priority, tenant
}

// FlowKey returns the value of q's flow_by source in r: the key whose own outflow
// the order waits for (see queueconfig.FlowBy). It is "" when the request has none,
// and for a queue without flow_by; q may be nil.
func (q *Queue) FlowKey(r *http.Request, clientIP netip.Addr) string {
	if q == nil || len(q.flowBy) != 1 {
		return ""
	}
	return sourceValue(&q.flowBy[0], r, clientIP)
}

// sourceValue reads one source's value from r ("" when it has none).
func sourceValue(e *compiledEntry, r *http.Request, clientIP netip.Addr) string {
	var (
		t ipText
		v val
	)
	t.set(clientIP)
	if !e.get(r, &t, cleanPath(r.URL.Path), requestHost(r), &v) {
		return ""
	}
	if v.ip {
		return string(t.b[:t.n])
	}
	return v.s
}
