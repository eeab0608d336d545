package dispatcher

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"syscall"
	"time"
)

// Resolver looks host names up; *net.Resolver (net.DefaultResolver) is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// WithCallbackResolver sets how the names of callback hosts are looked up (default
// net.DefaultResolver). The addresses it gives are checked as any other (see
// ErrCallbackAddress).
func WithCallbackResolver(r Resolver) Option { return func(o *options) { o.callbackResolver = r } }

// ErrCallbackAddress is the error of a callback attempt whose host name resolved only
// to addresses its queue may not reach: loopback, link-local, private, shared (CGNAT),
// multicast, unspecified, reserved or documentation ranges, in any form (IPv4-mapped,
// or embedded in a NAT64 or 6to4 address), unless the queue sets CallbackPrivate. A
// host listed as an IP literal in callback_hosts is reached whatever it is.
var ErrCallbackAddress = errors.New("dispatcher: callback address refused")

// specialRanges are refused beside what netip.Addr's own predicates tell (loopback,
// private, link-local, multicast, unspecified).
var specialRanges = func() []netip.Prefix {
	var ps []netip.Prefix
	for _, s := range []string{
		"0.0.0.0/8",       // "this network"
		"100.64.0.0/10",   // shared address space (CGNAT)
		"192.0.0.0/24",    // IETF protocol assignments
		"192.0.2.0/24",    // documentation
		"198.18.0.0/15",   // benchmarking
		"198.51.100.0/24", // documentation
		"203.0.113.0/24",  // documentation
		"240.0.0.0/4",     // reserved, and the broadcast address
		"::/96",           // IPv4-compatible (deprecated)
		"100::/64",        // discard-only
		"2001::/32",       // Teredo: the IPv4 address inside is obfuscated
		"2001:db8::/32",   // documentation
		"fec0::/10",       // site-local (deprecated)
	} {
		ps = append(ps, netip.MustParsePrefix(s))
	}
	return ps
}()

// embedsIPv4 are the IPv6 ranges that carry an IPv4 address a translator or relay
// reaches: NAT64 (the last 32 bits) and 6to4 (bits 16 to 48).
var (
	nat64      = []netip.Prefix{netip.MustParsePrefix("64:ff9b::/96"), netip.MustParsePrefix("64:ff9b:1::/48")}
	sixToFour  = netip.MustParsePrefix("2002::/16")
	errSpecial = "is a loopback, link-local, private, shared, multicast or reserved address"
)

// checkCallbackAddr returns an error wrapping ErrCallbackAddress when a callback may
// not reach ip without CallbackPrivate.
func checkCallbackAddr(ip netip.Addr) error {
	ip = ip.Unmap().WithZone("")
	if special(ip) {
		return fmt.Errorf("%w: %s %s", ErrCallbackAddress, ip, errSpecial)
	}
	if ip.Is6() {
		b := ip.As16()
		var v4 netip.Addr
		switch {
		case nat64[0].Contains(ip) || nat64[1].Contains(ip):
			v4 = netip.AddrFrom4([4]byte(b[12:16]))
		case sixToFour.Contains(ip):
			v4 = netip.AddrFrom4([4]byte(b[2:6]))
		}
		if v4.IsValid() && special(v4) {
			return fmt.Errorf("%w: %s carries %s, which %s", ErrCallbackAddress, ip, v4, errSpecial)
		}
	}
	return nil
}

func special(ip netip.Addr) bool {
	if !ip.IsValid() || ip.IsUnspecified() || ip.IsLoopback() || ip.IsPrivate() || ip.IsLinkLocalUnicast() ||
		ip.IsLinkLocalMulticast() || ip.IsInterfaceLocalMulticast() || ip.IsMulticast() {
		return true
	}
	for _, p := range specialRanges {
		if p.Contains(ip) {
			return true
		}
	}
	return false
}

// callbackDialer dials callback receivers. A host name is resolved here, not by the
// standard dialer, and each of its addresses checked before it is dialled; the socket's
// Control hook checks the address actually connected to again, so what is checked is
// what is dialled (a name that answers a public address to one lookup and a private
// one to the next gains nothing). An IP literal is dialled as it is: the queue listed
// it (queueconfig.Config.CheckCallback matched the URL's host[:port]).
type callbackDialer struct {
	resolver Resolver
	private  bool // CallbackPrivate: any address
	dialer   net.Dialer
}

func newCallbackDialer(r Resolver, private bool) *callbackDialer {
	cd := &callbackDialer{resolver: r, private: private, dialer: net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}}
	if !private {
		cd.dialer.Control = controlCallbackAddr
	}
	return cd
}

// controlCallbackAddr is the dialer's Control hook: address is the IP and port being
// connected to.
func controlCallbackAddr(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("%w: cannot tell the address %q", ErrCallbackAddress, address)
	}
	return checkCallbackAddr(ap.Addr())
}

func (cd *callbackDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	if _, err := netip.ParseAddr(host); err == nil {
		plain := cd.dialer
		plain.Control = nil
		return plain.DialContext(ctx, network, addr)
	}
	pn, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return nil, fmt.Errorf("dispatcher: callback port %q: %w", port, err)
	}
	ips, err := cd.resolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return nil, err
	}
	if len(ips) == 0 {
		return nil, &net.DNSError{Err: "no addresses", Name: host, IsNotFound: true}
	}
	var first error
	for _, ip := range ips {
		if !cd.private {
			if err := checkCallbackAddr(ip); err != nil {
				first = cmp.Or(first, fmt.Errorf("%s resolves to a refused address: %w", host, err))
				continue
			}
		}
		conn, err := cd.dialer.DialContext(ctx, network, netip.AddrPortFrom(ip.Unmap(), uint16(pn)).String())
		if err == nil {
			return conn, nil
		}
		first = cmp.Or(first, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, first
}

// newCallbackClient is the client that sends callbacks through cd: no proxy from the
// environment (the address dialled would be the proxy's), no redirects (a 3xx is the
// answer, a failure).
func newCallbackClient(cd *callbackDialer) *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.Proxy = nil
	tr.DialContext = cd.DialContext
	tr.MaxIdleConnsPerHost = 8
	tr.IdleConnTimeout = 90 * time.Second
	return &http.Client{
		Transport:     tr,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
