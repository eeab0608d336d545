package ingress

import (
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
)

func TestClientIdentity(t *testing.T) {
	trusted := []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.7"}
	ids := map[ForwardedHeader]*ClientIdentity{}
	for _, h := range []ForwardedHeader{XForwardedFor, Forwarded} {
		id, err := NewClientIdentity(trusted, 0, WithForwardedHeader(h))
		if err != nil {
			t.Fatal(err)
		}
		ids[h] = id
	}
	// Both headers, for the cases that check one is read and the other ignored.
	both := map[string][]string{"X-Forwarded-For": {"1.2.3.4"}, "Forwarded": {"for=5.6.7.8"}}
	cases := []struct {
		name    string
		header  ForwardedHeader
		peer    string
		headers map[string][]string
		want    string
	}{
		{"no proxy", XForwardedFor, "198.51.100.1:5000", nil, "198.51.100.1"},
		{"forged X-Forwarded-For from an untrusted peer", XForwardedFor, "198.51.100.1:5000",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4"}}, "198.51.100.1"},
		{"forged Forwarded from an untrusted peer", XForwardedFor, "198.51.100.1:5000",
			map[string][]string{"Forwarded": {"for=1.2.3.4"}}, "198.51.100.1"},
		{"untrusted peer, both headers, X-Forwarded-For read", XForwardedFor, "198.51.100.1:5000", both, "198.51.100.1"},
		{"untrusted peer, both headers, Forwarded read", Forwarded, "198.51.100.1:5000", both, "198.51.100.1"},
		{"trusted proxy, X-Forwarded-For", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"203.0.113.9"}}, "203.0.113.9"},
		{"forged leftmost entry is skipped: rightmost untrusted wins", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4, 203.0.113.9, 10.9.9.9"}}, "203.0.113.9"},
		{"several header lines read in order", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"1.2.3.4", "203.0.113.9", "192.0.2.7"}}, "203.0.113.9"},
		// nginx, HAProxy, AWS ALB, Envoy and Traefik append to X-Forwarded-For and pass
		// a client's own Forwarded through: believing it would let the client pick
		// its address.
		{"a client's Forwarded through a proxy that writes X-Forwarded-For", XForwardedFor, "10.1.2.3:5000",
			both, "1.2.3.4"},
		{"a client's X-Forwarded-For through a proxy that writes Forwarded", Forwarded, "10.1.2.3:5000",
			both, "5.6.7.8"},
		{"Forwarded alone, X-Forwarded-For read: the proxy", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"Forwarded": {"for=203.0.113.5"}}, "10.1.2.3"},
		{"X-Forwarded-For alone, Forwarded read: the proxy", Forwarded, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"203.0.113.5"}}, "10.1.2.3"},
		{"Forwarded with proto", Forwarded, "10.1.2.3:5000",
			map[string][]string{"Forwarded": {"for=203.0.113.5;proto=https"}}, "203.0.113.5"},
		{"Forwarded with quoted IPv6 and port", Forwarded, "10.1.2.3:5000",
			map[string][]string{"Forwarded": {`for=198.51.100.17, For="[2001:db8:cafe::17]:4711"`}}, "2001:db8:cafe::17"},
		{"Forwarded with several elements and a trusted hop", Forwarded, "[2001:db8:ffff::1]:443",
			map[string][]string{"Forwarded": {`for=192.0.2.60;proto=http;by=203.0.113.43, for="[2001:db8:ffff::9]"`}}, "192.0.2.60"},
		{"unknown hop stops at the last trusted proxy", Forwarded, "10.1.2.3:5000",
			map[string][]string{"Forwarded": {"for=203.0.113.1, for=unknown, for=10.0.0.2"}}, "10.0.0.2"},
		{"obfuscated hop stops too", Forwarded, "10.1.2.3:5000",
			map[string][]string{"Forwarded": {"for=_hidden"}}, "10.1.2.3"},
		{"all hops trusted: the farthest", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"10.5.5.5, 10.6.6.6"}}, "10.5.5.5"},
		{"garbage in X-Forwarded-For", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"not-an-ip"}}, "10.1.2.3"},
		{"IPv4-mapped peer", XForwardedFor, "[::ffff:198.51.100.1]:5000", nil, "198.51.100.1"},
		{"X-Forwarded-For with a port", XForwardedFor, "10.1.2.3:5000",
			map[string][]string{"X-Forwarded-For": {"203.0.113.9:1234"}}, "203.0.113.9"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = tc.peer
			for k, vs := range tc.headers {
				for _, v := range vs {
					r.Header.Add(k, v)
				}
			}
			if got := ids[tc.header].Addr(r); got != netip.MustParseAddr(tc.want) {
				t.Fatalf("got %v, want %s", got, tc.want)
			}
		})
	}
}

// TestForwardedHeaderNames: the names the flags take, and nothing else.
func TestForwardedHeaderNames(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want ForwardedHeader
		ok   bool
	}{
		{"x-forwarded-for", XForwardedFor, true},
		{"X-Forwarded-For", XForwardedFor, true},
		{"forwarded", Forwarded, true},
		{" Forwarded ", Forwarded, true},
		{"", 0, false},
		{"x-real-ip", 0, false},
		{"forwarded-for", 0, false},
	} {
		got, err := ParseForwardedHeader(tc.in)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseForwardedHeader(%q) = %v, %v; want %v (ok %v)", tc.in, got, err, tc.want, tc.ok)
		}
		if err == nil && got.String() != strings.ToLower(strings.TrimSpace(tc.in)) {
			t.Errorf("%v.String() = %q, want %q", got, got.String(), tc.in)
		}
	}
	if _, err := NewClientIdentity(nil, 0, WithForwardedHeader(ForwardedHeader(7))); err == nil {
		t.Error("NewClientIdentity took an unknown forwarded header")
	}
}

func TestClientIdentityGroupsIPv6(t *testing.T) {
	id, err := NewClientIdentity(nil, 56)
	if err != nil {
		t.Fatal(err)
	}
	a := id.Group(netip.MustParseAddr("2001:db8:1:2ff:1::1"))
	b := id.Group(netip.MustParseAddr("2001:db8:1:200::9"))
	if a != b || a.String() != "2001:db8:1:200::/56" {
		t.Fatalf("groups %v and %v, want both 2001:db8:1:200::/56", a, b)
	}
	if g := id.Group(netip.MustParseAddr("192.0.2.1")); g.String() != "192.0.2.1/32" {
		t.Fatalf("IPv4 group %v", g)
	}
}

func TestNewClientIdentityErrors(t *testing.T) {
	for _, tc := range []struct {
		trusted []string
		bits    int
	}{{[]string{"10.0.0.0/33"}, 0}, {[]string{"proxy.local"}, 0}, {nil, 129}, {nil, -1}} {
		if _, err := NewClientIdentity(tc.trusted, tc.bits); err == nil {
			t.Errorf("NewClientIdentity(%v, %d): no error", tc.trusted, tc.bits)
		}
	}
}

// FuzzClientAddr: whatever a client writes in X-Forwarded-For and Forwarded, finding
// its address never fails: an untrusted peer is the client; behind a trusted one the
// client is an address (IPv4-mapped ones unmapped), and the other header alone changes
// nothing.
func FuzzClientAddr(f *testing.F) {
	for _, seed := range [][2]string{
		{"203.0.113.9, 10.9.9.9", `for="[2001:db8::1]:443";proto=https, for=unknown`},
		{"unknown, ,1.2.3.4,, ", `for=_hidden, for="10.0.0.1", by=1.2.3.4`},
		{"::ffff:10.0.0.1,[2001:db8::2]:80", `for="\"quoted\"";for=1.1.1.1`},
		{"::ffff:203.0.113.9", `for="[::ffff:203.0.113.9]:80"`}, // the same client as 203.0.113.9
		{"", ""},
	} {
		f.Add(seed[0], seed[1])
	}
	trusted := []string{"10.0.0.0/8"}
	peer := netip.MustParseAddr("10.1.2.3")
	f.Fuzz(func(t *testing.T, xff, fwd string) {
		for _, h := range []ForwardedHeader{XForwardedFor, Forwarded} {
			id, err := NewClientIdentity(trusted, 0, WithForwardedHeader(h))
			if err != nil {
				t.Fatal(err)
			}
			name, other := "X-Forwarded-For", "Forwarded"
			value, otherValue := xff, fwd
			if h == Forwarded {
				name, other, value, otherValue = other, name, otherValue, value
			}
			r := httptest.NewRequest("GET", "/", nil)
			r.RemoteAddr = "198.51.100.1:5000"
			r.Header.Set(name, value)
			r.Header.Set(other, otherValue)
			if got := id.Addr(r); got != netip.MustParseAddr("198.51.100.1") {
				t.Fatalf("%v: an untrusted peer's headers moved the client to %v", h, got)
			}
			r.RemoteAddr = netip.AddrPortFrom(peer, 5000).String()
			if got := id.Addr(r); !got.IsValid() || got.Is4In6() {
				t.Fatalf("%v: client %v from %q", h, got, value)
			}
			r.Header.Del(name)
			if got := id.Addr(r); got != peer {
				t.Fatalf("%v: the other header %q alone moved the client to %v", h, otherValue, got)
			}
		}
	})
}
