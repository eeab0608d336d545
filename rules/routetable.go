package rules

import (
	"net/http"
	"path"
	"slices"
	"strings"
)

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
