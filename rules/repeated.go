package rules

import (
	"errors"
	"net/http"
	"strings"
)

// ErrRepeatedValue is what Route.Repeated reports: a header or query parameter that a
// descriptor takes its value from carries more than one value.
var ErrRepeatedValue = errors.New("more than one value")

// RepeatedError names the source that gave more than one value.
type RepeatedError struct {
	// Source is the descriptor source as the rules file writes it: `header:X-User-ID`
	// or `query:user`.
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

// Repeated returns a *RepeatedError when a header or query parameter that one of rt's
// descriptor lists takes a value from gives r more than one value, nil otherwise:
//
//   - a header sent on more than one field line, whatever the values (an empty first
//     line included);
//   - a header whose one value holds a comma, the separator of a list (RFC 9110
//     section 5.3), which is also how a proxy that merges repeated field lines reports
//     them (Envoy's ext_authz writes a header sent twice as "a,b"); except the headers
//     whose single value has commas by its own syntax (commaHeaders: User-Agent,
//     Authorization, Cookie, the HTTP-dates…), for which only several field lines count;
//   - a query parameter present more than once (`?user=a&user=b`, `?user=&user=b`),
//     names compared after URL-decoding as Match does.
//
// Match reads the first value only, while the upstream may read another one (the last,
// or all of them joined): a client sending a random value and then the victim's would
// be counted on a fresh key every time while the upstream serves the victim. The
// front door therefore refuses such a request (400) instead of choosing a value.
// Repeated allocates only for a request it refuses, or to decode a query parameter
// name holding % or +.
func (rt *Route) Repeated(r *http.Request) error {
	for _, list := range rt.Descriptors {
		for i := range list {
			if err := repeatedSource(&list[i], r); err != nil {
				return err
			}
		}
	}
	return nil
}

func repeatedSource(e *RouteEntry, r *http.Request) error {
	switch e.From {
	case FromHeader:
		if e.Name == "Host" { // net/http refuses a second Host; r.Host is one value
			return nil
		}
		vs := r.Header[e.Name]
		switch {
		case len(vs) > 1:
			return &RepeatedError{Source: e.source()}
		case len(vs) == 1 && !commaHeaders[e.Name] && strings.IndexByte(vs[0], ',') >= 0:
			return &RepeatedError{Source: e.source(), Comma: true}
		}
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
