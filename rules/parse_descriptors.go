package rules

import (
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
)

func (w *walker) descriptors(n *yaml.Node, depth int) []*descDef {
	items := w.items(n, "descriptors")
	if len(items) > 0 && depth > maxDepth {
		w.errf(n, "descriptors nested more than %d levels deep", maxDepth)
		return nil
	}
	var out []*descDef
	for _, dn := range items {
		if dn = w.resolve(dn); dn != nil {
			out = append(out, w.descriptor(dn, depth))
		}
	}
	return out
}

func (w *walker) descriptor(n *yaml.Node, depth int) *descDef {
	d := &descDef{node: n}
	w.fields(n, "a descriptor", descFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "key":
			field(v, "key", w.str, &d.key, &d.keyNode)
		case "value":
			field(v, "value", w.str, &d.value, &d.valueNode)
		case "rate_limit":
			if !isNull(v) {
				d.rateLimit = w.limit(v, "rate_limit", envoyFields, d)
			}
		case "rate_limits":
			d.rlsNode = v
			for _, ln := range w.items(v, "rate_limits") {
				if ln = w.resolve(ln); ln != nil {
					d.rateLimits = append(d.rateLimits, w.limit(ln, "an entry of rate_limits", limitFields, nil))
				}
			}
			if len(d.rateLimits) == 0 && !isNull(v) {
				w.errf(v, "rate_limits must list at least one limit")
			}
		case "descriptors":
			d.children = w.descriptors(v, depth+1)
		case "shadow_mode":
			field(v, "shadow_mode", w.boolean, &d.shadow, nil)
		case "detailed_metric":
			field(v, "detailed_metric", w.boolean, &d.detailed, nil)
		case "value_to_metric":
			// Envoy: the request's value goes into the stat name. sluice's metric labels
			// are rule names, never request values, so it only needs to be a boolean.
			_, _ = w.boolean(v, "value_to_metric")
		case "share_threshold":
			field(v, "share_threshold", w.boolean, &d.share, &d.shareNode)
		case "metadata":
			d.metadata = w.metadata(v)
		case "quota_mode":
			field(v, "quota_mode", w.boolean, &d.quota, nil)
		case "name":
			d.name = w.nameRef(v, "name", d.name)
			d.sideName = k
		case "replaces":
			d.replaces = append(d.replaces, w.replaces(v)...)
			d.sideReplaces = k
		case "on_limit":
			d.extensions = append(d.extensions, k)
			d.onLimitN = v
			if ol, ok := oneOf(w, v, "on_limit", "reject, defer or wait", Reject, Defer, Wait); ok {
				d.onLimit = ol
			}
		case "max_wait":
			d.extensions = append(d.extensions, k)
			field(v, "max_wait", w.duration, &d.maxWait, &d.maxWaitN)
		case "max_waiting":
			d.extensions = append(d.extensions, k)
			d.maxWaitingN = v
			d.maxWaiting = w.positive(v, "max_waiting")
		case "then":
			d.extensions = append(d.extensions, k)
			d.thenN = v
			if then, ok := oneOf(w, v, "then", "defer or reject", Reject, Defer); ok {
				d.then = then
			}
		case "queue":
			d.extensions = append(d.extensions, k)
			field(v, "queue", w.str, &d.queue.name, &d.queue.node)
		default:
			d.extensions = append(d.extensions, k)
			w.limitOpt(&d.opts, key, v)
		}
	})
	if d.keyNode == nil {
		w.errf(n, "descriptor has no key")
	} else if d.key == "" {
		w.errf(d.keyNode, "descriptor key must not be empty")
	}
	return d
}

// nameRef reads a name, reporting a second one (in rate_limit and on the descriptor).
func (w *walker) nameRef(v *yaml.Node, what string, prev nameRef) nameRef {
	s, _ := w.str(v, what)
	if prev.node != nil {
		w.errf(v, "name given twice (also at line %d)", prev.node.Line)
	}
	if s == "" {
		w.errf(v, "%s must not be empty", what)
	}
	return nameRef{name: s, node: v}
}

func (w *walker) replaces(v *yaml.Node) []nameRef {
	var out []nameRef
	for _, rn := range w.items(v, "replaces") {
		if rn = w.resolve(rn); rn == nil {
			continue
		}
		var ref nameRef
		w.fields(rn, "an entry of replaces", []string{"name"}, func(_ string, _, v *yaml.Node) {
			field(v, "name", w.str, &ref.name, &ref.node)
		})
		if ref.name == "" {
			w.errf(rn, "replaces entry needs a name")
			continue
		}
		out = append(out, ref)
	}
	return out
}

// limit reads a rate limit. For Envoy's rate_limit, d receives its name and replaces.
func (w *walker) limit(n *yaml.Node, what string, known []string, d *descDef) *limitDef {
	l := &limitDef{node: n}
	w.fields(n, what, known, func(key string, k, v *yaml.Node) {
		switch key {
		case "unit":
			field(v, "unit", w.str, &l.unit, &l.unitNode)
		case "window":
			field(v, "window", w.duration, &l.window, &l.winNode)
		case "unit_multiplier":
			w.atLeast(v, "unit_multiplier", 1, &l.mult, &l.multNode)
		case "requests_per_unit":
			w.atLeast(v, "requests_per_unit", 0, &l.rpu, &l.rpuNode)
		case "unlimited":
			field(v, "unlimited", w.boolean, &l.unlimited, nil)
		case "name":
			d.name = w.nameRef(v, "name", d.name)
		case "replaces":
			d.replaces = append(d.replaces, w.replaces(v)...)
		default:
			w.limitOpt(&l.opts, key, v)
		}
	})
	return l
}

// oneOf reads the string field at v, which takes one of want (text lists them for
// the message): the value, or false once the problem is reported.
func oneOf[T ~string](w *walker, v *yaml.Node, field, text string, want ...T) (T, bool) {
	s, ok := w.str(v, field)
	if !ok {
		return "", false
	}
	if !slices.Contains(want, T(s)) {
		w.errf(v, "%s must be %s, got %q", field, text, s)
		return "", false
	}
	return T(s), true
}

func (w *walker) limitOpt(o *limitOpts, key string, v *yaml.Node) {
	switch key {
	case "algorithm":
		o.algNode = v
		if s, ok := w.str(v, "algorithm"); ok {
			o.algorithm = limiter.Algorithm(s)
			if !o.algorithm.Valid() {
				w.errf(v, "unknown algorithm %q (known: %s)", s, strings.Join(limiter.AlgorithmNames(), ", "))
			}
		}
	case "burst":
		w.atLeast(v, "burst", 1, &o.burst, &o.burstNode)
	case "failure_mode":
		o.failureNode = v
		if fm, ok := oneOf(w, v, "failure_mode", "local, open or closed", limiter.FailLocal, limiter.FailOpen, limiter.FailClosed); ok {
			o.failure = fm
		}
	case "forgive_rejected":
		field(v, "forgive_rejected", w.boolean, &o.forgive, &o.forgiveNode)
	}
}
