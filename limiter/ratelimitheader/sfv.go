package ratelimitheader

import (
	"fmt"
	"strconv"
	"unicode/utf8"
)

// A reader of Structured Field lists (RFC 9651, which RFC 8941 grew into). The whole
// list grammar is checked, every bare item type included, so that a field that does not
// parse fails whole as the RFC requires; only what the RateLimit fields use is kept of a
// member: its bare item when it is a String, and its Integer and Byte Sequence
// parameters. Parsing is one pass over the input with no backtracking, and nothing is
// allocated for a member beyond what it keeps.

// itemKind is the type of a bare item, as far as the fields tell types apart.
type itemKind uint8

const (
	kindOther itemKind = iota // Token, Decimal, Boolean, Date or Display String
	kindString
	kindInteger
	kindBytes
)

// item is a bare item; str holds a String's value or a Byte Sequence's base64 (without
// its padding), num an Integer's.
type item struct {
	kind itemKind
	str  string
	num  int64
}

// param is one parameter. A parameter without a value is the Boolean true (kindOther).
type param struct {
	key string
	val item
}

// member is one member of a list: inner is set for an Inner List (whose items are
// checked, not kept).
type member struct {
	val    item
	inner  bool
	params []param
}

// lookup returns the value of parameter key: the last one of that name, since a
// repeated key overrides the earlier one (RFC 9651 §4.2.3.2).
func (m *member) lookup(key string) (item, bool) {
	for i := len(m.params) - 1; i >= 0; i-- {
		if m.params[i].key == key {
			return m.params[i].val, true
		}
	}
	return item{}, false
}

// Largest Integer a Structured Field carries: 15 decimal digits.
const maxInteger = 999_999_999_999_999

type parser struct {
	s      string
	i      int
	params []param // reused from member to member
}

func (p *parser) fail(what string) error {
	return fmt.Errorf("%w: %s at byte %d", ErrSyntax, what, p.i)
}

func (p *parser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *parser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *parser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// parseList parses s as a List and calls each with every member in order. The member
// and its parameters are only valid during the call. An error of each stops the parse
// and is returned as it is.
func parseList(s string, each func(*member) error) error {
	p := &parser{s: s}
	p.skipSP()
	for p.i < len(p.s) {
		m, err := p.member()
		if err != nil {
			return err
		}
		if err := each(&m); err != nil {
			return err
		}
		p.skipOWS()
		if p.i == len(p.s) {
			return nil
		}
		if p.s[p.i] != ',' {
			return p.fail("want a comma between members")
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return p.fail("trailing comma")
		}
	}
	return nil
}

func (p *parser) member() (member, error) {
	var m member
	if p.peek() == '(' {
		p.i++
		m.inner = true
		for {
			p.skipSP()
			if p.peek() == ')' {
				p.i++
				break
			}
			if _, err := p.bareItem(); err != nil {
				return m, err
			}
			if err := p.parameters(); err != nil {
				return m, err
			}
			if c := p.peek(); c != ' ' && c != ')' {
				return m, p.fail("want a space or ) in an inner list")
			}
		}
	} else {
		v, err := p.bareItem()
		if err != nil {
			return m, err
		}
		m.val = v
	}
	err := p.parameters()
	m.params = p.params
	return m, err
}

// parameters parses the parameters that follow an item into p.params.
func (p *parser) parameters() error {
	p.params = p.params[:0]
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return err
		}
		prm := param{key: key}
		if p.peek() == '=' {
			p.i++
			if prm.val, err = p.bareItem(); err != nil {
				return err
			}
		}
		p.params = append(p.params, prm)
	}
	return nil
}

func (p *parser) key() (string, error) {
	start := p.i
	if c := p.peek(); !isLCAlpha(c) && c != '*' {
		return "", p.fail("a key starts with a lowercase letter or *")
	}
	for p.i < len(p.s) {
		c := p.s[p.i]
		if !isLCAlpha(c) && !isDigit(c) && c != '_' && c != '-' && c != '.' && c != '*' {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *parser) bareItem() (item, error) {
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		s, err := p.str()
		return item{kind: kindString, str: s}, err
	case c == '*' || isAlpha(c):
		p.i++
		for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
			p.i++
		}
		return item{}, nil
	case c == ':':
		b, err := p.byteSeq()
		return item{kind: kindBytes, str: b}, err
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return item{}, nil
		}
		return item{}, p.fail("a Boolean is ?0 or ?1")
	case c == '@':
		p.i++
		v, err := p.number()
		if err == nil && v.kind != kindInteger {
			err = p.fail("a Date is an Integer")
		}
		return item{}, err
	case c == '%':
		return item{}, p.displayString()
	}
	return item{}, p.fail("not the start of an item")
}

// number parses an Integer or a Decimal (whose value is not kept).
func (p *parser) number() (item, error) {
	neg := p.peek() == '-'
	if neg {
		p.i++
	}
	start, dot := p.i, -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			if p.i-start > 12 {
				return item{}, p.fail("a Decimal has at most 12 integer digits")
			}
			dot = p.i
		} else if !isDigit(c) {
			break
		}
		p.i++
		if dot < 0 && p.i-start > 15 {
			return item{}, p.fail("an Integer has at most 15 digits")
		}
		if dot >= 0 && p.i-start > 16 {
			return item{}, p.fail("a Decimal has at most 16 characters")
		}
	}
	if p.i == start || !isDigit(p.s[start]) {
		return item{}, p.fail("want a digit")
	}
	if dot >= 0 {
		if frac := p.i - dot - 1; frac < 1 || frac > 3 {
			return item{}, p.fail("a Decimal has 1 to 3 fraction digits")
		}
		return item{}, nil
	}
	n, err := strconv.ParseInt(p.s[start:p.i], 10, 64)
	if err != nil { // at most 15 digits: cannot happen
		return item{}, p.fail("Integer out of range")
	}
	if neg {
		n = -n
	}
	return item{kind: kindInteger, num: n}, nil
}

// str parses a String. Its value is cut from the input when it holds no escape.
func (p *parser) str() (string, error) {
	p.i++ // the opening quote
	start := p.i
	var b []byte // the value so far, once an escape has been seen
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '\\':
			if p.i+1 == len(p.s) || p.s[p.i+1] != '"' && p.s[p.i+1] != '\\' {
				return "", p.fail(`a String escapes only " and \`)
			}
			if b == nil {
				b = append(make([]byte, 0, p.i-start+8), p.s[start:p.i]...)
			}
			b = append(b, p.s[p.i+1])
			p.i += 2
			continue
		case c == '"':
			p.i++
			if b == nil {
				return p.s[start : p.i-1], nil
			}
			return string(b), nil
		case c < 0x20 || c > 0x7e:
			return "", p.fail("a String holds printable ASCII only")
		}
		if b != nil {
			b = append(b, c)
		}
		p.i++
	}
	return "", p.fail("unterminated String")
}

// byteSeq parses a Byte Sequence and returns its base64 without the padding. A
// missing padding and non-zero pad bits are accepted, as RFC 9651 §4.2.7 asks; what no
// base64 decoder can read (a stray character, a lone final character, padding that does
// not complete a quantum) fails.
func (p *parser) byteSeq() (string, error) {
	p.i++
	start := p.i
	for p.i < len(p.s) && isBase64(p.s[p.i]) {
		p.i++
	}
	end := p.i
	for p.i < len(p.s) && p.s[p.i] == '=' && p.i-end < 2 {
		p.i++
	}
	if p.peek() != ':' {
		return "", p.fail("a Byte Sequence is base64 between colons")
	}
	n, pad := end-start, p.i-end
	if n%4 == 1 || pad > 0 && (n+pad)%4 != 0 {
		return "", p.fail("a Byte Sequence that is not base64")
	}
	p.i++
	return p.s[start:end], nil
}

func (p *parser) displayString() error {
	if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' {
		return p.fail(`a Display String starts with %"`)
	}
	p.i += 2
	var buf [64]byte
	b := buf[:0] // the decoded bytes, which must be UTF-8
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '%':
			if p.i+2 > len(p.s) || !isLCHex(p.s[p.i]) || !isLCHex(p.s[p.i+1]) {
				return p.fail("a Display String escapes with % and two lowercase hex digits")
			}
			v, _ := strconv.ParseUint(p.s[p.i:p.i+2], 16, 8)
			b = append(b, byte(v))
			p.i += 2
		case c == '"':
			if !utf8.Valid(b) {
				return p.fail("a Display String that is not UTF-8")
			}
			return nil
		case c < 0x20 || c > 0x7e:
			return p.fail("a Display String holds printable ASCII only")
		default:
			b = append(b, c)
		}
	}
	return p.fail("unterminated Display String")
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isLCHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' }
func isBase64(c byte) bool  { return isAlpha(c) || isDigit(c) || c == '+' || c == '/' }

// isTChar is RFC 9110's tchar.
func isTChar(c byte) bool {
	if isAlpha(c) || isDigit(c) {
		return true
	}
	switch c {
	case '!', '#', '$', '%', '&', '\'', '*', '+', '-', '.', '^', '_', '`', '|', '~':
		return true
	}
	return false
}
