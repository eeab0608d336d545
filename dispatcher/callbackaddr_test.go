package dispatcher

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// stubResolver answers every name from its map (a name it lacks: not found).
type stubResolver map[string][]netip.Addr

func (r stubResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	ips, ok := r[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return ips, nil
}

// Every class of address a callback must not reach by name is refused, in each of its
// forms; public addresses pass.
func TestCheckCallbackAddr(t *testing.T) {
	refused := []string{
		"127.0.0.1", "127.1.2.3", "::1", "::ffff:127.0.0.1", // loopback, IPv4-mapped
		"169.254.169.254", "::ffff:169.254.169.254", "fe80::1", "fe80::1%eth0", // link-local (cloud metadata)
		"10.0.0.1", "172.16.5.4", "172.31.255.255", "192.168.1.1", "::ffff:10.1.2.3", "fc00::1", "fd12:3456::1", // private
		"100.64.0.1", "100.127.255.254", // CGNAT
		"224.0.0.1", "239.255.255.250", "ff02::1", "ff05::2", "ff01::1", // multicast
		"0.0.0.0", "::", "0.1.2.3", // unspecified, this network
		"255.255.255.255", "240.0.0.1", "192.0.2.1", "198.18.0.1", "2001:db8::1", "fec0::1", "100::1", // reserved, documentation
		"::127.0.0.1",                           // IPv4-compatible
		"64:ff9b::7f00:1", "64:ff9b::a9fe:a9fe", // NAT64 of loopback, of the metadata address
		"2002:7f00:1::1", "2002:c0a8:101::1", "2001::1", // 6to4 of loopback and private, Teredo
	}
	for _, s := range refused {
		if err := checkCallbackAddr(netip.MustParseAddr(s)); !errors.Is(err, ErrCallbackAddress) {
			t.Errorf("%s: %v, want ErrCallbackAddress", s, err)
		}
	}
	for _, s := range []string{"93.184.215.14", "8.8.8.8", "100.128.0.1", "172.32.0.1", "2606:4700::1111", "::ffff:1.1.1.1", "64:ff9b::808:808", "2002:808:808::1"} {
		if err := checkCallbackAddr(netip.MustParseAddr(s)); err != nil {
			t.Errorf("%s: %v, want it allowed", s, err)
		}
	}
	// The Control hook checks the address connected to, as the socket layer gives it.
	for _, s := range []string{"127.0.0.1:80", "[::1]:443", "[::ffff:10.0.0.1]:80", "169.254.169.254:80", "not an address"} {
		if err := controlCallbackAddr("tcp4", s, nil); !errors.Is(err, ErrCallbackAddress) {
			t.Errorf("Control(%s): %v, want ErrCallbackAddress", s, err)
		}
	}
	if err := controlCallbackAddr("tcp4", "93.184.215.14:443", nil); err != nil {
		t.Errorf("Control of a public address: %v", err)
	}
}

// A name that resolves to a refused address is never dialled (each class by a name of
// its own, every address of a name checked), and a queue that opts in (CallbackPrivate)
// reaches a name on loopback. An IP literal is dialled as it is.
func TestCallbackDialerRefusesNames(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	res := stubResolver{
		"loopback.test":  {netip.MustParseAddr("127.0.0.1")},
		"loopback6.test": {netip.MustParseAddr("::1")},
		"mapped.test":    {netip.MustParseAddr("::ffff:127.0.0.1")},
		"metadata.test":  {netip.MustParseAddr("169.254.169.254")},
		"linklocal.test": {netip.MustParseAddr("fe80::1")},
		"private.test":   {netip.MustParseAddr("10.1.2.3"), netip.MustParseAddr("192.168.0.10")},
		"ula.test":       {netip.MustParseAddr("fd00::1")},
		"cgnat.test":     {netip.MustParseAddr("100.64.0.1")},
		"multicast.test": {netip.MustParseAddr("224.0.0.251")},
		"zero.test":      {netip.MustParseAddr("0.0.0.0"), netip.MustParseAddr("::")},
		"none.test":      {},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	strict := newCallbackDialer(res, false)
	for name := range res {
		conn, err := strict.DialContext(ctx, "tcp", net.JoinHostPort(name, strconv.Itoa(port)))
		if err == nil {
			conn.Close()
			t.Errorf("%s: dialled", name)
			continue
		}
		if name != "none.test" && !errors.Is(err, ErrCallbackAddress) {
			t.Errorf("%s: %v, want ErrCallbackAddress", name, err)
		}
		if name != "none.test" && !strings.Contains(err.Error(), name) {
			t.Errorf("%s: the error does not name the host: %v", name, err)
		}
	}
	if _, err := strict.DialContext(ctx, "tcp", "unknown.test:80"); err == nil || errors.Is(err, ErrCallbackAddress) {
		t.Errorf("an unknown name: %v, want the lookup's error", err)
	}
	// The opt-in reaches the loopback receiver by name, the strict dialer by its literal.
	private := newCallbackDialer(res, true)
	for _, c := range []struct {
		d    *callbackDialer
		addr string
	}{{private, "loopback.test"}, {private, "mapped.test"}, {strict, "127.0.0.1"}} {
		client := newCallbackClient(c.d)
		resp, err := client.Get("http://" + net.JoinHostPort(c.addr, strconv.Itoa(port)) + "/")
		if err != nil {
			t.Errorf("%s: %v", c.addr, err)
			continue
		}
		resp.Body.Close()
		client.CloseIdleConnections()
		if resp.StatusCode != http.StatusNoContent {
			t.Errorf("%s: %d", c.addr, resp.StatusCode)
		}
	}
}
