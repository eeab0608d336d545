package pace

import (
	"errors"
	"strconv"
)

// A reader of Structured Field lists (RFC 9651, which RFC 8941 grew into), enough to
// read the RateLimit and RateLimit-Policy fields of draft-ietf-httpapi-ratelimit-headers:
// the whole list grammar is checked (a field that does not parse is ignored whole, as
// the RFC requires), but only what those fields use is kept — each member's bare item
// if it is a String, and its Integer parameters.

// sfMember is one member of a list.
type sfMember struct {
	name   string // the bare item, when it is a String
	isName bool
	params []sfParam
}

// sfParam is one parameter; val is set only for Integer values.
type sfParam struct {
	key   string
	val   int64
	isInt bool
}

// param returns the Integer parameter key (the last one of that name, as the RFC says
// a duplicate key overrides). ok is false when it is missing or not an Integer.
func (m sfMember) param(key string) (int64, bool) {
	for i := len(m.params) - 1; i >= 0; i-- {
		if m.params[i].key == key {
			return m.params[i].val, m.params[i].isInt
		}
	}
	return 0, false
}

var errSF = errors.New("pace: malformed structured field")

type sfParser struct {
	s string
	i int
}

func (p *sfParser) peek() byte {
	if p.i < len(p.s) {
		return p.s[p.i]
	}
	return 0
}

func (p *sfParser) skipSP() {
	for p.i < len(p.s) && p.s[p.i] == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

// parseSFList parses a List field value (field lines already joined with ", ").
func parseSFList(s string) ([]sfMember, error) {
	p := &sfParser{s: s}
	p.skipSP()
	// Trailing SP is stripped too (RFC 9651 §4.2).
	for len(p.s) > p.i && p.s[len(p.s)-1] == ' ' {
		p.s = p.s[:len(p.s)-1]
	}
	var out []sfMember
	for p.i < len(p.s) {
		m, err := p.member()
		if err != nil {
			return nil, err
		}
		out = append(out, m)
		p.skipOWS()
		if p.i == len(p.s) {
			return out, nil
		}
		if p.s[p.i] != ',' {
			return nil, errSF
		}
		p.i++
		p.skipOWS()
		if p.i == len(p.s) {
			return nil, errSF // trailing comma
		}
	}
	return out, nil
}

func (p *sfParser) member() (sfMember, error) {
	var m sfMember
	if p.peek() == '(' { // an inner list: checked, not kept
		p.i++
		for {
			p.skipSP()
			if p.peek() == ')' {
				p.i++
				break
			}
			if _, _, err := p.bareItem(); err != nil {
				return m, err
			}
			if _, err := p.parameters(); err != nil {
				return m, err
			}
			if c := p.peek(); c != ' ' && c != ')' {
				return m, errSF
			}
		}
	} else {
		name, isName, err := p.bareItem()
		if err != nil {
			return m, err
		}
		m.name, m.isName = name, isName
	}
	params, err := p.parameters()
	m.params = params
	return m, err
}

func (p *sfParser) parameters() ([]sfParam, error) {
	var out []sfParam
	for p.peek() == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		prm := sfParam{key: key}
		if p.peek() == '=' {
			p.i++
			if c := p.peek(); c == '-' || isDigit(c) {
				n, isInt, err := p.number()
				if err != nil {
					return nil, err
				}
				prm.val, prm.isInt = n, isInt
			} else if _, _, err := p.bareItem(); err != nil {
				return nil, err
			}
		}
		out = append(out, prm)
	}
	return out, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if c := p.peek(); !isLCAlpha(c) && c != '*' {
		return "", errSF
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

// bareItem parses any bare item; it returns the value of a String.
func (p *sfParser) bareItem() (string, bool, error) {
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		_, _, err := p.number()
		return "", false, err
	case c == '"':
		s, err := p.str()
		return s, err == nil, err
	case c == '*' || isAlpha(c):
		p.token()
		return "", false, nil
	case c == ':':
		return "", false, p.byteSeq()
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return "", false, nil
		}
		return "", false, errSF
	case c == '@': // a Date: an Integer of seconds
		p.i++
		_, isInt, err := p.number()
		if err == nil && !isInt {
			err = errSF
		}
		return "", false, err
	case c == '%':
		return "", false, p.displayString()
	}
	return "", false, errSF
}

// number parses an Integer (isInt) or a Decimal (value not kept).
func (p *sfParser) number() (int64, bool, error) {
	neg := p.peek() == '-'
	if neg {
		p.i++
	}
	start := p.i
	dot := -1
	for p.i < len(p.s) {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			if p.i-start > 12 {
				return 0, false, errSF
			}
			dot = p.i
		} else if !isDigit(c) {
			break
		}
		p.i++
		if dot < 0 && p.i-start > 15 || dot >= 0 && p.i-start > 16 {
			return 0, false, errSF
		}
	}
	digits := p.s[start:p.i]
	if digits == "" || !isDigit(digits[0]) {
		return 0, false, errSF
	}
	if dot >= 0 {
		if frac := p.i - dot - 1; frac < 1 || frac > 3 {
			return 0, false, errSF
		}
		return 0, false, nil
	}
	n, err := strconv.ParseInt(digits, 10, 64)
	if err != nil { // at most 15 digits: cannot happen
		return 0, false, errSF
	}
	if neg {
		n = -n
	}
	return n, true, nil
}

func (p *sfParser) str() (string, error) {
	p.i++ // the opening quote
	var b []byte
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.i == len(p.s) || p.s[p.i] != '"' && p.s[p.i] != '\\' {
				return "", errSF
			}
			b = append(b, p.s[p.i])
			p.i++
		case c == '"':
			return string(b), nil
		case c < 0x20 || c > 0x7e:
			return "", errSF
		default:
			b = append(b, c)
		}
	}
	return "", errSF // no closing quote
}

func (p *sfParser) token() {
	p.i++ // the first character is checked by the caller
	for p.i < len(p.s) && (isTChar(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
}

func (p *sfParser) byteSeq() error {
	p.i++
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		if c == ':' {
			return nil
		}
		if !isAlpha(c) && !isDigit(c) && c != '+' && c != '/' && c != '=' {
			return errSF
		}
	}
	return errSF
}

func (p *sfParser) displayString() error {
	if p.i+1 >= len(p.s) || p.s[p.i+1] != '"' {
		return errSF
	}
	p.i += 2
	for p.i < len(p.s) {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '%':
			if p.i+2 > len(p.s) || !isLCHex(p.s[p.i]) || !isLCHex(p.s[p.i+1]) {
				return errSF
			}
			p.i += 2
		case c == '"':
			return nil
		case c < 0x20 || c > 0x7e:
			return errSF
		}
	}
	return errSF
}

func isDigit(c byte) bool   { return '0' <= c && c <= '9' }
func isLCAlpha(c byte) bool { return 'a' <= c && c <= 'z' }
func isAlpha(c byte) bool   { return isLCAlpha(c) || 'A' <= c && c <= 'Z' }
func isLCHex(c byte) bool   { return isDigit(c) || 'a' <= c && c <= 'f' }

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
