package ingress

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// An address is locked out after MaxWrongTokens wrong tokens, the right one included,
// until its allowance refills; other addresses and requests without credentials are
// not affected.
func TestTokenGuard(t *testing.T) {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	g := NewTokenGuard("s3cret", func() time.Time { return now })
	from := func(addr string) *http.Request {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		return r
	}
	a, b := from("192.0.2.1:1000"), from("192.0.2.2:1000")
	for i := range MaxWrongTokens {
		if ok, retry := g.Check(a, "guess"); ok || retry != 0 {
			t.Fatalf("wrong token %d: %v %v", i+1, ok, retry)
		}
	}
	if ok, retry := g.Check(a, "guess"); ok || retry != WrongTokenRefill {
		t.Fatalf("wrong token past the allowance: %v %v, want locked for %v", ok, retry, WrongTokenRefill)
	}
	// Another port of the same host is the same address.
	if ok, retry := g.Check(from("192.0.2.1:2000"), "s3cret"); ok || retry <= 0 {
		t.Fatalf("right token while locked out: %v %v", ok, retry)
	}
	if ok, retry := g.Check(b, "s3cret"); !ok || retry != 0 {
		t.Fatalf("another address: %v %v", ok, retry)
	}
	now = now.Add(WrongTokenRefill)
	if ok, retry := g.Check(a, "s3cret"); !ok || retry != 0 {
		t.Fatalf("right token after the lockout: %v %v", ok, retry)
	}
	// One wrong token came back, not ten.
	if ok, retry := g.Check(a, "guess"); ok || retry != 0 {
		t.Fatalf("first wrong token after the lockout: %v %v", ok, retry)
	}
	if _, retry := g.Check(a, "guess"); retry <= 0 {
		t.Fatal("second wrong token after the lockout not locked out")
	}
}

// The admin API answers 429 with Retry-After to an address that keeps guessing; a
// request without credentials is a 401 that costs nothing.
func TestAdminLockout(t *testing.T) {
	h := (&Admin{Token: "s3cret"}).Handler()
	get := func(auth string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/sluice/v1/openapi.json", nil)
		if auth != "" {
			r.Header.Set("Authorization", auth)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for range 3 * MaxWrongTokens {
		if w := get(""); w.Code != http.StatusUnauthorized {
			t.Fatalf("no credentials: %d", w.Code)
		}
	}
	if w := get("Bearer s3cret"); w.Code != http.StatusOK {
		t.Fatalf("right token after requests without one: %d", w.Code)
	}
	for i := range MaxWrongTokens {
		auth := "Bearer wrong"
		if i%2 == 1 {
			auth = "s3cret" // not a bearer token: a wrong guess too
		}
		if w := get(auth); w.Code != http.StatusUnauthorized {
			t.Fatalf("wrong token %d: %d", i+1, w.Code)
		}
	}
	for _, auth := range []string{"Bearer wrong", "Bearer s3cret"} {
		w := get(auth)
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != "6" {
			t.Fatalf("%q while locked out: %d, Retry-After %q", auth, w.Code, w.Header().Get("Retry-After"))
		}
	}
}

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
