package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
)

// domain is one domain's descriptor tree: one file's, or several merged.
type domain struct {
	name string
	file string // the first file that defines it
	root *node
	// byName finds the rules that `replaces` can name.
	byName map[string][]*Rule
	// dynamicKeys are the keys some route fills from the request.
	dynamicKeys map[string]bool
	nodes       int
}

// node is one descriptor.
type node struct {
	rule *Rule
	kids map[string]*group // by key
	// share is Envoy's share_threshold on a wildcard descriptor: every value it
	// matches counts on one counter (the value does not select the counter).
	share bool
}

// group is every descriptor of one key at one level: the most specific match wins.
type group struct {
	exact map[string]*node
	wild  []wildNode // values with a *, in file order
	any   *node      // the descriptor without a value

	wildSeen map[string]bool // while compiling: wildcard values already defined
}

// wildNode is a descriptor whose value has a *: each * stands for any run of
// characters, none included. A value whose only * ends it is a prefix (Envoy's first
// wildcards); any other is split at its stars into parts.
type wildNode struct {
	prefix string
	parts  []string // nil for a prefix
	n      *node
}

// matches reports whether s fits the pattern. Each part after the first is found at its
// leftmost place after the previous one: for * alone that is always a match when one
// exists, so the work is linear in s per part, whatever the request sends.
func (w wildNode) matches(s string) bool {
	if w.parts == nil {
		return strings.HasPrefix(s, w.prefix)
	}
	first, last := w.parts[0], w.parts[len(w.parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	s = s[len(first) : len(s)-len(last)]
	for _, p := range w.parts[1 : len(w.parts)-1] {
		i := strings.Index(s, p)
		if i < 0 {
			return false
		}
		s = s[i+len(p):]
	}
	return true
}

// newWildNode compiles a value with at least one *.
func newWildNode(value string, n *node) wildNode {
	if strings.IndexByte(value, '*') == len(value)-1 {
		return wildNode{prefix: value[:len(value)-1], n: n}
	}
	return wildNode{parts: strings.Split(value, "*"), n: n}
}

// level is one step of a descriptor path, for names and rule ids.
type level struct {
	key, value string // value as written, stars included
	wild       bool
}

// hashed is what of lv goes into rule ids, with its kind: the value (=), nothing (?),
// a prefix (*: the value without its only, final star, so the rules of the first
// wildcards keep their keys) or a pattern (%: the value, stars included).
func (lv level) hashed() (string, string) {
	switch {
	case lv.value == "":
		return "", "?"
	case !lv.wild:
		return lv.value, "="
	case strings.IndexByte(lv.value, '*') == len(lv.value)-1:
		return lv.value[:len(lv.value)-1], "*"
	}
	return lv.value, "%"
}

func (c *compiler) descriptors(fd *fileDef, d *domain, parent *node, defs []*descDef, path []level) {
	for _, dd := range defs {
		if dd.key == "" {
			continue
		}
		if parent.kids == nil {
			parent.kids = map[string]*group{}
		}
		g := parent.kids[dd.key]
		if g == nil {
			g = &group{}
			parent.kids[dd.key] = g
		}
		n := &node{}
		lv := level{key: dd.key, value: dd.value}
		at := dd.keyNode
		switch {
		case dd.value == "":
			if g.any != nil {
				c.errf(fd.path, at, "duplicate descriptor: key %q without value is already defined at this level", dd.key)
				continue
			}
			g.any = n
		case strings.Contains(dd.value, "*"):
			lv.wild = true
			if g.wildSeen[dd.value] {
				c.errf(fd.path, at, "duplicate descriptor: key %q with value %q is already defined at this level", dd.key, dd.value)
				continue
			}
			if g.wildSeen == nil {
				g.wildSeen = map[string]bool{}
			}
			g.wildSeen[dd.value] = true
			g.wild = append(g.wild, newWildNode(dd.value, n))
			n.share = dd.share
		default:
			if g.exact == nil {
				g.exact = map[string]*node{}
			}
			if _, dup := g.exact[dd.value]; dup {
				c.errf(fd.path, at, "duplicate descriptor: key %q with value %q is already defined at this level", dd.key, dd.value)
				continue
			}
			g.exact[dd.value] = n
			// Client addresses arrive in canonical form; let 0010.0.0.1-free spellings
			// such as ::ffff:10.0.0.1 match them too.
			if a, err := netip.ParseAddr(dd.value); err == nil {
				if canon := a.Unmap().WithZone("").String(); canon != dd.value {
					if _, taken := g.exact[canon]; !taken {
						g.exact[canon] = n
					}
				}
			}
		}
		if dd.share && !lv.wild {
			c.errf(fd.path, dd.shareNode, "share_threshold applies only to a value with a wildcard (*), whose matching values then share one counter; this descriptor has none")
		}
		d.nodes++
		p := append(slices.Clip(path), lv)
		n.rule = c.rule(fd, d, dd, p)
		c.descriptors(fd, d, n, dd.children, p)
	}
}

// rule compiles a descriptor's rate settings; nil when it has none.
func (c *compiler) rule(fd *fileDef, d *domain, dd *descDef, path []level) *Rule {
	file := fd.path
	if !c.ruleShape(file, dd) {
		return nil
	}
	r := &Rule{
		Domain:         d.name,
		Descriptor:     describe(path),
		OnLimit:        Reject,
		Shadow:         dd.shadow,
		Quota:          dd.quota,
		DetailedMetric: dd.detailed,
		Metadata:       dd.metadata,
		File:           file,
		Line:           dd.node.Line,
		envoyName:      dd.name.name,
	}
	for _, ref := range dd.replaces {
		r.Replaces = append(r.Replaces, ref.name)
	}
	c.ruleLimits(file, dd, r)
	c.ruleOnLimit(file, dd, r)
	r.Name = c.ruleName(d, dd, path)
	r.prefixes, r.offsets = keyPrefixes(d.name, path, r.Limits)
	r.staticKeys = strings.Join(r.prefixes, "")
	if dd.name.name != "" {
		d.byName[dd.name.name] = append(d.byName[dd.name.name], r)
	}
	c.set.rules = append(c.set.rules, r)
	return r
}

// ruleShape checks that a descriptor has one of rate_limit and rate_limits, and
// nothing that only they give a meaning to when it has neither; false: it makes no
// rule.
func (c *compiler) ruleShape(file string, dd *descDef) bool {
	if dd.rateLimit != nil && dd.rateLimits != nil {
		c.errf(file, dd.rlsNode, "use either rate_limit or rate_limits, not both")
		return false
	}
	if dd.rateLimit == nil && dd.rateLimits == nil {
		for _, ext := range dd.extensions {
			c.errf(file, ext, "%s has no effect on a descriptor without rate_limit", ext.Value)
		}
		if dd.name.node != nil {
			c.errf(file, dd.name.node, "name has no effect on a descriptor without rate_limit")
		}
		if len(dd.replaces) > 0 {
			c.errf(file, dd.replaces[0].node, "replaces has no effect on a descriptor without rate_limit")
		}
		return false
	}
	// Envoy reads name and replaces only inside rate_limit: beside it they are ignored
	// there, so a descriptor Envoy would load must not give them a meaning here.
	// Beside rate_limits or sluice's fields, which Envoy refuses, they are sluice's.
	if dd.rateLimits == nil && len(dd.extensions) == 0 {
		for _, side := range []*yaml.Node{dd.sideName, dd.sideReplaces} {
			if side != nil {
				c.errf(file, side, "%s beside rate_limit: Envoy's rate limit service reads it only inside rate_limit and ignores it here, so this file would limit differently there; move it into rate_limit", side.Value)
			}
		}
	}
	return true
}

// ruleLimits compiles the limits of the descriptor into r (at most 8, no two alike),
// or marks it unlimited or deny-all, and checks the options that apply only to some
// algorithms.
func (c *compiler) ruleLimits(file string, dd *descDef, r *Rule) {
	var defs []*limitDef
	if rl := dd.rateLimit; rl != nil {
		switch {
		case rl.unlimited:
			if rl.unitNode != nil || rl.winNode != nil {
				c.errf(file, rl.node, "an unlimited rate_limit must not have a unit or window")
			}
			r.Unlimited = true
			r.Quota = false // nothing to count: Envoy leaves it out of the quota-mode set
		case rl.rpuNode != nil && rl.rpu == 0 && !hasExtensions(dd, rl):
			// Envoy's block-list idiom: requests_per_unit 0 lets nothing through.
			c.period(file, rl)
			r.Deny = true
		default:
			defs = []*limitDef{rl}
		}
	} else {
		defs = dd.rateLimits
	}
	if len(defs) > 8 {
		c.errf(file, dd.rlsNode, "at most 8 limits per descriptor, got %d", len(defs))
		defs = defs[:8]
	}
	var usedBurst, usedForgive bool
	tags := map[string]*yaml.Node{}
	for _, ld := range defs {
		l, ok := c.limit(file, dd, ld)
		if !ok {
			continue
		}
		bucket := l.Algorithm == limiter.TokenBucket || l.Algorithm == limiter.LeakyBucket
		if ld.opts.burstNode != nil && !bucket {
			c.errf(file, ld.opts.burstNode, "burst applies only to token_bucket and leaky_bucket, not %s", l.Algorithm)
		}
		if ld.opts.forgiveNode != nil && l.Algorithm != limiter.SlidingWindowLog {
			c.errf(file, ld.opts.forgiveNode, "forgive_rejected applies only to sliding_window_log")
		}
		usedBurst = usedBurst || bucket
		usedForgive = usedForgive || l.Algorithm == limiter.SlidingWindowLog
		tag := limitTag(l)
		if prev, dup := tags[tag]; dup {
			c.errf(file, ld.node, "two limits with the same algorithm and window (also at line %d): keep the stricter one", prev.Line)
			continue
		}
		tags[tag] = ld.node
		r.Limits = append(r.Limits, l)
	}
	if dd.opts.burstNode != nil && !usedBurst && !r.Unlimited && !r.Deny {
		c.errf(file, dd.opts.burstNode, "burst applies only to token_bucket and leaky_bucket limits")
	}
	if dd.opts.forgiveNode != nil && !usedForgive && !r.Unlimited && !r.Deny {
		c.errf(file, dd.opts.forgiveNode, "forgive_rejected applies only to sliding_window_log limits")
	}
	if r.Unlimited {
		for _, ext := range dd.extensions {
			c.errf(file, ext, "%s has no effect on an unlimited descriptor", ext.Value)
		}
	}
}

// ruleOnLimit checks what the rule does at its limit: wait, defer (its queue) or
// reject.
func (c *compiler) ruleOnLimit(file string, dd *descDef, r *Rule) {
	parks := dd.onLimit == Defer || dd.onLimit == Wait && dd.then == Defer
	if dd.onLimit == Wait {
		c.waitRule(file, dd, r)
	} else {
		for _, k := range dd.extensions {
			if (k.Value == "max_wait" || k.Value == "max_waiting" || k.Value == "then") && !r.Unlimited {
				c.errf(file, k, "%s is used only with on_limit: wait", k.Value)
			}
		}
	}
	switch {
	case parks:
		if dd.onLimit == Defer {
			r.OnLimit = Defer
		}
		switch q := c.queues[dd.queue.name]; {
		case dd.queue.node == nil && dd.onLimit == Wait:
			c.errf(file, dd.thenN, "then: defer needs a queue")
		case dd.queue.node == nil:
			c.errf(file, dd.onLimitN, "on_limit: defer needs a queue")
		case dd.queue.name == "":
			c.errf(file, dd.queue.node, "queue must not be empty")
		case q == nil:
			c.errf(file, dd.queue.node, "unknown queue %q%s", dd.queue.name, c.knownQueues())
		default:
			r.Queue = q
		}
	default:
		if dd.queue.node != nil && !r.Unlimited {
			c.errf(file, dd.queue.node, "queue is used only with on_limit: defer (or wait with then: defer)")
		}
	}
}

// replaces checks that every replaces entry names a rule of the domain.
func (c *compiler) replaces(fd *fileDef, d *domain) {
	var check func(defs []*descDef)
	check = func(defs []*descDef) {
		for _, dd := range defs {
			for _, ref := range dd.replaces {
				switch {
				case ref.name == dd.name.name:
					c.errf(fd.path, ref.node, "a descriptor cannot replace itself (%q)", ref.name)
				case len(d.byName[ref.name]) == 0:
					c.errf(fd.path, ref.node, "replaces %q, but no descriptor of domain %q has that name", ref.name, d.name)
				}
			}
			check(dd.children)
		}
	}
	check(fd.descriptors)
}

func describe(path []level) string {
	var b strings.Builder
	for i, lv := range path {
		if i > 0 {
			b.WriteByte('/')
		}
		b.WriteString(lv.key)
		if lv.value != "" {
			b.WriteByte('=')
			b.WriteString(lv.value)
		}
	}
	return b.String()
}

const maxNameLen = 128

// ruleName gives a rule its log and metric name (see Rule.Name).
func (c *compiler) ruleName(d *domain, dd *descDef, path []level) string {
	if dd.name.name != "" {
		return capName(safeName(dd.name.name))
	}
	var b strings.Builder
	b.WriteString(safeName(d.name))
	for _, lv := range path {
		b.WriteByte('.')
		b.WriteString(safeName(lv.key))
		if lv.value == "" {
			continue
		}
		b.WriteByte('_')
		v, _ := lv.hashed()
		if showValue(d, v, lv.key) {
			b.WriteString(v)
		} else {
			sum := sha256.Sum256([]byte(v))
			b.WriteString("h" + hex.EncodeToString(sum[:4]))
		}
		if lv.wild {
			b.WriteByte('*')
		}
	}
	return capName(b.String())
}

// showValue decides whether a value written in the file may appear in a rule name: not
// when routes fill its key from requests (it is then someone's API key, user or
// address), nor when it looks like an address, nor when it is long or unusual.
func showValue(d *domain, v, key string) bool {
	if d.dynamicKeys[key] || len(v) > 32 {
		return false
	}
	if strings.IndexFunc(v, func(r rune) bool { return unsafeRune(r) || r == ':' || r == '*' }) >= 0 {
		return false
	}
	if _, err := netip.ParseAddr(v); err == nil {
		return false
	}
	// An address prefix written as a wildcard value: 10.1.* is 10.1. here.
	digits := strings.Count(v, ".") >= 1 && strings.Trim(v, "0123456789.") == ""
	return !digits
}

func capName(s string) string {
	if len(s) <= maxNameLen {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	return s[:maxNameLen-17] + "~" + hex.EncodeToString(sum[:8])
}

// keyPrefixes builds each limit's key prefix `sl:DOMAIN:RULEHASH:LIMIT` and the
// offsets at which they start in a check's concatenated keys (without hashes).
func keyPrefixes(dom string, path []level, limits []limiter.Limit) ([]string, []int) {
	h := sha256.New()
	fmt.Fprintf(h, "%d:%s", len(dom), dom)
	for _, lv := range path {
		v, kind := lv.hashed()
		fmt.Fprintf(h, "|%d:%s%s%d:%s", len(lv.key), lv.key, kind, len(v), v)
	}
	id := hex.EncodeToString(h.Sum(nil)[:8])
	kd := strings.Map(func(r rune) rune {
		if unsafeRune(r) || r == ':' || r == '*' {
			return '_'
		}
		return r
	}, dom)
	if len(kd) > 32 {
		kd = kd[:32]
	}
	var prefixes []string
	var offsets []int
	off := 0
	for _, l := range limits {
		p := "sl:" + kd + ":" + id + ":" + limitTag(l)
		prefixes = append(prefixes, p)
		offsets = append(offsets, off)
		off += len(p)
	}
	return prefixes, offsets
}

// limitTag names a limit's algorithm and window inside keys: fw1m, tb1s, swl10m.
func limitTag(l limiter.Limit) string {
	code := map[limiter.Algorithm]string{
		limiter.TokenBucket: "tb", limiter.LeakyBucket: "lb", limiter.FixedWindow: "fw",
		limiter.SlidingWindowLog: "swl", limiter.SlidingWindowCounter: "swc",
	}[l.Algorithm]
	return code + limiter.FormatDuration(l.Period)
}

// waitRule sets the fields of an on_limit: wait rule r and reports what is wrong with
// them: a wait rule paces at one rate (one limit, no burst: its slots are even and
// max_wait bounds how many wait), needs a positive max_wait, and falls back to
// reject or to defer into its queue.
func (c *compiler) waitRule(file string, dd *descDef, r *Rule) {
	r.OnLimit, r.Then, r.MaxWait, r.MaxWaiting = Wait, Reject, dd.maxWait, DefaultMaxWaiting
	if dd.then != "" {
		r.Then = dd.then
	}
	if dd.maxWaiting > 0 {
		r.MaxWaiting = dd.maxWaiting
	}
	switch {
	case r.Unlimited || r.Deny:
		c.errf(file, dd.onLimitN, "on_limit: wait needs a rate_limit with a rate to pace at")
	case len(r.Limits) > 1:
		c.errf(file, dd.onLimitN, "on_limit: wait paces at one rate: give one limit, not %d", len(r.Limits))
	}
	switch {
	case dd.maxWaitN == nil:
		c.errf(file, dd.onLimitN, "on_limit: wait needs max_wait (the longest a request is held, like 2s)")
	case dd.maxWait > MaxWaitLimit:
		c.errf(file, dd.maxWaitN, "max_wait must be at most %s (a held request's body is read after the hold, within the front door's read timeout), got %s", MaxWaitLimit, dd.maxWait)
	}
	if dd.quota {
		c.errf(file, dd.onLimitN, "on_limit: wait with quota_mode: a quota denies only with the others, so it has no slot to wait for; use one or the other")
	}
	for _, l := range r.Limits {
		if l.Burst > 0 {
			c.errf(file, dd.onLimitN, "burst has no effect with on_limit: wait: the rule forwards one request per slot, evenly, and max_wait bounds how many wait")
			break
		}
	}
}
