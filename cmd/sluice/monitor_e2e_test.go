package main

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestMonitorHidesDownstreamAddress: a ticket's monitor is served to whoever holds the
// ticket, a client of the front door, and keeps back what the downstream would tell
// about the inside (its headers off the allow-list, see TestDeferredRequestAsProxied),
// as the proxy's 502 says only "The upstream could not be reached". Its last_error
// must not hand out the downstream's URL and address either: a failed attempt once
// read `delivery failed: Post "http://10.0.0.5:8080/v1/orders": dial tcp
// 10.0.0.5:8080: connect: connection refused`.
func TestMonitorHidesDownstreamAddress(t *testing.T) {
	t.Parallel()
	// A downstream nobody listens on: each attempt is refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()
	addr := ln.Addr().String()
	p := startSluice(t, "--rules", writeRules(t, t.TempDir(), idemRules(down)), "--upstream", down)
	if r, err := postOrder(p.url, "/v1/orders", "first", `{"n":1}`); err != nil || r.status != 502 {
		t.Fatalf("first order (proxied to a downstream that is down): %v %d %s", err, r.status, r.body)
	}
	a := mustDefer(t, p.url, "/v1/orders", "second")
	deadline := time.Now().Add(30 * time.Second)
	for {
		st, r := getStatus(t, p.url, a.Ticket)
		if st.LastError != "" {
			if strings.Contains(st.LastError, addr) || strings.Contains(st.LastError, "127.0.0.1") {
				t.Errorf("the monitor names the downstream: %s", r.body)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no failed attempt recorded: %s", r.body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
