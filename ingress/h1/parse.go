package h1

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
)

// head is a request head in the subset the fast path serves.
type head struct {
	method, target, host string
	url                  *url.URL
	header               http.Header
	// contentLength is the body's length: 0 without a Content-Length.
	contentLength int64
	// close: the request's Connection header holds "close".
	close bool
}

// headEnd looks for the end of a request head at the start of b: end is the length of
// the head with its closing empty line, 0 while b holds no end yet. bad: a line of b
// ends with a bare LF, which the fast path leaves to net/http, so that it need not
// wait for a CRLF that may never come.
func headEnd(b []byte) (end int, bad bool) {
	for i := 0; ; {
		j := bytes.IndexByte(b[i:], '\n')
		if j < 0 {
			return 0, false
		}
		i += j
		if i == 0 || b[i-1] != '\r' {
			return 0, true
		}
		if i >= 3 && b[i-2] == '\n' && b[i-3] == '\r' {
			return i + 1, false
		}
		i++
	}
}

// maxContentLength bounds the Content-Length the fast path takes (18 digits, far
// below the int64 limit net/http applies); a longer one goes to net/http.
const maxContentDigits = 18

// parseHead parses the head b (as headEnd found it, its closing CRLF CRLF included)
// if it lies in the fast path's subset of HTTP/1.1, and reports whether it does. The
// subset is a strict part of what net/http's server accepts with the same meaning
// (FuzzParseHead checks it against net/http itself):
//
//   - the request line is method SP target SP "HTTP/1.1", the method a token other
//     than CONNECT, HEAD and PRI, the target in origin form ("/" and visible ASCII
//     but '#');
//   - every line ends with CRLF; a field is a token, a colon at once, and a value of
//     visible ASCII, spaces and tabs (no other control byte, nothing above 0x7e); no
//     line starts with a space or tab (obs-fold);
//   - the target parses (url.ParseRequestURI, as net/http reads it);
//   - exactly one Host, of letters, digits and ".-:[]_" alone;
//   - at most one Content-Length, of 1 to 18 digits without a leading zero;
//   - no Transfer-Encoding, Upgrade, Expect, Trailer or Pragma (each of which net/http
//     gives a meaning of its own).
//
// Every string of the head is a slice of one string made of b; the header's names
// are canonical (textproto.CanonicalMIMEHeaderKey) and, as net/http's server has it,
// Host is not among them.
func parseHead(b []byte) (h head, ok bool) {
	if len(b) > readBuffer {
		return head{}, false
	}
	s := string(b[:len(b)-2]) // each line with its CRLF: the last is the empty one
	eol := indexCRLF(s)
	if eol < 0 {
		return head{}, false
	}
	if !parseRequestLine(s[:eol], &h) {
		return head{}, false
	}
	s = s[eol+2:]
	// Count the fields first: one allocation holds every value slice.
	n := bytes.Count(b, crlf) - 2
	if n < 1 { // no Host
		return head{}, false
	}
	h.header = make(http.Header, n)
	a := new(headValues)
	vals := a.vals[:]
	if n > len(vals) {
		vals = make([]string, n)
	}
	hosts, lengths := 0, 0
	var name [maxName]byte
	for len(s) > 0 {
		eol := indexCRLF(s)
		if eol < 0 { // a CR alone
			return head{}, false
		}
		line := s[:eol]
		s = s[eol+2:]
		colon := tokenEnd(line, ':')
		if colon < 1 || colon > maxName {
			return head{}, false
		}
		v := trimValue(line[colon+1:])
		if !validValue(v) {
			return head{}, false
		}
		k := canonical(name[:0], line[:colon])
		key, common := commonNames[string(k)]
		if !common {
			key = string(k)
		}
		switch key {
		case "Host":
			hosts++
			if hosts > 1 || !validHost(v) {
				return head{}, false
			}
			h.host = v
			continue
		case "Content-Length":
			lengths++
			cl, ok := parseLength(v)
			if lengths > 1 || !ok {
				return head{}, false
			}
			h.contentLength = cl
		case "Transfer-Encoding", "Upgrade", "Expect", "Trailer", "Pragma":
			return head{}, false
		case "Connection":
			if hasClose(v) {
				h.close = true
			}
		}
		if vv := h.header[key]; vv != nil {
			h.header[key] = append(vv, v)
		} else {
			// A name's first value takes one element of vals: no allocation of
			// its own.
			vals[0] = v
			h.header[key] = vals[:1:1]
			vals = vals[1:]
		}
	}
	if hosts != 1 {
		return head{}, false
	}
	h.url = &a.url
	if !setPlainTarget(h.url, h.target) {
		u, err := url.ParseRequestURI(h.target)
		if err != nil {
			return head{}, false // net/http's 400
		}
		h.url = u
	}
	return h, true
}

// headValues is a head's URL and the backing array of its header's values, allocated
// together: one allocation for both when the head has at most len(vals) fields and a
// plain target (setPlainTarget).
type headValues struct {
	url  url.URL
	vals [8]string
}

// setPlainTarget sets *u to what url.ParseRequestURI makes of target, a target as
// parseRequestLine takes it (a '/' first, visible ASCII but '#'), when its path, up
// to the first '?', holds only letters, digits and "-_.~$&+,/:;=@": bytes that a
// URL's path escaping leaves as they are, so that the path is Path as it is, and
// RawPath is empty. It reports whether target was such; any other is left to
// url.ParseRequestURI.
func setPlainTarget(u *url.URL, target string) bool {
	path, query, hasQuery := strings.Cut(target, "?")
	for i := 0; i < len(path); i++ {
		if !plainPath[path[i]] {
			return false
		}
	}
	// url.ParseRequestURI forces an empty query when the only '?' is the last byte.
	*u = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
	return true
}

// plainPath are the bytes of a path that setPlainTarget takes.
var plainPath = func() (t [256]bool) {
	for _, c := range []byte("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz-_.~$&+,/:;=@") {
		t[c] = true
	}
	return t
}()

var crlf = []byte("\r\n")

func indexCRLF(s string) int {
	for i := 0; i+1 < len(s); i++ {
		if s[i] == '\r' {
			if s[i+1] != '\n' {
				return -1
			}
			return i
		}
	}
	return -1
}

// tokenEnd returns the index of the first delim in s when every byte before it is a
// token character (a method, a field name), else -1.
func tokenEnd(s string, delim byte) int {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == delim {
			return i
		}
		if !isToken(c) {
			return -1
		}
	}
	return -1
}

// parseRequestLine parses line into h's method and target.
func parseRequestLine(line string, h *head) bool {
	const proto = " HTTP/1.1"
	if len(line) < len(proto) || line[len(line)-len(proto):] != proto {
		return false
	}
	line = line[:len(line)-len(proto)]
	sp := tokenEnd(line, ' ')
	if sp < 1 {
		return false
	}
	h.method, h.target = line[:sp], line[sp+1:]
	switch h.method {
	case "CONNECT", "HEAD", "PRI":
		return false
	}
	if len(h.target) == 0 || h.target[0] != '/' {
		return false
	}
	for i := 0; i < len(h.target); i++ {
		if c := h.target[i]; c <= ' ' || c >= 0x7f || c == '#' {
			return false
		}
	}
	return true
}

// maxName bounds a field name the fast path takes.
const maxName = 64

// canonical appends name, canonicalized as textproto.CanonicalMIMEHeaderKey does for
// a token, to dst.
func canonical(dst []byte, name string) []byte {
	upper := true
	for i := 0; i < len(name); i++ {
		c := name[i]
		if upper && 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		} else if !upper && 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
		upper = c == '-'
	}
	return dst
}

// commonNames interns the field names most requests carry, so that they cost no
// allocation of their own; it is read only.
var commonNames = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept", "Accept-Encoding", "Accept-Language", "Authorization", "Cache-Control",
		"Connection", "Content-Length", "Content-Type", "Cookie", "Host", "Idempotency-Key", "If-Match",
		"If-None-Match", "Keep-Alive", "Origin", "Prefer", "Referer", "Traceparent", "Tracestate", "User-Agent",
		"X-Api-Key", "X-Forwarded-For", "X-Forwarded-Proto", "X-Real-Ip", "X-Request-Id", "Forwarded",
		"Transfer-Encoding", "Upgrade", "Expect", "Trailer", "Pragma"} {
		m[k] = k
	}
	return m
}()

// tokenChars are the bytes of a token (RFC 9110 section 5.6.2).
const tokenChars = "!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

var tokenTable = func() (t [256]bool) {
	for i := 0; i < len(tokenChars); i++ {
		t[tokenChars[i]] = true
	}
	return t
}()

func isToken(c byte) bool { return tokenTable[c] }

// trimValue trims spaces and tabs around v, as textproto does.
func trimValue(v string) string {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// validValue: v holds visible ASCII, spaces and tabs alone.
func validValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < ' ' && c != '\t') || c >= 0x7f {
			return false
		}
	}
	return true
}

// validHost: v holds letters, digits and ".-:[]_" alone (a part of what net/http's
// server takes).
func validHost(v string) bool {
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c == '.', c == '-', c == ':', c == '[', c == ']', c == '_':
		default:
			return false
		}
	}
	return true
}

// parseLength parses a Content-Length of 1 to maxContentDigits digits without a
// leading zero (or "0").
func parseLength(v string) (int64, bool) {
	if len(v) == 0 || len(v) > maxContentDigits || (v[0] == '0' && len(v) > 1) {
		return 0, false
	}
	var n int64
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// hasClose reports whether the comma-separated list v holds the token "close", in
// any case.
func hasClose(v string) bool {
	for len(v) > 0 {
		tok := v
		if i := strings.IndexByte(v, ','); i >= 0 {
			tok, v = v[:i], v[i+1:]
		} else {
			v = ""
		}
		tok = trimValue(tok)
		if len(tok) == 5 && (tok[0]|0x20) == 'c' && (tok[1]|0x20) == 'l' && (tok[2]|0x20) == 'o' &&
			(tok[3]|0x20) == 's' && (tok[4]|0x20) == 'e' {
			return true
		}
	}
	return false
}
