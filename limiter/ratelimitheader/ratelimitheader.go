// Package ratelimitheader writes and reads the RateLimit-Policy and RateLimit fields of
// draft-ietf-httpapi-ratelimit-headers-11: each a Structured Field list (RFC 9651, which
// RFC 8941 grew into) of items whose value is the policy's name as a String, with
// Integer parameters and an optional partition key:
//
//	RateLimit-Policy: "name";q=QUOTA;w=WINDOW_SECONDS[;pk=:BASE64:]
//	RateLimit:        "name";r=REMAINING;t=SECONDS_UNTIL_RESET[;pk=:BASE64:]
//
// The front door writes them (ingress) and the pacing client reads them (dispatcher/pace)
// with this one codec, so that what one side writes is what the other reads. The
// package needs only the standard library; it lives under limiter because both users
// build on limiter already, and limiter is the lowest layer of the module, so the
// arrows from both point down.
//
// The values are the fields' own: whole seconds, not Durations, so that reading what
// was written gives back exactly what was written.
package ratelimitheader

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
)

// ErrSyntax is the error of a field that is not a Structured Field list. Nothing of such
// a field is to be used (RFC 9651 §4.2: the whole field fails).
var ErrSyntax = errors.New("ratelimitheader: not a structured-field list")

// Policy is one item of RateLimit-Policy: a quota policy the server applies.
type Policy struct {
	Name         string // the policy's name: printable ASCII
	Quota        int64  // q: the units the policy grants per window
	Window       int64  // w: the window in seconds; 0 leaves w out
	PartitionKey []byte // pk: which partition of the policy the request fell in; nil leaves it out
}

// Status is one item of RateLimit: the state of a policy for the current request.
type Status struct {
	Name         string // the policy's name: printable ASCII
	Remaining    int64  // r: the units left
	Reset        int64  // t: seconds until the quota resets; NoReset leaves t out
	PartitionKey []byte // pk; nil leaves it out
}

// NoReset is the Reset of a Status without t: the quota then resets at the latest one
// window (the w of the policy of the same name) from now.
const NoReset = -1

// AppendPolicy appends the RateLimit-Policy field of policies, separated by ", ", to b.
// Negative and overlong values are clamped to what a Structured Field Integer carries
// (0 to 999,999,999,999,999), a negative Window leaves w out. It fails only for a name
// that a String cannot carry (a byte outside printable ASCII); b is then returned as it
// was.
func AppendPolicy(b []byte, policies ...Policy) ([]byte, error) {
	start := len(b)
	for i, p := range policies {
		nb, err := appendName(b, i, p.Name)
		if err != nil {
			return b[:start], err
		}
		b = nb
		b = appendInt(b, "q", p.Quota)
		if p.Window > 0 {
			b = appendInt(b, "w", p.Window)
		}
		b = appendBytes(b, p.PartitionKey)
	}
	return b, nil
}

// AppendRateLimit appends the RateLimit field of statuses, separated by ", ", to b, as
// AppendPolicy does; a negative Reset leaves t out.
func AppendRateLimit(b []byte, statuses ...Status) ([]byte, error) {
	start := len(b)
	for i, s := range statuses {
		nb, err := appendName(b, i, s.Name)
		if err != nil {
			return b[:start], err
		}
		b = appendStatus(nb, s.Remaining, s.Reset)
		b = appendBytes(b, s.PartitionKey)
	}
	return b, nil
}

// QuoteName returns name as the String that begins its items in either field, for
// AppendStatus. It fails, returning "", for a name that a String cannot carry, as
// AppendPolicy and AppendRateLimit do.
func QuoteName(name string) (string, error) {
	b, err := appendName(nil, 0, name)
	return string(b), err
}

// AppendStatus appends to b what AppendRateLimit appends for the one Status{Name:
// name, Remaining: remaining, Reset: reset}, given quoted, the name as QuoteName
// returns it: a server that writes the field of one policy on many responses checks
// and escapes its name once.
func AppendStatus(b []byte, quoted string, remaining, reset int64) []byte {
	return appendStatus(append(b, quoted...), remaining, reset)
}

// appendStatus appends the r and t parameters of an item of RateLimit.
func appendStatus(b []byte, remaining, reset int64) []byte {
	b = appendInt(b, "r", remaining)
	if reset >= 0 {
		b = appendInt(b, "t", reset)
	}
	return b
}

// FormatPolicy returns the RateLimit-Policy field of policies (see AppendPolicy).
func FormatPolicy(policies ...Policy) (string, error) {
	var buf [96]byte // one policy fits: the field costs one allocation
	b, err := AppendPolicy(buf[:0], policies...)
	return string(b), err
}

// FormatRateLimit returns the RateLimit field of statuses (see AppendRateLimit).
func FormatRateLimit(statuses ...Status) (string, error) {
	var buf [96]byte
	b, err := AppendRateLimit(buf[:0], statuses...)
	return string(b), err
}

// ParsePolicy reads a RateLimit-Policy field: its field lines joined with commas (as
// strings.Join(h.Values("RateLimit-Policy"), ", ")). It fails with ErrSyntax for a field
// that is not a Structured Field list, returning none of it. An item that is not a
// policy as the draft defines it is left out, as the draft says to ignore it: one whose
// value is not a String, without q, or whose q or w is not a non-negative Integer, or
// whose pk is not a Byte Sequence. Parameters the draft does not define are ignored; of
// a repeated parameter the last counts. A Policy without w has Window 0.
func ParsePolicy(field string) ([]Policy, error) {
	return parseItems(field, func(m *member) (Policy, bool) {
		q, ok := count(m, "q")
		if !ok || m.inner || m.val.kind != kindString {
			return Policy{}, false
		}
		w, okW := count(m, "w")
		if _, has := m.lookup("w"); has && !okW {
			return Policy{}, false
		}
		pk, ok := partitionKey(m)
		return Policy{Name: m.val.str, Quota: q, Window: w, PartitionKey: pk}, ok
	})
}

// ParseRateLimit reads a RateLimit field as ParsePolicy reads RateLimit-Policy: an item
// is left out when its value is not a String, it has no r, its r or t is not a
// non-negative Integer, or its pk is not a Byte Sequence. A Status without t has Reset
// NoReset.
func ParseRateLimit(field string) ([]Status, error) {
	return parseItems(field, func(m *member) (Status, bool) {
		r, ok := count(m, "r")
		if !ok || m.inner || m.val.kind != kindString {
			return Status{}, false
		}
		t := int64(NoReset)
		if _, has := m.lookup("t"); has {
			if t, ok = count(m, "t"); !ok {
				return Status{}, false
			}
		}
		pk, ok := partitionKey(m)
		return Status{Name: m.val.str, Remaining: r, Reset: t, PartitionKey: pk}, ok
	})
}

// parseItems parses field as a list and returns what item makes of its members, those
// it accepts (ok) in order; nothing when the field does not parse.
func parseItems[T any](field string, item func(*member) (T, bool)) ([]T, error) {
	var out []T
	err := parseList(field, func(m *member) error {
		if v, ok := item(m); ok {
			out = append(out, v)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// count returns the parameter key of m when it is a non-negative Integer.
func count(m *member, key string) (int64, bool) {
	v, ok := m.lookup(key)
	return v.num, ok && v.kind == kindInteger && v.num >= 0
}

// partitionKey returns the decoded pk of m (nil without one); ok is false when pk is
// not a Byte Sequence.
func partitionKey(m *member) (pk []byte, ok bool) {
	v, has := m.lookup("pk")
	if !has {
		return nil, true
	}
	if v.kind != kindBytes {
		return nil, false
	}
	pk, err := base64.RawStdEncoding.DecodeString(v.str)
	if err != nil { // the parser took only what decodes: cannot happen
		return nil, false
	}
	if pk == nil {
		pk = []byte{} // present and empty: not the nil of "no pk"
	}
	return pk, true
}

// appendName appends the name of item i of a list, after ", " when i > 0.
func appendName(b []byte, i int, name string) ([]byte, error) {
	if i > 0 {
		b = append(b, ", "...)
	}
	b = append(b, '"')
	for j := 0; j < len(name); j++ {
		c := name[j]
		if c < 0x20 || c > 0x7e {
			return nil, fmt.Errorf("ratelimitheader: policy name %q: byte %#x is not allowed in a structured-field string", name, c)
		}
		if c == '"' || c == '\\' {
			b = append(b, '\\')
		}
		b = append(b, c)
	}
	return append(b, '"'), nil
}

func appendInt(b []byte, key string, v int64) []byte {
	b = append(b, ';')
	b = append(b, key...)
	b = append(b, '=')
	return strconv.AppendInt(b, min(max(v, 0), maxInteger), 10)
}

// appendBytes appends ;pk=:BASE64: for a non-nil key.
func appendBytes(b []byte, pk []byte) []byte {
	if pk == nil {
		return b
	}
	b = append(b, ";pk=:"...)
	b = base64.StdEncoding.AppendEncode(b, pk)
	return append(b, ':')
}
