package rules

import (
	"encoding/binary"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// compiledDesc is a route's descriptor list, ready for requests.
type compiledDesc struct {
	index   int
	entries []compiledEntry
	// static lists are made of constants only: their check is computed once.
	static      bool
	staticCheck Check
	staticOK    bool
	// Of the others, the walk down the domain's tree starts at entry skip, on node
	// from (nil: the list reaches no rule), past the leading constants (see
	// domain.constantStart).
	from *node
	skip int
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
