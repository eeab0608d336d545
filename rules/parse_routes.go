package rules

import (
	"go.yaml.in/yaml/v3"
)

func (w *walker) route(n *yaml.Node) *routeDef {
	r := &routeDef{node: n}
	w.fields(n, "a route", routeFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "name":
			field(v, "route name", w.str, &r.name, &r.nameNode)
		case "match":
			if !isNull(v) {
				w.match(r, v)
			}
		case "descriptors":
			for _, ln := range w.items(v, "route descriptors") {
				if ln = w.resolve(ln); ln == nil {
					continue
				}
				if ln.Kind != yaml.SequenceNode {
					w.errf(ln, "each route descriptor must be a list of entries like [{key: route, value: orders}, {key: user, from: \"header:X-User-ID\"}], got %s", kindName(ln))
					continue
				}
				var list []entryDef
				for _, en := range ln.Content {
					if en = w.resolve(en); en != nil {
						list = append(list, w.entry(en))
					}
				}
				r.descs = append(r.descs, list)
				r.descNodes = append(r.descNodes, ln)
			}
		case "idempotency_scope":
			r.scopeNode = v
			r.scope = w.names(v, key)
		case "priority":
			if v.Kind != yaml.MappingNode {
				w.errf(v, "priority must be like {value: high} or {from: \"header:X-Priority\", default: normal}, got %s", kindName(v))
				return
			}
			e := w.entry(v)
			e.key = "priority"
			r.priority = &e
		}
	})
	return r
}

func (w *walker) match(r *routeDef, n *yaml.Node) {
	w.fields(n, "match", matchFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "method":
			r.methodNode = v
			if v.Kind == yaml.ScalarNode {
				s, _ := w.str(v, "method")
				r.methods = append(r.methods, s)
				return
			}
			for _, mn := range w.items(v, "method") {
				if mn = w.resolve(mn); mn != nil {
					s, _ := w.str(mn, "method")
					r.methods = append(r.methods, s)
				}
			}
		case "host":
			field(v, "host", w.str, &r.host, &r.hostNode)
		case "path":
			field(v, "path", w.str, &r.path, &r.pathNode)
		case "path_prefix":
			field(v, "path_prefix", w.str, &r.prefix, &r.prefixNode)
		case "path_pattern":
			field(v, "path_pattern", w.str, &r.pattern, &r.patternNode)
		case "headers":
			for _, hn := range w.items(v, "headers") {
				if hn = w.resolve(hn); hn == nil {
					continue
				}
				h := headerDef{node: hn}
				w.fields(hn, "a header match", headerFields, func(key string, k, v *yaml.Node) {
					switch key {
					case "name":
						field(v, "header name", w.str, &h.name, nil)
					case "value":
						h.hasVal = field(v, "header value", w.str, &h.value, nil)
					case "present":
						if b, ok := w.boolean(v, "present"); ok {
							h.present = &b
						}
					}
				})
				r.headers = append(r.headers, h)
			}
		}
	})
}

func (w *walker) entry(n *yaml.Node) entryDef {
	e := entryDef{node: n}
	w.fields(n, "a descriptor entry", entryFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "key":
			field(v, "key", w.str, &e.key, nil)
		case "value":
			e.hasVal = field(v, "value", w.str, &e.value, nil)
		case "from":
			field(v, "from", w.str, &e.from, &e.fromN)
		case "default":
			e.hasDef = field(v, "default", w.str, &e.def, &e.defNode)
		}
	})
	return e
}
