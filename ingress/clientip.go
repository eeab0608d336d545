package ingress

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// ClientIdentity finds the address of the client behind a request. The peer address of
// the connection is the client unless the peer is a trusted proxy; only then is the
// forwarding header those proxies write read (X-Forwarded-For by default, or
// Forwarded, RFC 7239: see WithForwardedHeader), right to left, and the first address
// that is not a trusted proxy is the client. The other header is never read: proxies
// that append to one pass a client's own copy of the other through untouched. A client
// that forges these headers from an untrusted address changes nothing.
type ClientIdentity struct {
	trusted  Prefixes
	v6Prefix int
	header   ForwardedHeader
}

// ForwardedHeader names the header in which trusted proxies record the addresses they
// forward for.
type ForwardedHeader int

const (
	// XForwardedFor is X-Forwarded-For, which nginx, HAProxy, AWS ALB, Envoy and
	// Traefik append to by default. The default.
	XForwardedFor ForwardedHeader = iota
	// Forwarded is RFC 7239's Forwarded (its for= parameters), for proxies configured
	// to append to it.
	Forwarded
)

// ParseForwardedHeader reads a ForwardedHeader as the flags write it:
// "x-forwarded-for" or "forwarded" (in any case).
func ParseForwardedHeader(s string) (ForwardedHeader, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "x-forwarded-for":
		return XForwardedFor, nil
	case "forwarded":
		return Forwarded, nil
	}
	return 0, fmt.Errorf("forwarded header %q: want x-forwarded-for or forwarded (the header the trusted proxies write)", s)
}

// String returns the name ParseForwardedHeader reads.
func (h ForwardedHeader) String() string {
	switch h {
	case XForwardedFor:
		return "x-forwarded-for"
	case Forwarded:
		return "forwarded"
	}
	return "ForwardedHeader(" + strconv.Itoa(int(h)) + ")"
}

// IdentityOption configures NewClientIdentity.
type IdentityOption func(*ClientIdentity)

// WithForwardedHeader says which header the trusted proxies write (default
// XForwardedFor): only it is read, and only it is kept as the chain of a proxied or
// parked request (see NewProxy); the other is ignored.
func WithForwardedHeader(h ForwardedHeader) IdentityOption {
	return func(c *ClientIdentity) { c.header = h }
}

// NewClientIdentity trusts the proxies in trusted (CIDRs or single addresses) and
// groups IPv6 clients by their first v6PrefixBits bits (64 when 0; 128 to not group).
func NewClientIdentity(trusted []string, v6PrefixBits int, opts ...IdentityOption) (*ClientIdentity, error) {
	c := &ClientIdentity{v6Prefix: v6PrefixBits}
	for _, o := range opts {
		o(c)
	}
	if c.header != XForwardedFor && c.header != Forwarded {
		return nil, fmt.Errorf("forwarded header %v: want XForwardedFor or Forwarded", c.header)
	}
	if c.v6Prefix == 0 {
		c.v6Prefix = 64
	}
	if c.v6Prefix < 1 || c.v6Prefix > 128 {
		return nil, fmt.Errorf("ipv6 prefix length %d: want 1 to 128", v6PrefixBits)
	}
	var err error
	if c.trusted, err = ParsePrefixes(trusted); err != nil {
		return nil, fmt.Errorf("trusted proxy %w", err)
	}
	return c, nil
}

// Prefixes is a set of address ranges: trusted proxies, load balancers.
type Prefixes []netip.Prefix

// ParsePrefixes reads CIDRs or single addresses (blank entries skipped).
func ParsePrefixes(list []string) (Prefixes, error) {
	var ps Prefixes
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%q: not a CIDR or an address", s)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		ps = append(ps, p.Masked())
	}
	return ps, nil
}

// Contains reports whether a (IPv4-mapped or not) is in one of the ranges.
func (ps Prefixes) Contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

func (c *ClientIdentity) isTrusted(a netip.Addr) bool { return c.trusted.Contains(a) }

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
	hops := c.hops(r.Header)
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

// hops lists the client addresses the trusted proxies recorded in the configured
// header, leftmost (farthest) first.
func (c *ClientIdentity) hops(h http.Header) []hop {
	var hops []hop
	if c.header == Forwarded {
		for _, v := range h.Values("Forwarded") {
			for element := range strings.SplitSeq(v, ",") {
				hops = append(hops, forwardedFor(element))
			}
		}
		return hops
	}
	for _, v := range h.Values("X-Forwarded-For") {
		for s := range strings.SplitSeq(v, ",") {
			a, err := parseNode(strings.TrimSpace(s))
			hops = append(hops, hop{a, err == nil})
		}
	}
	return hops
}

// chain is the X-Forwarded-For chain a trusted peer sent, in the configured header:
// X-Forwarded-For's values as they are, or Forwarded's for= addresses, "unknown" for
// a hop that names none (unknown, an obfuscated name, no for=), so that whoever reads
// the chain stops there as this package does.
func (c *ClientIdentity) chain(h http.Header) []string {
	if c.header != Forwarded {
		return h["X-Forwarded-For"]
	}
	hops := c.hops(h)
	if len(hops) == 0 {
		return nil
	}
	out := make([]string, len(hops))
	for i, hp := range hops {
		out[i] = "unknown"
		if hp.ok {
			out[i] = hp.addr.String()
		}
	}
	return []string{strings.Join(out, ", ")}
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
