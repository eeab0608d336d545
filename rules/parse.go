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
