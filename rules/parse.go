package rules

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// The definitions below are a file as written, with the YAML nodes that locate each
// part; compile.go turns them into a Set.

type fileDef struct {
	path        string
	domain      string
	domainNode  *yaml.Node
	descriptors []*descDef
	routes      []*routeDef
	queues      []*queueDef
}

// limitDef is one rate limit: Envoy's rate_limit block or an entry of rate_limits.
type limitDef struct {
	node      *yaml.Node
	unit      string
	unitNode  *yaml.Node
	window    time.Duration
	winNode   *yaml.Node
	rpu       int64
	rpuNode   *yaml.Node
	mult      int64 // Envoy's unit_multiplier: the period is mult units
	multNode  *yaml.Node
	unlimited bool
	opts      limitOpts
}

// limitOpts are sluice's per-limit settings; a descriptor's are the defaults of its limits.
type limitOpts struct {
	algorithm   limiter.Algorithm
	algNode     *yaml.Node
	burst       int64
	burstNode   *yaml.Node
	failure     limiter.FailureMode
	failureNode *yaml.Node
	forgive     bool
	forgiveNode *yaml.Node
}

type nameRef struct {
	name string
	node *yaml.Node
}

type descDef struct {
	node       *yaml.Node
	key        string
	keyNode    *yaml.Node
	value      string
	valueNode  *yaml.Node
	rateLimit  *limitDef   // Envoy's rate_limit
	rateLimits []*limitDef // sluice's rate_limits
	rlsNode    *yaml.Node
	name       nameRef
	replaces   []nameRef
	// sideName and sideReplaces are name and replaces written on the descriptor itself
	// rather than inside rate_limit, where Envoy reads them.
	sideName     *yaml.Node
	sideReplaces *yaml.Node
	shadow       bool
	quota        bool // Envoy's quota_mode
	detailed     bool
	share        bool // Envoy's share_threshold
	shareNode    *yaml.Node
	metadata     map[string]any
	opts         limitOpts
	onLimit      OnLimit
	onLimitN     *yaml.Node
	queue        nameRef
	// on_limit: wait's fields.
	maxWait     time.Duration
	maxWaitN    *yaml.Node
	maxWaiting  int64
	maxWaitingN *yaml.Node
	then        OnLimit
	thenN       *yaml.Node
	children    []*descDef
	// extensions are the sluice-only fields set on the descriptor, for "has no effect".
	extensions []*yaml.Node
}

type entryDef struct {
	node    *yaml.Node
	key     string
	value   string
	hasVal  bool
	from    string
	fromN   *yaml.Node
	def     string
	hasDef  bool
	defNode *yaml.Node
}

type headerDef struct {
	node    *yaml.Node
	name    string
	value   string
	hasVal  bool
	present *bool
}

type routeDef struct {
	node        *yaml.Node
	name        string
	nameNode    *yaml.Node
	methods     []string
	methodNode  *yaml.Node
	host        string
	hostNode    *yaml.Node
	path        string
	pathNode    *yaml.Node
	prefix      string
	prefixNode  *yaml.Node
	pattern     string
	patternNode *yaml.Node
	headers     []headerDef
	descs       [][]entryDef
	descNodes   []*yaml.Node
	scope       []nameRef
	scopeNode   *yaml.Node
	priority    *entryDef // priority: {value: high} or {from: SOURCE, default: LEVEL}
}

type queueDef struct {
	node        *yaml.Node
	name        string
	nameNode    *yaml.Node
	outflow     limiter.Rate
	hasOutflow  bool
	outflowNode *yaml.Node
	downNode    *yaml.Node
	maxDepth    int64
	maxBytes    int64
	maxAge      time.Duration
	maxAttempts int64
	maxInFlight int64
	backoff     queueconfig.Backoff
	downstream  string
	hasDown     bool
	resultHdrs  []nameRef
	maxIdemKeys int64
	maxBody     int64
	dropHeaders []string
	deadMaxAge  time.Duration
	maxDelay    time.Duration
	delay       time.Duration
	// nodes holds each field's value, where queueconfig.Config.Validate's problems are reported.
	nodes      map[string]*yaml.Node
	delivery   queueconfig.Delivery
	priorities queueconfig.Priorities
	fairBy     string
	flowBy     queueconfig.FlowBy
	flowBad    bool // a problem of flow_by was reported while reading it
	fairLanes  int64
	tenantMax  int64

	callbackHosts   []string
	callbackPrivate bool
	callbackSecret  string
}

var (
	fileFields     = []string{"domain", "descriptors", "routes", "queues", "shadow_mode"}
	descFields     = []string{"key", "value", "rate_limit", "rate_limits", "descriptors", "shadow_mode", "detailed_metric", "value_to_metric", "share_threshold", "metadata", "quota_mode", "name", "replaces", "algorithm", "burst", "on_limit", "queue", "failure_mode", "forgive_rejected", "max_wait", "max_waiting", "then"}
	optFields      = []string{"algorithm", "burst", "failure_mode", "forgive_rejected"}
	limitFields    = append([]string{"unit", "unit_multiplier", "window", "requests_per_unit"}, optFields...)
	envoyFields    = append([]string{"unlimited", "name", "replaces"}, limitFields...)
	routeFields    = []string{"name", "match", "descriptors", "idempotency_scope", "priority"}
	priorityFields = []string{"levels", "default", "mode", "weights"}
	matchFields    = []string{"method", "host", "path", "path_prefix", "path_pattern", "headers"}
	headerFields   = []string{"name", "value", "present"}
	entryFields    = []string{"key", "value", "from", "default"}
	queueFields    = []string{"outflow", "max_depth", "max_bytes", "max_age", "max_attempts", "max_in_flight", "backoff", "downstream", "max_body", "drop_headers", "dead_letter_max_age", "result_headers", "max_idempotency_keys", "delivery", "priorities", "fair_by", "fair_lanes", "tenant_max_depth", "callback_hosts", "callback_private", "callback_secret", "max_delay", "delay", "flow_by"}
	flowFields     = []string{"from", "rate", "max_in_flight"}
	outflowFields  = []string{"rate", "unit", "window", "requests_per_unit"}
	backoffFields  = []string{"initial", "max"}
)

// parseFile reads one rules file. It returns nil when the file is not even YAML.
func parseFile(name string, data []byte, probs *problemList) *fileDef {
	w := &walker{file: name, probs: probs, budget: maxNodes}
	if len(data) > MaxFileSize {
		w.errf(nil, "file is larger than %d MiB", MaxFileSize>>20)
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			w.errf(nil, "empty file: a rules file needs at least a domain")
		} else {
			w.yamlError(data, err)
		}
		return nil
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		w.errf(&extra, "more than one YAML document: each rules file holds one domain")
	} else if !errors.Is(err, io.EOF) {
		w.yamlError(data, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			w.errf(nil, "empty file: a rules file needs at least a domain")
			return nil
		}
		root = root.Content[0]
	}
	root = w.resolve(root)
	if root == nil {
		return nil
	}
	if !w.rulesShaped(root) {
		return nil
	}
	f := &fileDef{path: name}
	w.fields(root, "the file", fileFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "domain":
			field(v, "domain", w.str, &f.domain, &f.domainNode)
		case "shadow_mode":
			// Envoy's service accepts shadow_mode here but reads it only on descriptors:
			// its rules stay enforced. Shadowing the whole file instead would change what
			// the file means, so true is refused (false means the same in both).
			if on, _ := w.boolean(v, "shadow_mode"); on {
				w.errf(v, "shadow_mode at the top of the file: Envoy's rate limit service ignores it there and enforces every rule, so sluice refuses it rather than shadow the whole file; set shadow_mode on each descriptor, or run sluice with --shadow")
			}
		case "descriptors":
			f.descriptors = w.descriptors(v, 1)
		case "routes":
			for _, rn := range w.items(v, "routes") {
				if rn = w.resolve(rn); rn != nil {
					f.routes = append(f.routes, w.route(rn))
				}
			}
		case "queues":
			ps, _ := w.pairs(v, "queues", 0)
			for _, p := range ps {
				if qn := w.resolve(p.val); qn != nil {
					f.queues = append(f.queues, w.queue(p.key, p.kNode, qn))
				}
			}
		}
	})
	if f.domainNode == nil {
		w.errf(root, "missing domain: every rules file names its domain")
	} else if f.domain == "" {
		w.errf(f.domainNode, "domain must not be empty")
	}
	return f
}

// rulesShaped reports whether root can be a rules file: a mapping with at least one
// field of a rules file. Anything else (a symlink to /etc/passwd, a key, another
// program's YAML) is one problem that quotes nothing of the file, not a problem per
// unknown key: its keys and values may be secrets, and problems reach the logs.
func (w *walker) rulesShaped(root *yaml.Node) bool {
	if root.Kind != yaml.MappingNode {
		w.errf(root, "not a rules file: the top level must be a mapping with a domain, got %s", kindName(root))
		return false
	}
	for i := 0; i+1 < len(root.Content); i += 2 {
		if k := root.Content[i]; k.Tag == "!!merge" || slices.Contains(fileFields, k.Value) {
			return true
		}
	}
	w.errf(root, "not a rules file: none of its top-level fields is one of %s", strings.Join(fileFields, ", "))
	return false
}

// yamlError reports a YAML syntax error in data at its line and column (see
// syntaxErrorAt; yaml.v3 puts a line near it in the text). Quoted parts of its
// message (an anchor's name, a character) come from the file, which may not be YAML at
// all: they are cut, so that nothing of it reaches the logs.
func (w *walker) yamlError(data []byte, err error) {
	msg := unquote(strings.TrimPrefix(err.Error(), "yaml: "))
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if i := strings.IndexByte(rest, ':'); i > 0 {
			n := 0
			for _, c := range rest[:i] {
				if c < '0' || c > '9' || n > 1e8 {
					n = 0
					break
				}
				n = n*10 + int(c-'0')
			}
			if n > 0 {
				line, msg = n, strings.TrimSpace(rest[i+1:])
			}
		}
	}
	if l, c, ok := syntaxErrorAt(data, line); ok {
		w.probs.add(w.file, l, c, "invalid YAML: %s", msg)
	} else if line > 0 {
		w.probs.add(w.file, line, 1, "invalid YAML: %s", msg)
	} else {
		w.probs.add(w.file, 0, 0, "invalid YAML: %s", msg)
	}
}

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

func (w *walker) queue(name string, nameNode, n *yaml.Node) *queueDef {
	q := &queueDef{node: n, name: name, nameNode: nameNode, nodes: map[string]*yaml.Node{}}
	w.fields(n, "queue "+name, queueFields, func(key string, k, v *yaml.Node) {
		q.nodes[key] = v
		switch key {
		case "outflow":
			q.outflow, q.hasOutflow = w.outflow(v)
			q.outflowNode = v
		case "max_depth":
			q.maxDepth = w.positive(v, key)
		case "max_bytes":
			q.maxBytes = w.size(v, key)
		case "max_age":
			field(v, key, w.duration, &q.maxAge, nil)
		case "max_attempts":
			q.maxAttempts = w.positive(v, key)
		case "max_in_flight":
			q.maxInFlight = w.positive(v, key)
		case "backoff":
			w.fields(v, "backoff", backoffFields, func(key string, k, v *yaml.Node) {
				d, _ := w.duration(v, "backoff "+key)
				if key == "initial" {
					q.backoff.Initial = d
				} else {
					q.backoff.Max = d
				}
			})
		case "downstream":
			q.downstream, q.hasDown = w.downstream(v)
			q.downNode = v
		case "result_headers":
			q.resultHdrs = w.names(v, key)
		case "max_idempotency_keys":
			q.maxIdemKeys = w.positive(v, key)
		case "max_body":
			q.maxBody = w.size(v, key)
		case "drop_headers":
			for _, hn := range w.items(v, key) {
				if h, ok := w.str(hn, "header name"); ok {
					q.dropHeaders = append(q.dropHeaders, h)
				}
			}
		case "dead_letter_max_age":
			field(v, key, w.duration, &q.deadMaxAge, nil)
		case "max_delay":
			field(v, key, w.duration, &q.maxDelay, nil)
		case "delay":
			field(v, key, w.duration, &q.delay, nil)
		case "delivery":
			d, _ := w.str(v, key)
			q.delivery = queueconfig.Delivery(d)
		case "callback_hosts":
			for _, h := range w.names(v, key) {
				q.callbackHosts = append(q.callbackHosts, h.name)
			}
		case "callback_private":
			q.callbackPrivate, _ = w.boolean(v, key)
		case "callback_secret":
			q.callbackSecret = w.secret(v, key)
		case "priorities":
			w.priorities(v, &q.priorities)
		case "fair_by":
			q.fairBy, _ = w.str(v, key)
		case "fair_lanes":
			q.fairLanes = w.positive(v, key)
		case "flow_by":
			// A problem reported here (the value's shape, a field's) is not reported
			// again by the queue package's validator.
			before := len(w.probs.list) + w.probs.dropped
			defer func() { q.flowBad = len(w.probs.list)+w.probs.dropped > before }()
			w.fields(v, "flow_by", flowFields, func(key string, k, v *yaml.Node) {
				switch key {
				case "from":
					q.flowBy.From, _ = w.str(v, "flow_by from")
				case "rate":
					q.flowBy.Rate, _ = w.rate(v)
				case "max_in_flight":
					q.flowBy.MaxInFlight = int(min(w.positive(v, "flow_by max_in_flight"), 1_000_000))
				}
			})
		case "tenant_max_depth":
			q.tenantMax = w.positive(v, key)
		}
	})
	return q
}

// priorities reads a queue's priorities: {levels: [..], default: L, mode: M, weights: {L: N}}.
func (w *walker) priorities(n *yaml.Node, p *queueconfig.Priorities) {
	w.fields(n, "priorities", priorityFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "levels":
			for _, ref := range w.names(v, "priorities levels") {
				p.Levels = append(p.Levels, ref.name)
			}
		case "default":
			p.Default, _ = w.str(v, "priorities default")
		case "mode":
			m, _ := w.str(v, "priorities mode")
			p.Mode = queueconfig.PriorityMode(m)
		case "weights":
			if v = w.resolve(v); v == nil {
				return
			}
			if v.Kind != yaml.MappingNode {
				w.errf(v, "priorities weights must map levels to weights, like {high: 8, normal: 2, low: 1}, got %s", kindName(v))
				return
			}
			p.Weights = map[string]int{}
			for i := 0; i+1 < len(v.Content); i += 2 {
				level, ok := w.str(v.Content[i], "a priority level")
				n, nok := w.integer(v.Content[i+1], "weight of "+level)
				if ok && nok {
					p.Weights[level] = int(max(min(n, queueconfig.MaxPriorityWeight+1), 0))
				}
			}
		}
	})
}

// names reads a list of strings, each with its node.
func (w *walker) names(v *yaml.Node, what string) []nameRef {
	var out []nameRef
	for _, n := range w.items(v, what) {
		if n = w.resolve(n); n != nil {
			if s, ok := w.str(n, what+" entry"); ok {
				out = append(out, nameRef{name: s, node: n})
			}
		}
	}
	return out
}

// positive reads a whole number of at least 1; 0 means "not set" to the caller.
func (w *walker) positive(v *yaml.Node, what string) int64 {
	n, ok := w.integer(v, what)
	if ok && n < 1 {
		w.errf(v, "%s must be at least 1, got %d", what, n)
		return 0
	}
	return n
}

// unquote drops every quoted part of msg longer than one character: yaml.v3 quotes
// single characters of its grammar (expected ',' or '}'), but names from the file (an
// anchor) too.
func unquote(msg string) string {
	var b strings.Builder
	rest := msg
	for {
		i := strings.IndexAny(rest, "'\"`")
		if i < 0 {
			b.WriteString(rest)
			break
		}
		j := strings.IndexByte(rest[i+1:], rest[i])
		if j < 0 {
			b.WriteString(rest)
			break
		}
		quoted := rest[i : i+j+2]
		b.WriteString(rest[:i])
		if utf8.RuneCountInString(quoted) <= 3 {
			b.WriteString(quoted)
		}
		rest = rest[i+j+2:]
	}
	return strings.Join(strings.Fields(b.String()), " ")
}
