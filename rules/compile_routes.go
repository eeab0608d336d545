package rules

import (
	"fmt"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

var routeNameOK = func(s string) bool {
	return s != "" && len(s) <= 64 && strings.IndexFunc(s, unsafeRune) < 0
}

func (c *compiler) route(fd *fileDef, d *domain, rd *routeDef) *Route {
	rt := &Route{Name: rd.name, Domain: d.name, File: fd.path, Line: rd.node.Line, dom: d}
	k := &checker{c: c, file: fd.path, ok: true}
	c.routeName(k, rd)
	routeMethods(k, rd, rt)
	routeHost(k, rd, rt)
	routePath(k, rd, rt)
	routeHeaders(k, rd, rt)
	c.routeDescriptors(k, d, rd, rt)
	routeScope(k, rd, rt)
	if rd.priority != nil {
		if es, pok := c.entries(fd.path, rt, []entryDef{*rd.priority}, rd.priority.node); pok {
			rt.Priority = &es[0]
			rt.priority = compileDesc(0, es, rt.params).entries
		} else {
			k.ok = false
		}
	}
	if rd.nameNode != nil && c.routeNm[rd.name] == nil {
		c.routeNm[rd.name] = rt
	}
	if !k.ok {
		return nil
	}
	return rt
}

// checker reports the problems of one part of a file (a route, a descriptor list) and
// remembers whether there were any.
type checker struct {
	c    *compiler
	file string
	ok   bool // no problem yet
}

// bad reports a problem at n.
func (k *checker) bad(n *yaml.Node, format string, args ...any) {
	k.c.errf(k.file, n, format, args...)
	k.ok = false
}

// routeName checks the route's name: given, usable in metrics, and not taken.
func (c *compiler) routeName(k *checker, rd *routeDef) {
	switch {
	case rd.nameNode == nil:
		k.bad(rd.node, "route has no name")
	case !routeNameOK(rd.name):
		k.bad(rd.nameNode, "route name %q: use up to 64 letters, digits, _ . : or - (it appears in metrics)", rd.name)
	case c.routeNm[rd.name] != nil:
		prev := c.routeNm[rd.name]
		k.bad(rd.nameNode, "route %q is already defined at %s:%d", rd.name, prev.File, prev.Line)
	}
}

// routeMethods takes the methods the route matches, in upper case.
func routeMethods(k *checker, rd *routeDef, rt *Route) {
	for _, m := range rd.methods {
		if !isToken(m) {
			k.bad(rd.methodNode, "method %q is not an HTTP method", m)
			continue
		}
		rt.Match.Methods = append(rt.Match.Methods, strings.ToUpper(m))
	}
	rt.methods = rt.Match.Methods
}

// routeHost takes the host the route matches: lower case, without a trailing dot or
// an IPv6 address's brackets, and without a port.
func routeHost(k *checker, rd *routeDef, rt *Route) {
	if rd.hostNode == nil {
		return
	}
	h := strings.TrimSuffix(strings.ToLower(rd.host), ".")
	if inner, ok := strings.CutPrefix(h, "["); ok && strings.HasSuffix(inner, "]") {
		h = strings.TrimSuffix(inner, "]") // requests' hosts are compared without brackets
	}
	rt.Match.Host, rt.host = h, h
	name := strings.TrimPrefix(h, "*.")
	_, ipErr := netip.ParseAddr(name)
	switch {
	case name == "" || strings.ContainsAny(name, "*/[] \t"):
		k.bad(rd.hostNode, "host %q must be a host name, or *.domain for its subdomains", rd.host)
	case strings.Contains(name, ":") && ipErr != nil:
		k.bad(rd.hostNode, "host %q must not have a port: the port is ignored when matching", rd.host)
	}
}

// routePath takes the one path, path_prefix or path_pattern the route matches,
// cleaned, with the pattern's parameters.
func routePath(k *checker, rd *routeDef, rt *Route) {
	paths := 0
	for _, pn := range []*yaml.Node{rd.pathNode, rd.prefixNode, rd.patternNode} {
		if pn != nil {
			paths++
		}
	}
	if paths > 1 {
		k.bad(rd.node, "give at most one of path, path_prefix and path_pattern")
	}
	checkPath := func(n *yaml.Node, p string) (string, bool) {
		if !strings.HasPrefix(p, "/") {
			k.bad(n, "path %q must start with /", p)
			return "", false
		}
		return path.Clean(p), true
	}
	switch {
	case rd.pathNode != nil:
		rt.Match.Path, _ = checkPath(rd.pathNode, rd.path)
	case rd.prefixNode != nil:
		rt.Match.PathPrefix, _ = checkPath(rd.prefixNode, rd.prefix)
	case rd.patternNode != nil:
		if p, pok := checkPath(rd.patternNode, rd.pattern); pok {
			rt.Match.PathPattern = p
			params, err := patternParams(p)
			if err != nil {
				k.bad(rd.patternNode, "path_pattern %q: %v", rd.pattern, err)
			}
			rt.params = params
		}
	}
}

// routeHeaders takes the header matches of the route: each a value or a presence.
func routeHeaders(k *checker, rd *routeDef, rt *Route) {
	for _, hd := range rd.headers {
		switch {
		case !isToken(hd.name):
			k.bad(hd.node, "header match needs a valid header name, got %q", hd.name)
			continue
		case hd.hasVal && hd.present != nil:
			k.bad(hd.node, "header match: give value or present, not both")
		case !hd.hasVal && hd.present == nil:
			k.bad(hd.node, "header match needs value (equal to) or present (true or false)")
		}
		hm := HeaderMatch{Name: http.CanonicalHeaderKey(hd.name), Value: hd.value, Present: hd.present}
		rt.Match.Headers = append(rt.Match.Headers, hm)
		rt.headers = append(rt.headers, compiledHeader{HeaderMatch: hm, host: hm.Name == "Host"})
	}
}

// routeDescriptors compiles the route's descriptor lists (at least one, at most 64),
// each of which must reach a descriptor with a rate limit in domain d.
func (c *compiler) routeDescriptors(k *checker, d *domain, rd *routeDef, rt *Route) {
	if len(rd.descs) == 0 {
		k.bad(rd.node, "route has no descriptors: it would limit nothing")
	}
	if len(rd.descs) > 64 {
		k.bad(rd.descNodes[64], "at most 64 descriptor lists per route")
		rd.descs = rd.descs[:64]
	}
	for i, list := range rd.descs {
		at := rd.descNodes[i]
		entries, eok := c.entries(k.file, rt, list, at)
		if !eok {
			k.ok = false
			continue
		}
		rt.Descriptors = append(rt.Descriptors, entries)
		cd := compileDesc(len(rt.Descriptors)-1, entries, rt.params)
		if !d.reachable(entries, &c.reach) {
			k.bad(at, "descriptor list %s matches no descriptor with a rate limit in domain %q", formatEntries(entries), d.name)
			continue
		}
		if cd.static {
			cd.staticCheck, cd.staticOK = d.staticCheck(cd.constVals())
			cd.staticCheck.Descriptor = cd.index
		} else {
			cd.from, cd.skip = d.constantStart(cd.entries)
		}
		rt.descs = append(rt.descs, cd)
	}
	rt.allStatic = !slices.ContainsFunc(rt.descs, func(cd compiledDesc) bool { return !cd.static })
	rt.clientIP = rt.reads(FromClientIP)
}

// routeScope takes the route's idempotency_scope, DefaultIdempotencyScope when it
// has none.
func routeScope(k *checker, rd *routeDef, rt *Route) {
	rt.IdempotencyScope = DefaultIdempotencyScope
	if rd.scopeNode != nil {
		rt.IdempotencyScope = []RouteEntry{}
		for _, sn := range rd.scope {
			e := RouteEntry{Key: "idempotency_scope"}
			if err := parseFrom(&e, sn.name, rt); err != nil {
				k.bad(sn.node, "idempotency_scope %q: %v", sn.name, err)
				continue
			}
			rt.IdempotencyScope = append(rt.IdempotencyScope, e)
		}
		if len(rd.scope) > maxDepth {
			k.bad(rd.scopeNode, "idempotency_scope lists more than %d sources", maxDepth)
		}
	}
	rt.scope = compileDesc(0, rt.IdempotencyScope, rt.params).entries
}

func formatEntries(es []RouteEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func (c *compiler) entries(file string, rt *Route, list []entryDef, at *yaml.Node) ([]RouteEntry, bool) {
	k := &checker{c: c, file: file, ok: true}
	if len(list) == 0 {
		k.bad(at, "empty descriptor list")
	}
	if len(list) > maxDepth {
		k.bad(at, "descriptor list longer than %d entries", maxDepth)
	}
	var out []RouteEntry
	for _, ed := range list {
		e := RouteEntry{Key: ed.key}
		switch {
		case ed.key == "":
			k.bad(ed.node, "descriptor entry needs a key")
		case ed.hasVal && ed.fromN != nil:
			k.bad(ed.node, "descriptor entry %q: give value or from, not both", ed.key)
		case ed.hasVal:
			e.Value = ed.value
			if ed.value == "" {
				k.bad(ed.node, "descriptor entry %q: value must not be empty", ed.key)
			}
			if ed.hasDef {
				k.bad(ed.defNode, "default is used only with from")
			}
		case ed.fromN != nil:
			if err := parseFrom(&e, ed.from, rt); err != nil {
				k.bad(ed.fromN, "from %q: %v", ed.from, err)
			}
			if ed.hasDef {
				if ed.def == "" {
					k.bad(ed.defNode, "default must not be empty")
				}
				e.Value = ed.def
			}
		default:
			k.bad(ed.node, "descriptor entry %q needs a value or a from", ed.key)
		}
		out = append(out, e)
	}
	return out, k.ok
}

// parseFrom reads header:NAME, query:NAME, client_ip, path:{name}, method or host.
func parseFrom(e *RouteEntry, from string, rt *Route) error {
	kind, name, _ := strings.Cut(from, ":")
	switch kind {
	case "header":
		if !isToken(name) {
			return fmt.Errorf("header:NAME needs a valid header name")
		}
		e.From, e.Name = FromHeader, http.CanonicalHeaderKey(name)
		return nil
	case "query":
		if name == "" {
			return fmt.Errorf("query:NAME needs a parameter name")
		}
		e.From, e.Name = FromQuery, name
		return nil
	case "path":
		name = strings.TrimSuffix(strings.TrimPrefix(name, "{"), "}")
		if name == "" {
			return fmt.Errorf("path:{name} needs a parameter name")
		}
		if _, ok := rt.params[name]; !ok {
			if rt.Match.PathPattern == "" {
				return fmt.Errorf("the route has no path_pattern with {%s}", name)
			}
			return fmt.Errorf("path_pattern %q has no {%s}", rt.Match.PathPattern, name)
		}
		e.From, e.Name = FromPath, name
		return nil
	}
	if name == "" && strings.Count(from, ":") == 0 {
		switch from {
		case "client_ip":
			e.From = FromClientIP
			return nil
		case "method":
			e.From = FromMethod
			return nil
		case "host":
			e.From = FromHost
			return nil
		}
	}
	return fmt.Errorf("must be header:NAME, query:NAME, client_ip, path:{name}, method or host")
}

// patternParams parses a path pattern and maps each {name} to its segment index.
func patternParams(p string) (map[string]int, error) {
	params := map[string]int{}
	for i, seg := range segments(p) {
		open, close := strings.Contains(seg, "{"), strings.Contains(seg, "}")
		if !open && !close {
			continue
		}
		if !strings.HasPrefix(seg, "{") || !strings.HasSuffix(seg, "}") || strings.Count(seg, "{") != 1 || strings.Count(seg, "}") != 1 {
			return nil, fmt.Errorf("a parameter must be a whole segment like {id}, got %q", seg)
		}
		name := seg[1 : len(seg)-1]
		if name == "" || strings.IndexFunc(name, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_')
		}) >= 0 {
			return nil, fmt.Errorf("parameter name %q: use letters, digits and _", name)
		}
		if _, dup := params[name]; dup {
			return nil, fmt.Errorf("parameter {%s} appears twice", name)
		}
		params[name] = i
	}
	return params, nil
}

// segments splits a clean path into its segments; "/" has none.
func segments(p string) []string {
	p = strings.TrimPrefix(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

// isToken reports whether s is an HTTP token (RFC 9110): header names and methods.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// reachable reports whether some request could make entries match a descriptor with a
// rule, as Envoy matches: one level per entry, the rule on the last one.
func (d *domain) reachable(entries []RouteEntry, budget *int) bool {
	cur := []*node{d.root}
	for i, e := range entries {
		var next []*node
		for _, n := range cur {
			if *budget -= 1 + len(n.kids); *budget < 0 {
				return true // not checked: assume the best
			}
			g := n.kids[e.Key]
			if g == nil {
				continue
			}
			if e.From == FromConstant {
				v := val{key: e.Key, s: e.Value}
				if m, _ := g.lookup(&v); m != nil {
					next = append(next, m)
				}
				continue
			}
			*budget -= len(g.exact) + len(g.wild)
			for _, m := range g.exact {
				next = append(next, m)
			}
			for _, w := range g.wild {
				next = append(next, w.n)
			}
			if g.any != nil {
				next = append(next, g.any)
			}
		}
		if i == len(entries)-1 {
			return slices.ContainsFunc(next, func(n *node) bool { return n.rule != nil })
		}
		// Deduplicate: several routes into one node must not multiply the work.
		seen := map[*node]bool{}
		cur = cur[:0:0]
		for _, n := range next {
			if len(n.kids) > 0 && !seen[n] {
				seen[n] = true
				cur = append(cur, n)
			}
		}
	}
	return false
}
