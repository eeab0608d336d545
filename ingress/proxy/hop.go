package proxy

import (
	"net/http"
	"net/textproto"
	"strings"
)

// hopHeaders are the headers that describe one connection, not the message
// (RFC 9110 section 7.6.1), and never go through a proxy.
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	// HTTP/2's upgrade settings are for the connection that would switch (RFC 7540
	// section 3.2.1), whether Connection names them or not.
	"Http2-Settings": true,
}

// HopByHop reports whether header k (canonical) of a message whose Connection header
// is connection describes the connection rather than the message, so that it stays
// out of a forwarded message: a hop-by-hop header, or one that Connection names.
func HopByHop(k string, connection []string) bool {
	if hopHeaders[k] {
		return true
	}
	for _, v := range connection {
		for tok := range strings.SplitSeq(v, ",") {
			if canonicalIs(strings.TrimSpace(tok), k) {
				return true
			}
		}
	}
	return false
}

// canonicalIs reports whether textproto.CanonicalMIMEHeaderKey(name) is k. It
// allocates only when it is or nearly is (name differs from k in ASCII case alone):
// canonicalizing changes only the case of ASCII letters, so a name that differs from
// k otherwise cannot canonicalize to it.
func canonicalIs(name, k string) bool {
	if name == k {
		return textproto.CanonicalMIMEHeaderKey(k) == k
	}
	return len(name) == len(k) && strings.EqualFold(name, k) && textproto.CanonicalMIMEHeaderKey(name) == k
}

// HasToken reports whether a comma-separated list in header k of h holds token,
// compared without case.
func HasToken(h http.Header, k, token string) bool {
	for _, v := range h[k] {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), token) {
				return true
			}
		}
	}
	return false
}
