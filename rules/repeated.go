package rules

import (
	"errors"
	"net/http"
	"slices"
	"strings"
)

// ErrRepeatedValue is what Set.Repeated reports: a header or query parameter that
// chooses a route or a rate-limit key carries more than one value.
var ErrRepeatedValue = errors.New("more than one value")

// RepeatedError names the source that gave more than one value.
type RepeatedError struct {
	// Source is the source as the rules file writes it, the header name in canonical
	// form: `header:X-User-Id` or `query:user`.
	Source string
	// Comma reports a header whose one field line holds a comma, rather than several
	// field lines.
	Comma bool
}

func (e *RepeatedError) Error() string {
	if e.Comma {
		return e.Source + ": " + ErrRepeatedValue.Error() + " (a comma-separated list)"
	}
	return e.Source + ": " + ErrRepeatedValue.Error() + " (sent more than once)"
}

func (e *RepeatedError) Unwrap() error { return ErrRepeatedValue }

// Repeated returns a *RepeatedError when r gives more than one value for a header or
// query parameter that decides how it is limited, nil otherwise. Those are the ones
// that a descriptor list of rt (the route Match chose; nil for none) takes a value
// from, and the headers that any route's match compares with a value (`headers:
// [{name: X-Plan, value: free}]`: they choose the route, so they count whether or not a
// route matched). More than one value is:
//
//   - a header sent on more than one field line, whatever the values (an empty first
//     line included);
//   - a header whose one value holds a comma, the separator of a list (RFC 9110
//     section 5.3), which is also how a proxy that merges repeated field lines reports
//     them (Envoy's ext_authz writes a header sent twice as "a,b"); except the headers
//     whose single value has commas by its own syntax (commaHeaders: User-Agent,
//     Authorization, Cookie, the HTTP-dates…) and a match header that some route
//     compares with a value holding a comma, for which only several field lines count;
//   - a query parameter present more than once (`?user=a&user=b`, `?user=&user=b`),
//     names compared after URL-decoding as Match does.
//
// Match reads the first value only, while the upstream may read another one (the last,
// or all of them joined): a client sending a random value and then the victim's would
// be counted on a fresh key every time while the upstream serves the victim, and a
// client sending a plan it does not have and then its own would take another route's
// limits. The front door therefore refuses such a request (400) instead of choosing a
// value. Repeated allocates only for a request it refuses, or to decode a query
// parameter name holding % or +.
func (s *Set) Repeated(r *http.Request, rt *Route) error {
	for i := range s.choosing {
		h := &s.choosing[i]
		if err := repeatedHeader(r, h.name, h.commas); err != nil {
			return err
		}
	}
	if rt == nil {
		return nil
	}
	for _, list := range rt.Descriptors {
		for i := range list {
			if err := repeatedSource(&list[i], r); err != nil {
				return err
			}
		}
	}
	return nil
}

// choosingHeader is a header that some route's match compares with a value; commas
// reports that one of those values holds a comma.
type choosingHeader struct {
	name   string
	commas bool
}

// choosingHeaders lists, in the order of first use, the headers routes' matches
// compare with a value (not Host: one value in net/http).
func choosingHeaders(routes []*Route) []choosingHeader {
	var out []choosingHeader
	for _, rt := range routes {
		for _, h := range rt.headers {
			if h.host || h.Present != nil {
				continue
			}
			i := slices.IndexFunc(out, func(c choosingHeader) bool { return c.name == h.Name })
			if i < 0 {
				out = append(out, choosingHeader{name: h.Name})
				i = len(out) - 1
			}
			out[i].commas = out[i].commas || strings.IndexByte(h.Value, ',') >= 0
		}
	}
	return out
}

// repeatedHeader reports header name of r when it has more than one value (see
// Repeated); commas says a comma in one value is no list.
func repeatedHeader(r *http.Request, name string, commas bool) error {
	vs := r.Header[name]
	switch {
	case len(vs) > 1:
		return &RepeatedError{Source: "header:" + name}
	case len(vs) == 1 && !commas && strings.IndexByte(vs[0], ',') >= 0 && !commaHeaders[name]:
		return &RepeatedError{Source: "header:" + name, Comma: true}
	}
	return nil
}

func repeatedSource(e *RouteEntry, r *http.Request) error {
	switch e.From {
	case FromHeader:
		if e.Name == "Host" { // net/http refuses a second Host; r.Host is one value
			return nil
		}
		return repeatedHeader(r, e.Name, false)
	case FromQuery:
		if r.URL != nil && queryCount(r.URL.RawQuery, e.Name) > 1 {
			return &RepeatedError{Source: e.source()}
		}
	}
	return nil
}

// commaHeaders are the request headers (canonical names) whose single value may hold
// commas by its syntax, so a comma there is no list.
var commaHeaders = map[string]bool{
	"User-Agent":          true, // comments: (KHTML, like Gecko)
	"Authorization":       true, // auth-params: Digest realm="a", nonce="b"
	"Proxy-Authorization": true,
	"Cookie":              true, // one field line by RFC 6265; values may hold commas
	"Date":                true, // HTTP-date: Sun, 06 Nov 1994 08:49:37 GMT
	"If-Modified-Since":   true,
	"If-Unmodified-Since": true,
	"If-Range":            true,
}

// queryCount counts the occurrences of parameter name in raw, empty values included,
// as queryValue finds them. It stops at 2.
func queryCount(raw, name string) int {
	n := 0
	for ; n < 2; n++ {
		var found bool
		if _, raw, found = nextParam(raw, name); !found {
			break
		}
	}
	return n
}
