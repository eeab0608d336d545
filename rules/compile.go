package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"path"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// File is the content of one rules file, for Parse.
type File struct {
	// Name is how problems refer to the file (its path, usually).
	Name string
	Data []byte
}

// Parse validates and compiles rules files given by content. Each file is one domain. It
// returns every problem at once as Problems (which match ErrInvalid), and no Set then.
func Parse(files ...File) (*Set, error) {
	return ParseWith(files)
}

// Option changes how files are loaded (Parse, Load and their With forms).
type Option func(*loadConfig)

type loadConfig struct {
	merge bool
}

// MergeDomains lets several files share a domain, as Envoy's service does with
// MERGE_DOMAIN_CONFIG: their descriptors join one tree (a descriptor repeated across
// the files is a problem, as within one file), their routes and `replaces` see each
// other. Without it a domain written in two files is a problem.
func MergeDomains() Option { return func(c *loadConfig) { c.merge = true } }

func newLoadConfig(opts []Option) loadConfig {
	var c loadConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// ParseWith is Parse with options.
func ParseWith(files []File, opts ...Option) (*Set, error) {
	if len(files) == 0 {
		return nil, ErrNoPaths
	}
	var probs problemList
	s := compile(files, &probs, newLoadConfig(opts))
	if err := probs.result(); err != nil {
		return nil, err
	}
	return s, nil
}

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

type compiler struct {
	// reach bounds the work of the reachability check over all routes: on a huge set it
	// stops checking rather than take quadratic time.
	reach   int
	probs   *problemList
	set     *Set
	queues  map[string]*Queue
	qNodes  map[string]*yaml.Node
	routeNm map[string]*Route
}

func (c *compiler) errf(file string, n *yaml.Node, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	c.probs.add(file, line, col, format, args...)
}

func compile(files []File, probs *problemList, cfg loadConfig) *Set {
	c := &compiler{
		reach:   4_000_000,
		probs:   probs,
		set:     &Set{domains: map[string]*domain{}, queues: map[string]*Queue{}},
		queues:  map[string]*Queue{},
		qNodes:  map[string]*yaml.Node{},
		routeNm: map[string]*Route{},
	}
	s := c.set
	h := sha256.New()
	var defs []*fileDef
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
		s.files = append(s.files, f.Name)
		if fd := parseFile(f.Name, f.Data, probs); fd != nil {
			defs = append(defs, fd)
		}
	}
	s.version = hex.EncodeToString(h.Sum(nil))
	// Queues first: descriptors refer to them from any file.
	for _, fd := range defs {
		for _, qd := range fd.queues {
			c.queue(fd, qd)
		}
	}
	// Domains next, each with the files that define it (several only when merging).
	var order []*domain
	members := map[*domain][]*fileDef{}
	of := map[*fileDef]*domain{}
	for _, fd := range defs {
		if fd.domain == "" {
			continue
		}
		d := s.domains[fd.domain]
		switch {
		case d != nil && !cfg.merge:
			c.errf(fd.path, fd.domainNode, "domain %q is already defined in %s (to merge files of one domain, as Envoy's MERGE_DOMAIN_CONFIG, use --merge-domains)", fd.domain, d.file)
			continue
		case d == nil:
			d = &domain{name: fd.domain, file: fd.path, root: &node{}, byName: map[string][]*Rule{}, dynamicKeys: map[string]bool{}}
			s.domains[d.name] = d
			s.domainNames = append(s.domainNames, d.name)
			order = append(order, d)
		}
		members[d] = append(members[d], fd)
		of[fd] = d
	}
	for _, d := range order {
		fds := members[d]
		// Rule names hide values that routes fill from requests, in any file of the domain.
		for _, fd := range fds {
			for _, rd := range fd.routes {
				for _, list := range rd.descs {
					for _, e := range list {
						if e.from != "" && !slices.Contains([]string{"method", "host"}, e.from) {
							d.dynamicKeys[e.key] = true
						}
					}
				}
			}
		}
		for _, fd := range fds {
			c.descriptors(fd, d, d.root, fd.descriptors, nil)
		}
		for _, fd := range fds {
			c.replaces(fd, d)
		}
	}
	// Routes last, in file order (their order breaks ties), once every tree is whole.
	for _, fd := range defs {
		d := of[fd]
		if d == nil {
			continue
		}
		for _, rd := range fd.routes {
			if rt := c.route(fd, d, rd); rt != nil {
				rt.order = len(s.routes)
				s.routes = append(s.routes, rt)
			}
		}
	}
	slices.Sort(s.domainNames)
	for name := range c.queues {
		s.queueNames = append(s.queueNames, name)
	}
	slices.Sort(s.queueNames)
	s.queues = c.queues
	s.table = buildTable(s.routes)
	return s
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
	if dd.rateLimit != nil && dd.rateLimits != nil {
		c.errf(file, dd.rlsNode, "use either rate_limit or rate_limits, not both")
		return nil
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
		return nil
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
	r := &Rule{
		Domain:         d.name,
		Descriptor:     describe(path),
		OnLimit:        Reject,
		Shadow:         dd.shadow,
		DetailedMetric: dd.detailed,
		Metadata:       dd.metadata,
		File:           file,
		Line:           dd.node.Line,
		envoyName:      dd.name.name,
	}
	for _, ref := range dd.replaces {
		r.Replaces = append(r.Replaces, ref.name)
	}
	var defs []*limitDef
	if rl := dd.rateLimit; rl != nil {
		switch {
		case rl.unlimited:
			if rl.unitNode != nil || rl.winNode != nil {
				c.errf(file, rl.node, "an unlimited rate_limit must not have a unit or window")
			}
			r.Unlimited = true
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
	switch dd.onLimit {
	case Defer:
		r.OnLimit = Defer
		switch q := c.queues[dd.queue.name]; {
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
			c.errf(file, dd.queue.node, "queue is used only with on_limit: defer")
		}
	}
	r.Name = c.ruleName(d, dd, path)
	r.prefixes, r.offsets = keyPrefixes(d.name, path, r.Limits)
	r.staticKeys = strings.Join(r.prefixes, "")
	if dd.name.name != "" {
		d.byName[dd.name.name] = append(d.byName[dd.name.name], r)
	}
	c.set.rules = append(c.set.rules, r)
	return r
}

func (c *compiler) knownQueues() string {
	if len(c.queues) == 0 {
		return " (no queues are defined)"
	}
	names := make([]string, 0, len(c.queues))
	for n := range c.queues {
		names = append(names, n)
	}
	slices.Sort(names)
	return " (known: " + strings.Join(names, ", ") + ")"
}

// hasExtensions reports whether a rate_limit or its descriptor uses sluice's fields:
// then requests_per_unit 0 is a mistake, not Envoy's block list.
func hasExtensions(dd *descDef, rl *limitDef) bool {
	o := rl.opts
	return rl.winNode != nil || o.algNode != nil || o.burstNode != nil || o.failureNode != nil ||
		o.forgiveNode != nil || len(dd.extensions) > 0
}

// period checks a limit's unit or window and returns its period.
func (c *compiler) period(file string, ld *limitDef) (period int64, ok bool) {
	switch {
	case ld.unitNode != nil && ld.winNode != nil:
		c.errf(file, ld.winNode, "give either unit or window, not both")
	case ld.multNode != nil && ld.unitNode == nil:
		c.errf(file, ld.multNode, "unit_multiplier goes with unit (a window is written whole: window: 5m)")
	case ld.unitNode != nil:
		d, known := limiter.UnitPeriod(ld.unit)
		if !known {
			c.errf(file, ld.unitNode, "unknown unit %q (known: second, minute, hour, day, week, month, year; or use window: 30s)", ld.unit)
			return 0, false
		}
		if ld.multNode != nil {
			if ld.mult < 1 {
				return 0, false // reported while parsing
			}
			if int64(d) > math.MaxInt64/ld.mult {
				c.errf(file, ld.multNode, "unit_multiplier %d makes the period too long", ld.mult)
				return 0, false
			}
			d *= time.Duration(ld.mult)
		}
		return int64(d), true
	case ld.winNode != nil:
		return int64(ld.window), ld.window > 0
	default:
		c.errf(file, ld.node, "rate limit needs a unit (second, minute, hour, day) or a window (like 30s)")
	}
	return 0, false
}

func (c *compiler) limit(file string, dd *descDef, ld *limitDef) (limiter.Limit, bool) {
	p, ok := c.period(file, ld)
	switch {
	case ld.rpuNode == nil:
		c.errf(file, ld.node, "rate limit needs requests_per_unit")
		ok = false
	case ld.rpu == 0:
		c.errf(file, ld.rpuNode, "requests_per_unit must be at least 1 (0, Envoy's block list, works only in a plain rate_limit without sluice fields)")
		ok = false
	case ld.rpu < 0:
		ok = false // reported while parsing
	}
	if !ok {
		return limiter.Limit{}, false
	}
	o := ld.opts
	l := limiter.Limit{
		Algorithm:       cmpOr(o.algorithm, dd.opts.algorithm, limiter.FixedWindow),
		Rate:            ld.rpu,
		Period:          time.Duration(p),
		Burst:           max(o.burst, 0),
		ForgiveRejected: o.forgive || (o.forgiveNode == nil && dd.opts.forgive),
		FailureMode:     cmpOr(o.failure, dd.opts.failure, limiter.FailLocal),
	}
	if o.burstNode == nil {
		l.Burst = max(dd.opts.burst, 0)
	}
	if !l.Algorithm.Valid() {
		return limiter.Limit{}, false // reported while parsing
	}
	if l.Algorithm != limiter.TokenBucket && l.Algorithm != limiter.LeakyBucket {
		l.Burst = 0
	}
	if err := l.Validate(); err != nil {
		c.errf(file, ld.node, "%v", err)
		return limiter.Limit{}, false
	}
	return l, true
}

func cmpOr[T comparable](vals ...T) T {
	var zero T
	for _, v := range vals {
		if v != zero {
			return v
		}
	}
	return zero
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

func (c *compiler) queue(fd *fileDef, qd *queueDef) {
	file := fd.path
	if !queueconfig.ValidName(qd.name) {
		c.errf(file, qd.nameNode, "queue name %q: use 1 to 64 letters, digits, _ or - (it names a JetStream stream and NATS subjects)", qd.name)
		return
	}
	if prev := c.qNodes[qd.name]; prev != nil {
		c.errf(file, qd.nameNode, "queue %q is already defined in %s", qd.name, c.queues[qd.name].File)
		return
	}
	// Unset fields take the queue package's defaults (max_bytes and max_age: none).
	q := &Queue{
		Config: queueconfig.Config{
			Name:               qd.name,
			Outflow:            qd.outflow,
			MaxDepth:           qd.maxDepth,
			MaxBytes:           qd.maxBytes,
			MaxAge:             qd.maxAge,
			MaxAttempts:        int(min(qd.maxAttempts, 1_000_000)),
			MaxInFlight:        int(min(qd.maxInFlight, 1_000_000)),
			Backoff:            queueconfig.Backoff{Initial: qd.backoff.Initial, Max: qd.backoff.Max},
			Downstream:         qd.downstream,
			MaxIdempotencyKeys: int(min(qd.maxIdemKeys, queueconfig.MaxIdempotencyKeysLimit+1)),
			MaxBody:            qd.maxBody,
			DropHeaders:        qd.dropHeaders,
			// 0 (unset or unreadable) takes the default.
			DeadLetterMaxAge: qd.deadMaxAge,
			Delivery:         qd.delivery,
		}.WithDefaults(),
		Domain: fd.domain,
		File:   file,
		Line:   qd.nameNode.Line,
	}
	// Fields already reported while reading them (missing, of the wrong type or form)
	// are not reported again by the queue package's validator.
	reported := map[string]bool{"name": true} // checked above, with the file's words
	switch {
	case qd.outflowNode == nil:
		c.errf(file, qd.nameNode, "queue %q needs an outflow (like outflow: {rate: 50/s})", qd.name)
		reported["outflow"] = true
	case !qd.hasOutflow:
		reported["outflow"] = true
	default:
		if err := (limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: q.Outflow.Count, Period: q.Outflow.Period}).Validate(); err != nil {
			c.errf(file, qd.outflowNode, "outflow: %v", err)
			reported["outflow"] = true
		}
	}
	if qd.downNode == nil {
		c.errf(file, qd.nameNode, "queue %q needs a downstream (an http:// or https:// URL, or nats:SUBJECT)", qd.name)
	}
	reported["downstream"] = !qd.hasDown
	for _, h := range qd.resultHdrs {
		q.ResultHeaders = append(q.ResultHeaders, http.CanonicalHeaderKey(h.name))
	}
	// The queue package's validator decides what a valid queue is (what rules check,
	// a reload and the start accept is what the queue package declares); the problems
	// are reported here with their position.
	var invalid interface{ Unwrap() []error }
	if err := q.Config.Validate(); errors.As(err, &invalid) {
		for _, e := range invalid.Unwrap() {
			var ce *queueconfig.ConfigError
			if !errors.As(e, &ce) || reported[ce.Field] {
				continue
			}
			n := qd.nodes[ce.Field]
			if n == nil {
				n = qd.nameNode
			}
			c.errf(file, n, "%s", ce.Problem)
		}
	}
	c.queues[q.Name] = q
	c.qNodes[q.Name] = qd.nameNode
}

var routeNameOK = func(s string) bool {
	return s != "" && len(s) <= 64 && strings.IndexFunc(s, unsafeRune) < 0
}

func (c *compiler) route(fd *fileDef, d *domain, rd *routeDef) *Route {
	file := fd.path
	rt := &Route{Name: rd.name, Domain: d.name, File: file, Line: rd.node.Line, dom: d}
	ok := true
	bad := func(n *yaml.Node, format string, args ...any) {
		c.errf(file, n, format, args...)
		ok = false
	}
	switch {
	case rd.nameNode == nil:
		bad(rd.node, "route has no name")
	case !routeNameOK(rd.name):
		bad(rd.nameNode, "route name %q: use up to 64 letters, digits, _ . : or - (it appears in metrics)", rd.name)
	case c.routeNm[rd.name] != nil:
		prev := c.routeNm[rd.name]
		bad(rd.nameNode, "route %q is already defined at %s:%d", rd.name, prev.File, prev.Line)
	}
	for _, m := range rd.methods {
		if !isToken(m) {
			bad(rd.methodNode, "method %q is not an HTTP method", m)
			continue
		}
		rt.Match.Methods = append(rt.Match.Methods, strings.ToUpper(m))
	}
	rt.methods = rt.Match.Methods
	if rd.hostNode != nil {
		h := strings.TrimSuffix(strings.ToLower(rd.host), ".")
		if inner, ok := strings.CutPrefix(h, "["); ok && strings.HasSuffix(inner, "]") {
			h = strings.TrimSuffix(inner, "]") // requests' hosts are compared without brackets
		}
		rt.Match.Host, rt.host = h, h
		name := strings.TrimPrefix(h, "*.")
		_, ipErr := netip.ParseAddr(name)
		switch {
		case name == "" || strings.ContainsAny(name, "*/[] \t"):
			bad(rd.hostNode, "host %q must be a host name, or *.domain for its subdomains", rd.host)
		case strings.Contains(name, ":") && ipErr != nil:
			bad(rd.hostNode, "host %q must not have a port: the port is ignored when matching", rd.host)
		}
	}
	paths := 0
	for _, pn := range []*yaml.Node{rd.pathNode, rd.prefixNode, rd.patternNode} {
		if pn != nil {
			paths++
		}
	}
	if paths > 1 {
		bad(rd.node, "give at most one of path, path_prefix and path_pattern")
	}
	checkPath := func(n *yaml.Node, p string) (string, bool) {
		if !strings.HasPrefix(p, "/") {
			bad(n, "path %q must start with /", p)
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
				bad(rd.patternNode, "path_pattern %q: %v", rd.pattern, err)
			}
			rt.params = params
		}
	}
	for _, hd := range rd.headers {
		switch {
		case !isToken(hd.name):
			bad(hd.node, "header match needs a valid header name, got %q", hd.name)
			continue
		case hd.hasVal && hd.present != nil:
			bad(hd.node, "header match: give value or present, not both")
		case !hd.hasVal && hd.present == nil:
			bad(hd.node, "header match needs value (equal to) or present (true or false)")
		}
		hm := HeaderMatch{Name: http.CanonicalHeaderKey(hd.name), Value: hd.value, Present: hd.present}
		rt.Match.Headers = append(rt.Match.Headers, hm)
		rt.headers = append(rt.headers, compiledHeader{HeaderMatch: hm, host: hm.Name == "Host"})
	}
	if len(rd.descs) == 0 {
		bad(rd.node, "route has no descriptors: it would limit nothing")
	}
	if len(rd.descs) > 64 {
		bad(rd.descNodes[64], "at most 64 descriptor lists per route")
		rd.descs = rd.descs[:64]
	}
	for i, list := range rd.descs {
		at := rd.descNodes[i]
		entries, eok := c.entries(file, rt, list, at)
		if !eok {
			ok = false
			continue
		}
		rt.Descriptors = append(rt.Descriptors, entries)
		cd := compileDesc(len(rt.Descriptors)-1, entries, rt.params)
		if !d.reachable(entries, &c.reach) {
			bad(at, "descriptor list %s matches no descriptor with a rate limit in domain %q", formatEntries(entries), d.name)
			continue
		}
		if cd.static {
			cd.staticCheck, cd.staticOK = d.staticCheck(cd.constVals())
			cd.staticCheck.Descriptor = cd.index
		}
		rt.descs = append(rt.descs, cd)
	}
	rt.allStatic = !slices.ContainsFunc(rt.descs, func(cd compiledDesc) bool { return !cd.static })
	rt.IdempotencyScope = DefaultIdempotencyScope
	if rd.scopeNode != nil {
		rt.IdempotencyScope = []RouteEntry{}
		for _, sn := range rd.scope {
			e := RouteEntry{Key: "idempotency_scope"}
			if err := parseFrom(&e, sn.name, rt); err != nil {
				bad(sn.node, "idempotency_scope %q: %v", sn.name, err)
				continue
			}
			rt.IdempotencyScope = append(rt.IdempotencyScope, e)
		}
		if len(rd.scope) > maxDepth {
			bad(rd.scopeNode, "idempotency_scope lists more than %d sources", maxDepth)
		}
	}
	rt.scope = compileDesc(0, rt.IdempotencyScope, rt.params).entries
	if rd.nameNode != nil && c.routeNm[rd.name] == nil {
		c.routeNm[rd.name] = rt
	}
	if !ok {
		return nil
	}
	return rt
}

func formatEntries(es []RouteEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func (c *compiler) entries(file string, rt *Route, list []entryDef, at *yaml.Node) ([]RouteEntry, bool) {
	ok := true
	bad := func(n *yaml.Node, format string, args ...any) {
		c.errf(file, n, format, args...)
		ok = false
	}
	if len(list) == 0 {
		bad(at, "empty descriptor list")
	}
	if len(list) > maxDepth {
		bad(at, "descriptor list longer than %d entries", maxDepth)
	}
	var out []RouteEntry
	for _, ed := range list {
		e := RouteEntry{Key: ed.key}
		switch {
		case ed.key == "":
			bad(ed.node, "descriptor entry needs a key")
		case ed.hasVal && ed.fromN != nil:
			bad(ed.node, "descriptor entry %q: give value or from, not both", ed.key)
		case ed.hasVal:
			e.Value = ed.value
			if ed.value == "" {
				bad(ed.node, "descriptor entry %q: value must not be empty", ed.key)
			}
			if ed.hasDef {
				bad(ed.defNode, "default is used only with from")
			}
		case ed.fromN != nil:
			if err := parseFrom(&e, ed.from, rt); err != nil {
				bad(ed.fromN, "from %q: %v", ed.from, err)
			}
			if ed.hasDef {
				if ed.def == "" {
					bad(ed.defNode, "default must not be empty")
				}
				e.Value = ed.def
			}
		default:
			bad(ed.node, "descriptor entry %q needs a value or a from", ed.key)
		}
		out = append(out, e)
	}
	return out, ok
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
