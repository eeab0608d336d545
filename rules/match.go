package rules

import (
	"net/http"
	"net/netip"
	"slices"
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
	hosts       bool             // some route reads the request's host (Route.readsHost)
	clientAddrs bool             // some route's descriptor list reads the client's address
}

// ReadsClientAddr reports whether Match reads its clientIP: whether a descriptor list
// of some route takes the client's address. A caller for which finding the address
// costs something may pass the zero Addr otherwise.
func (s *Set) ReadsClientAddr() bool { return s.clientAddrs }

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
	p, host := cleanPath(r.URL.Path), ""
	if s.hosts { // otherwise no route reads it
		host = requestHost(r)
	}
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
	if rt.clientIP { // otherwise no list reads it
		t.set(clientIP)
	}
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

// readsHost reports whether rt's match or one of its descriptor lists reads the
// request's host.
func (rt *Route) readsHost() bool { return rt.host != "" || rt.reads(FromHost) }

// reads reports whether one of rt's descriptor lists takes a value from a source of
// kind k.
func (rt *Route) reads(k SourceKind) bool {
	for i := range rt.descs {
		if slices.ContainsFunc(rt.descs[i].entries, func(e compiledEntry) bool { return e.kind == k }) {
			return true
		}
	}
	return false
}

func (rt *Route) evalDynamic(cd *compiledDesc, r *http.Request, t *ipText, p, host string, vals *[maxDepth]val, hb *hashBuf) (Check, bool) {
	if cd.from == nil {
		return Check{}, false
	}
	entries := cd.entries[cd.skip:]
	for j := range entries {
		if !entries[j].get(r, t, p, host, &vals[j]) {
			return Check{}, false
		}
	}
	hb.n = 0
	rule, hashed := walkFrom(cd.from, cd.skip, vals[:len(entries)], t, hb)
	if rule == nil {
		return Check{}, false
	}
	return makeCheck(rule, cd.index, hashed, hb), true
}
