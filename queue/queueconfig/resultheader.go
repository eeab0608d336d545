package queueconfig

import (
	"fmt"
	"net/http"
	"net/textproto"
	"slices"
	"strings"
)

// DefaultResultHeaders are the downstream response headers a ticket's result keeps.
// Config.ResultHeaders adds to them; nothing else a downstream answers is stored.
var DefaultResultHeaders = []string{"Content-Type", "Content-Length", "Location", "Etag", "Retry-After"}

// CheckResultHeader reports why name cannot be listed in result_headers: it must be a
// header name, and never Set-Cookie (the ticket monitor serves the result to whoever
// holds the ticket; a session cookie must not be handed out with it).
func CheckResultHeader(name string) error {
	switch ck := textproto.CanonicalMIMEHeaderKey(name); {
	case !ValidHeaderName(name) || strings.ContainsAny(name, "()<>@,;\\\"/[]?={}"):
		return fmt.Errorf("%q is not a header name", name)
	case ck == "Set-Cookie" || ck == "Set-Cookie2":
		return fmt.Errorf("%s is never kept in results: the monitor shows results to whoever holds the ticket", ck)
	}
	return nil
}

// ResultHeader returns the headers of h a ticket's result keeps: DefaultResultHeaders
// and c.ResultHeaders, canonical names, other headers dropped.
func (c Config) ResultHeader(h http.Header) http.Header {
	var out http.Header
	for k, vs := range h {
		ck := textproto.CanonicalMIMEHeaderKey(k)
		if ck == "Set-Cookie" || ck == "Set-Cookie2" ||
			!slices.Contains(DefaultResultHeaders, ck) && !slices.ContainsFunc(c.ResultHeaders, func(n string) bool {
				return textproto.CanonicalMIMEHeaderKey(n) == ck
			}) {
			continue
		}
		if out == nil {
			out = make(http.Header)
		}
		out[ck] = append(out[ck], vs...)
	}
	return out
}

// ValidHeaderName reports whether k can be a stored header's name (drop_headers,
// result_headers): not empty, printable ASCII without spaces or colons.
func ValidHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c <= ' ' || c >= 0x7f || c == ':' {
			return false
		}
	}
	return true
}
