package rules

import (
	"crypto/sha256"
	"encoding/base64"
	"net/netip"
	"strings"
)

// val is one descriptor entry's key and value while a request is matched. A client
// address is not turned into a string (that would allocate): ip says to read it from the
// request's ipText.
type val struct {
	key string
	s   string
	ip  bool
}

// ipText is the client address in canonical text form, written once per request.
type ipText struct {
	b [48]byte
	n int
	s string // the text as a string, made when a wildcard pattern needs it
}

func (t *ipText) str() string {
	if t.s == "" && t.n > 0 {
		t.s = string(t.b[:t.n])
	}
	return t.s
}

func (t *ipText) set(a netip.Addr) {
	if a.IsValid() {
		t.n = len(a.Unmap().WithZone("").AppendTo(t.b[:0]))
	}
}

func (g *group) lookup(v *val) (*node, bool) {
	return g.lookupIP(v, nil)
}

// lookupIP finds the most specific descriptor of g for v, as Envoy ranks them: the
// exact value, then the first wildcard (a value with *) in file order that matches,
// then the descriptor without value. exact reports the first case, where the value
// needs no hashing into the key.
func (g *group) lookupIP(v *val, t *ipText) (n *node, exact bool) {
	if v.ip {
		n = g.exact[string(t.b[:t.n])]
	} else {
		n = g.exact[v.s]
	}
	if n != nil {
		return n, true
	}
	for i := range g.wild {
		w := &g.wild[i]
		switch {
		case !v.ip:
			if w.matches(v.s) {
				return w.n, false
			}
		case w.parts == nil: // a prefix: compared in place, without a string
			if t.n >= len(w.prefix) && string(t.b[:len(w.prefix)]) == w.prefix {
				return w.n, false
			}
		case w.matches(t.str()):
			return w.n, false
		}
	}
	return g.any, false
}

// walk follows vals down d's tree as Envoy does: one level per entry, no backtracking,
// and the rule counts only on the level of the last entry. Values matched by a
// wildcard or a descriptor without value are written into hb: they select the counter,
// as the request's values make Envoy's cache key; except under a share_threshold
// wildcard, whose values all count on one counter.
func (d *domain) walk(vals []val, t *ipText, hb *hashBuf) (rule *Rule, hashed bool) {
	return walkFrom(d.root, 0, vals, t, hb)
}

// walkFrom walks vals down from n as walk does, vals[0] being the entry of level
// level: the levels above were walked without hashing a value.
func walkFrom(n *node, level int, vals []val, t *ipText, hb *hashBuf) (rule *Rule, hashed bool) {
	for i := range vals {
		v := &vals[i]
		g := n.kids[v.key]
		if g == nil {
			return nil, false
		}
		m, exact := g.lookupIP(v, t)
		if m == nil {
			return nil, false
		}
		if !exact && !m.share {
			hb.add(level+i, v, t)
			hashed = true
		}
		if i == len(vals)-1 {
			return m.rule, hashed
		}
		if len(m.kids) == 0 {
			return nil, false
		}
		n = m
	}
	return nil, false
}

// constantStart walks the leading constants of a descriptor list's entries, all but
// the last, down d's tree as walk would, while each is matched exactly (or under a
// share_threshold wildcard: its value selects no counter). The walk of a request's
// values can start at the node they reach, at entry skip, for the same rule and key;
// n is nil when the constants reach no node that a later entry could go on from, so
// that the list never yields a check.
func (d *domain) constantStart(entries []compiledEntry) (n *node, skip int) {
	n = d.root
	for ; skip < len(entries)-1 && entries[skip].kind == FromConstant; skip++ {
		e := &entries[skip]
		g := n.kids[e.key]
		if g == nil {
			return nil, skip
		}
		m, exact := g.lookup(&val{key: e.key, s: e.value})
		switch {
		case m == nil || len(m.kids) == 0:
			return nil, skip
		case !exact && !m.share: // its value goes into the key: left to walk
			return n, skip
		}
		n = m
	}
	return n, skip
}

// staticCheck resolves a descriptor list made of constants once, at compile time.
func (d *domain) staticCheck(vals []val) (Check, bool) {
	var hb hashBuf
	rule, hashed := d.walk(vals, nil, &hb)
	if rule == nil {
		return Check{}, false
	}
	return makeCheck(rule, 0, hashed, &hb), true
}

// hashBuf collects the values that select a counter, to hash them into the key. Each is
// written with its level and length, so different values never give the same input.
type hashBuf struct {
	n int
	b [1024 + maxDepth*34]byte // raw values up to 1 KiB, room for every level hashed
}

// rawMax is the longest value written into hashBuf as is; a longer one, or one that no
// longer fits, is hashed first (which allocates). The encoding depends only on the
// values, so the same values always give the same key.
const rawMax = 255

func (h *hashBuf) add(level int, v *val, t *ipText) {
	n := len(v.s)
	if v.ip {
		n = t.n
	}
	if n <= rawMax && h.n+3+n <= len(h.b)-maxDepth*34 {
		h.b[h.n], h.b[h.n+1], h.b[h.n+2] = byte(level), 0, byte(n)
		h.n += 3
		if v.ip {
			h.n += copy(h.b[h.n:], t.b[:t.n])
		} else {
			h.n += copy(h.b[h.n:], v.s)
		}
		return
	}
	var sum [32]byte
	if v.ip {
		sum = sha256.Sum256(t.b[:t.n])
	} else {
		sum = sha256.Sum256([]byte(v.s))
	}
	h.b[h.n], h.b[h.n+1] = byte(level), 1
	h.n += 2
	h.n += copy(h.b[h.n:], sum[:])
}

// hashLen is the length of the request-dependent end of a key: a colon and 128 bits in
// base64url.
const hashLen = 23

func makeCheck(rule *Rule, desc int, hashed bool, hb *hashBuf) Check {
	c := Check{Rule: rule, Descriptor: desc}
	if len(rule.prefixes) == 0 {
		return c
	}
	if !hashed {
		c.keys = rule.staticKeys
		return c
	}
	sum := sha256.Sum256(hb.b[:hb.n])
	var vh [hashLen]byte
	vh[0] = ':'
	base64.RawURLEncoding.Encode(vh[1:], sum[:16])
	var b strings.Builder
	b.Grow(len(rule.staticKeys) + len(rule.prefixes)*hashLen)
	for _, p := range rule.prefixes {
		b.WriteString(p)
		b.Write(vh[:])
	}
	c.keys, c.hashLen = b.String(), hashLen
	return c
}
