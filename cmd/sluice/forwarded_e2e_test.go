package main

import (
	"net/http"
	"strconv"
	"testing"
)

// TestForwardedHeaderThroughTheBinary: behind a trusted proxy (here the test itself,
// on 127.0.0.1) only the header --forwarded-header names is believed: a client that
// sends the other one, which its proxy passes through untouched, gets no fresh limit
// by changing it. The upstream gets as X-Forwarded-For the chain sluice believed.
func TestForwardedHeaderThroughTheBinary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		header        string
		real, spoofed string // the header naming the client, the one the client forges
		realValue     string
	}{
		{"x-forwarded-for", "X-Forwarded-For", "Forwarded", "203.0.113.1"},
		{"forwarded", "Forwarded", "X-Forwarded-For", "for=203.0.113.1"},
	} {
		t.Run(tc.header, func(t *testing.T) {
			t.Parallel()
			up := newUpstream(t, 0)
			p := startSluice(t, "--rules", writeRules(t, t.TempDir(), e2eRules(2)), "--upstream", up.URL,
				"--trusted-proxies", "127.0.0.1,::1", "--forwarded-header", tc.header)
			spoof := func(i int) string {
				if tc.spoofed == "Forwarded" {
					return "for=198.51.100." + strconv.Itoa(i)
				}
				return "198.51.100." + strconv.Itoa(i)
			}
			// per_ip allows 3 an hour.
			for i := range 3 {
				r := send(t, "GET", p.url+"/v1/ip", nil, tc.real, tc.realValue, tc.spoofed, spoof(i+1))
				if r.status != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, r.status, r.body)
				}
				if want := "hello GET /v1/ip xff=203.0.113.1, 127.0.0.1"; r.body != want {
					t.Errorf("upstream answered %q, want %q", r.body, want)
				}
			}
			if r := send(t, "GET", p.url+"/v1/ip", nil, tc.real, tc.realValue, tc.spoofed, spoof(99)); r.status != http.StatusTooManyRequests {
				t.Fatalf("4th request of one client with a new %s: %d, want 429", tc.spoofed, r.status)
			}
			other := "203.0.113.2"
			if tc.real == "Forwarded" {
				other = "for=" + other
			}
			if r := send(t, "GET", p.url+"/v1/ip", nil, tc.real, other); r.status != http.StatusOK {
				t.Fatalf("another client behind the proxy: %d, want 200", r.status)
			}
		})
	}
}
