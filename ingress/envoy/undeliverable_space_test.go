package envoy

import (
	"net/http"
	"testing"
	"time"
)

// TestCheckOrderWithPaddedHeaderValue: a header value that starts with a space or a
// tab passes sendableHeader (httpguts allows blanks anywhere in a value; net/http's
// server trims them, an ext_authz check need not), but NATS trims the blanks at the
// start of a header value when it decodes the parked message, so the kept header no
// longer matches what was signed: the order was answered 202 and then dropped as
// forged, never delivered. It must be refused (400) or delivered.
func TestCheckOrderWithPaddedHeaderValue(t *testing.T) {
	c, got := authFixture(t)
	if resp := check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: "{}",
		headers: map[string]string{"content-length": "2"}}); resp.GetOkResponse() == nil {
		t.Fatalf("first order (within the limit): %v", resp)
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"a value starting with a space", map[string]string{"x-note": " padded"}},
		{"a value starting with a tab", map[string]string{"x-note": "\tpadded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.headers["content-length"] = "2"
			code, _, body := denied(t, check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: "{}",
				headers: tc.headers}))
			switch code {
			case http.StatusBadRequest:
				return // refused: nothing parked
			case http.StatusAccepted:
				ticket, _ := body["ticket"].(string)
				deadline := time.Now().Add(30 * time.Second)
				for {
					if _, ok := got.get(ticket); ok {
						return
					}
					if time.Now().After(deadline) {
						t.Fatalf("answered 202 (ticket %s), never delivered", ticket)
					}
					time.Sleep(50 * time.Millisecond)
				}
			default:
				t.Fatalf("%d %v, want 400 or a delivered 202", code, body)
			}
		})
	}
}
