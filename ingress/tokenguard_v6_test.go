package ingress

import (
	"fmt"
	"net/http/httptest"
	"testing"
	"time"
)

// TestTokenGuardGroupsIPv6: an IPv6 host has a whole /64 of addresses to send from, so
// a guard keyed by the full address would let it make MaxWrongTokens guesses from each
// of 2^64 addresses. Wrong tokens count for the /64 (the front door's default
// grouping of IPv6 clients); other /64s and IPv4 addresses are apart.
func TestTokenGuardGroupsIPv6(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	g := NewTokenGuard("s3cret", func() time.Time { return now })
	check := func(addr, token string) (bool, time.Duration) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		return g.Check(r, token)
	}
	for i := range MaxWrongTokens {
		addr := fmt.Sprintf("[2001:db8:1:2::%x]:1000", i+1)
		if ok, retry := check(addr, "guess"); ok || retry != 0 {
			t.Fatalf("wrong token %d from %s: %v %v", i+1, addr, ok, retry)
		}
	}
	for _, tc := range []struct {
		addr, token string
		locked      bool
	}{
		{"[2001:db8:1:2:ffff::99]:1000", "guess", true},
		{"[2001:db8:1:2:abcd::1]:2000", "s3cret", true},
		{"[2001:db8:1:3::1]:1000", "s3cret", false},
		{"192.0.2.1:1000", "s3cret", false},
	} {
		ok, retry := check(tc.addr, tc.token)
		wantOK := !tc.locked && tc.token == "s3cret"
		if locked := retry > 0; locked != tc.locked || ok != wantOK {
			t.Errorf("%s with %q: ok %v, retry after %v; want locked %v", tc.addr, tc.token, ok, retry, tc.locked)
		}
	}
}
