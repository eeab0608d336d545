package rules

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
)

// Limits that keep a hostile or broken file from costing more than it is worth. A real
// rules file is far below all of them.
const (
	// MaxFileSize is the largest rules file read.
	MaxFileSize = 8 << 20
	// maxNodes caps the YAML nodes visited in one file, counting each use of an alias
	// anew, so an alias bomb stops here instead of expanding exponentially.
	maxNodes = 1 << 20
	// maxDepth is the deepest descriptor nesting, and the longest route descriptor list.
	maxDepth = 16
	// maxYAMLDepth caps recursion over YAML nesting of any kind.
	maxYAMLDepth = 64
)

// walker reads one file's YAML tree, reporting problems with their positions.
type walker struct {
	file   string
	probs  *problemList
	budget int
	broke  bool // the budget ran out: stop reading
}

func (w *walker) errf(n *yaml.Node, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	w.probs.add(w.file, line, col, format, args...)
}

// resolve follows aliases and charges one node to the budget. It returns nil once the
// budget is spent.
func (w *walker) resolve(n *yaml.Node) *yaml.Node {
	if w.broke || n == nil {
		return nil
	}
	for i := 0; n.Kind == yaml.AliasNode; i++ {
		if n.Alias == nil || i > 100 {
			w.errf(n, "alias does not resolve")
			return nil
		}
		n = n.Alias
	}
	w.budget--
	if w.budget < 0 {
		w.broke = true
		w.errf(n, "file too complex: more than %d YAML nodes after expanding aliases", maxNodes)
		return nil
	}
	return n
}

// pair is one key and value of a mapping.
type pair struct {
	key   string
	kNode *yaml.Node
	val   *yaml.Node
}

// pairs returns the entries of mapping n, with YAML merge keys (<<) expanded: keys
// written in n win over merged ones. ok is false (and a problem reported) when n is not
// a mapping or has duplicate keys.
func (w *walker) pairs(n *yaml.Node, what string, depth int) ([]pair, bool) {
	if n == nil {
		return nil, false
	}
	if n.Kind != yaml.MappingNode {
		w.errf(n, "%s must be a mapping, got %s", what, kindName(n))
		return nil, false
	}
	if depth > maxYAMLDepth {
		w.errf(n, "merge keys nested too deeply")
		return nil, false
	}
	var own, merged []pair
	ownAt := map[string]int{} // maps, not scans: a mapping may have many keys
	mergedSeen := map[string]bool{}
	ok := true
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := w.resolve(n.Content[i]), n.Content[i+1]
		if k == nil {
			return nil, false
		}
		if k.Kind != yaml.ScalarNode {
			w.errf(k, "%s: keys must be plain strings", what)
			ok = false
			continue
		}
		if k.Tag == "!!merge" {
			mv := w.resolve(v)
			if mv == nil {
				return nil, false
			}
			sources := []*yaml.Node{mv}
			if mv.Kind == yaml.SequenceNode {
				sources = mv.Content
			}
			for _, s := range sources {
				ps, pok := w.pairs(w.resolve(s), "merged value", depth+1)
				if !pok {
					ok = false
				}
				for _, p := range ps {
					if !mergedSeen[p.key] {
						mergedSeen[p.key] = true
						merged = append(merged, p)
					}
				}
			}
			continue
		}
		if j, dup := ownAt[k.Value]; dup {
			w.errf(k, "duplicate field %q in %s (first at line %d)", k.Value, what, own[j].kNode.Line)
			ok = false
			continue
		}
		ownAt[k.Value] = len(own)
		own = append(own, pair{key: k.Value, kNode: k, val: v})
	}
	for _, p := range merged {
		if _, written := ownAt[p.key]; !written {
			own = append(own, p)
		}
	}
	return own, ok
}

// fields reads mapping n, calling handle for each known field and reporting unknown ones.
func (w *walker) fields(n *yaml.Node, what string, known []string, handle func(key string, k, v *yaml.Node)) bool {
	ps, ok := w.pairs(n, what, 0)
	for _, p := range ps {
		if !slices.Contains(known, p.key) {
			msg := fmt.Sprintf("unknown field %q in %s", p.key, what)
			// The suggestion costs; skip it once nobody will read the problem.
			if !w.probs.full() {
				if s := Suggest(p.key, known); s != "" {
					msg += fmt.Sprintf(" (did you mean %q?)", s)
				}
			}
			w.errf(p.kNode, "%s", msg)
			ok = false
			continue
		}
		v := w.resolve(p.val)
		if v == nil {
			return false
		}
		handle(p.key, p.kNode, v)
	}
	return ok
}

// items returns the elements of sequence n.
func (w *walker) items(n *yaml.Node, what string) []*yaml.Node {
	if n.Kind != yaml.SequenceNode {
		if isNull(n) {
			return nil
		}
		w.errf(n, "%s must be a list, got %s", what, kindName(n))
		return nil
	}
	return n.Content
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		// The value itself is never quoted: the file may be anything (a symlink to
		// /etc/passwd, a key file) and its text must not reach logs; the position says
		// where to look.
		switch n.Tag {
		case "!!null":
			return "nothing"
		case "!!int":
			return "a whole number"
		case "!!float":
			return "a decimal number"
		case "!!bool":
			return "true or false"
		case "!!timestamp":
			return "a timestamp"
		}
		return "a string"
	}
	return "something else"
}

// str reads a scalar as a string. Numbers and booleans are taken as written (Envoy files
// write values like `value: 500` unquoted); null is the empty string.
func (w *walker) str(n *yaml.Node, what string) (string, bool) {
	if n.Kind != yaml.ScalarNode {
		w.errf(n, "%s must be a string, got %s", what, kindName(n))
		return "", false
	}
	if isNull(n) {
		return "", true
	}
	return n.Value, true
}

// integer reads a whole number.
func (w *walker) integer(n *yaml.Node, what string) (int64, bool) {
	if n.Kind == yaml.ScalarNode && n.Tag == "!!int" {
		var v int64
		if err := n.Decode(&v); err == nil {
			return v, true
		}
		w.errf(n, "%s: %q is out of range", what, n.Value)
		return 0, false
	}
	w.errf(n, "%s must be a whole number, got %s", what, kindName(n))
	return 0, false
}

// boolean reads true/false; the YAML 1.1 spellings (yes/no/on/off) that Envoy's parser
// accepts are accepted too when unquoted.
func (w *walker) boolean(n *yaml.Node, what string) (bool, bool) {
	if n.Kind == yaml.ScalarNode {
		if n.Tag == "!!bool" {
			var b bool
			if n.Decode(&b) == nil {
				return b, true
			}
		}
		if n.Style == 0 {
			switch strings.ToLower(n.Value) {
			case "y", "yes", "on":
				return true, true
			case "n", "no", "off":
				return false, true
			}
		}
	}
	w.errf(n, "%s must be true or false, got %s", what, kindName(n))
	return false, false
}

// duration reads a duration such as 30s, 1h30m or 7d.
func (w *walker) duration(n *yaml.Node, what string) (time.Duration, bool) {
	s, ok := w.str(n, what)
	if !ok {
		return 0, false
	}
	d, err := limiter.ParseDuration(s)
	if err != nil {
		w.errf(n, "%s: %v", what, err)
		return 0, false
	}
	if d <= 0 {
		w.errf(n, "%s must be positive, got %s", what, s)
		return 0, false
	}
	return d, true
}

func formatInt(n int64) string { return strconv.FormatInt(n, 10) }

// field reads the value v of one field with read (w.str, w.boolean, w.integer,
// w.duration) into *dst and, unless at is nil, keeps v in *at for the compiler's
// located errors. It reports whether v had the right type (*dst is then the zero
// value, and the problem is recorded).
func field[T any](v *yaml.Node, what string, read func(*yaml.Node, string) (T, bool), dst *T, at **yaml.Node) bool {
	if at != nil {
		*at = v
	}
	var ok bool
	*dst, ok = read(v, what)
	return ok
}

// atLeast reads a whole number into *dst and v into *at, reporting one below min.
// The number is kept even then: the problem already refuses the set, and the compiler
// reports nothing more about it.
func (w *walker) atLeast(v *yaml.Node, what string, min int64, dst *int64, at **yaml.Node) {
	*at = v
	n, ok := w.integer(v, what)
	if !ok {
		return
	}
	switch {
	case n < min && min == 0:
		w.errf(v, "%s must not be negative, got %d", what, n)
	case n < min:
		w.errf(v, "%s must be at least %d, got %d", what, min, n)
	}
	*dst = n
}

// metadata reads Envoy's descriptor metadata: a mapping whose values are strings,
// numbers, booleans, null, lists or mappings with string keys, as a JSON-like value
// (map[string]any, []any, string, int64, float64, bool, nil).
func (w *walker) metadata(n *yaml.Node) map[string]any {
	if n.Kind != yaml.MappingNode {
		if !isNull(n) {
			w.errf(n, "metadata must be a mapping, got %s", kindName(n))
		}
		return nil
	}
	m, _ := w.metaValue(n, 0).(map[string]any)
	return m
}

func (w *walker) metaValue(n *yaml.Node, depth int) any {
	if depth > maxYAMLDepth {
		w.errf(n, "metadata nested more than %d levels deep", maxYAMLDepth)
		return nil
	}
	switch n.Kind {
	case yaml.MappingNode:
		ps, _ := w.pairs(n, "metadata", 0)
		m := make(map[string]any, len(ps))
		for _, p := range ps {
			if v := w.resolve(p.val); v != nil {
				m[p.key] = w.metaValue(v, depth+1)
			}
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, e := range n.Content {
			if e = w.resolve(e); e != nil {
				l = append(l, w.metaValue(e, depth+1))
			}
		}
		return l
	case yaml.ScalarNode:
		var v any
		switch n.Tag {
		case "!!null":
			return nil
		case "!!int", "!!float", "!!bool":
			if n.Decode(&v) == nil {
				return v
			}
		}
		return n.Value
	}
	w.errf(n, "metadata: unsupported value, got %s", kindName(n))
	return nil
}

// secret reads a secret: "env:NAME" takes it from the environment variable NAME (how a
// secret should reach a rules file that lives in a repository or a ConfigMap); any
// other string is the secret itself. Problems never quote the value.
func (w *walker) secret(v *yaml.Node, what string) string {
	if v.Kind != yaml.ScalarNode || isNull(v) {
		w.errf(v, "%s must be a string, got %s", what, kindName(v))
		return ""
	}
	name, ok := strings.CutPrefix(v.Value, "env:")
	if !ok {
		return v.Value
	}
	val, set := os.LookupEnv(name)
	if !set || val == "" {
		w.errf(v, "%s: environment variable %s is not set", what, name)
		return ""
	}
	return val
}
