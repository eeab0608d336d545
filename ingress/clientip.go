package ingress

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// ClientIdentity finds the address of the client behind a request. The peer address of
// the connection is the client unless the peer is a trusted proxy; only then are
// Forwarded (RFC 7239) or, when that is absent, X-Forwarded-For read, right to left,
// and the first address that is not a trusted proxy is the client. A client that forges
// these headers from an untrusted address changes nothing.
type ClientIdentity struct {
	trusted  []netip.Prefix
	v6Prefix int
}

// NewClientIdentity trusts the proxies in trusted (CIDRs or single addresses) and
// groups IPv6 clients by their first v6PrefixBits bits (64 when 0; 128 to not group).
func NewClientIdentity(trusted []string, v6PrefixBits int) (*ClientIdentity, error) {
	c := &ClientIdentity{v6Prefix: v6PrefixBits}
	if c.v6Prefix == 0 {
		c.v6Prefix = 64
	}
	if c.v6Prefix < 1 || c.v6Prefix > 128 {
		return nil, fmt.Errorf("ipv6 prefix length %d: want 1 to 128", v6PrefixBits)
	}
	for _, s := range trusted {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("trusted proxy %q: not a CIDR or an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		c.trusted = append(c.trusted, p.Masked())
	}
	return c, nil
}

func (c *ClientIdentity) isTrusted(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range c.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// peerTrusted reports whether r comes straight from a trusted proxy.
func (c *ClientIdentity) peerTrusted(r *http.Request) bool {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	return err == nil && c.isTrusted(peer.Addr())
}

// Addr returns the client's address, or the zero Addr when the peer address cannot be
// read (which only happens for requests not served by net/http).
func (c *ClientIdentity) Addr(r *http.Request) netip.Addr {
	peer, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	client := peer.Addr().Unmap()
	if !c.isTrusted(client) {
		return client
	}
	hops := forwardedHops(r.Header)
	for i := len(hops) - 1; i >= 0; i-- {
		a, ok := hops[i].addr, hops[i].ok
		if !ok {
			// "unknown" or an obfuscated name: the last proxy we trust is as far as
			// we can see.
			return client
		}
		client = a
		if !c.isTrusted(a) {
			return a
		}
	}
	return client
}

// Group returns the address that limits are kept for: IPv4 addresses as they are,
// IPv6 addresses masked to the configured prefix, so one host cannot escape its limit
// by hopping through its /64.
func (c *ClientIdentity) Group(a netip.Addr) netip.Prefix {
	if a.Is4() {
		return netip.PrefixFrom(a, 32)
	}
	p, _ := a.Prefix(c.v6Prefix)
	return p
}

type hop struct {
	addr netip.Addr
	ok   bool
}

// forwardedHops lists the client addresses proxies recorded, leftmost (farthest) first.
func forwardedHops(h http.Header) []hop {
	if values := h.Values("Forwarded"); len(values) > 0 {
		var hops []hop
		for _, v := range values {
			for element := range strings.SplitSeq(v, ",") {
				hops = append(hops, forwardedFor(element))
			}
		}
		return hops
	}
	var hops []hop
	for _, v := range h.Values("X-Forwarded-For") {
		for s := range strings.SplitSeq(v, ",") {
			a, err := parseNode(strings.TrimSpace(s))
			hops = append(hops, hop{a, err == nil})
		}
	}
	return hops
}

// forwardedFor reads the for= parameter of one Forwarded element. Commas inside
// quoted strings cannot hold addresses, so splitting elements on commas is safe for
// what is read here.
func forwardedFor(element string) hop {
	for pair := range strings.SplitSeq(element, ";") {
		name, value, found := strings.Cut(strings.TrimSpace(pair), "=")
		if !found || !strings.EqualFold(name, "for") {
			continue
		}
		value = strings.TrimSpace(value)
		if len(value) >= 2 && value[0] == '"' && value[len(value)-1] == '"' {
			value = strings.ReplaceAll(value[1:len(value)-1], `\`, "")
		}
		a, err := parseNode(value)
		return hop{a, err == nil}
	}
	return hop{}
}

// parseNode parses an address with an optional port: 192.0.2.1, 192.0.2.1:80,
// 2001:db8::1, [2001:db8::1], [2001:db8::1]:80.
func parseNode(s string) (netip.Addr, error) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), nil
	}
	if strings.HasPrefix(s, "[") && strings.HasSuffix(s, "]") {
		a, err := netip.ParseAddr(s[1 : len(s)-1])
		return a.Unmap(), err
	}
	host, _, err := net.SplitHostPort(s)
	if err != nil {
		return netip.Addr{}, err
	}
	a, err := netip.ParseAddr(host)
	return a.Unmap(), err
}
