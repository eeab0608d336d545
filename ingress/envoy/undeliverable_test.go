package envoy

import (
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestCheckRefusesHeadersTheDispatcherCannotSend: an ext_authz check carries the
// request's headers as Envoy saw them, and a client speaking HTTP/2 to Envoy can send
// a value with a control character (HTTP/2 forbids only NUL, CR and LF), or a direct
// gRPC caller any name. An order parked with such a header was answered 202 and then
// never delivered: net/http's client refuses to write the header, every attempt failed,
// and the order went to the dead letters. What cannot be delivered is refused at once
// (400), as the front door refuses a path the dispatcher could not send; an order
// answered 202 reaches the downstream. That holds too for a value that starts with a
// blank, which net/http's server trims and an ext_authz check need not: NATS trims it
// when it decodes the parked message, so an order signed over the untrimmed value was
// dropped as forged.
func TestCheckRefusesHeadersTheDispatcherCannotSend(t *testing.T) {
	c, got := authFixture(t)
	if resp := check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: "{}",
		headers: map[string]string{"content-length": "2"}}); resp.GetOkResponse() == nil {
		t.Fatalf("first order (within the limit): %v", resp)
	}
	for _, tc := range []struct {
		name    string
		headers map[string]string
	}{
		{"control character in a value", map[string]string{"x-note": "a\x01b"}},
		{"DEL in a value", map[string]string{"x-note": "a\x7fb"}},
		{"a name that is not a token", map[string]string{"x(note)": "1"}},
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

// TestCheckRefusesHeadersTheQueueCannotStore: ~3,500 headers (42 kB) make a parked
// message whose header block JetStream refuses; the check is denied 431 naming the
// limit, not 503 "retry later" for an order that can never be stored.
func TestCheckRefusesHeadersTheQueueCannotStore(t *testing.T) {
	c, _ := authFixture(t)
	if resp := check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: "{}",
		headers: map[string]string{"content-length": "2"}}); resp.GetOkResponse() == nil {
		t.Fatalf("first order (within the limit): %v", resp)
	}
	headers := map[string]string{"content-length": "2"}
	for i := range 3500 {
		headers["x-h"+strconv.Itoa(i)] = "v"
	}
	code, h, p := denied(t, check(t, c, checkReq{method: "POST", path: "/v1/orders", source: "192.0.2.1", body: "{}", headers: headers}))
	if detail, _ := p["detail"].(string); code != http.StatusRequestHeaderFieldsTooLarge ||
		!strings.Contains(detail, "JetStream's 64 KiB header limit") || headerOf(h, "retry-after") != "" {
		t.Fatalf("%d %v %v, want 431 naming the limit", code, h, p)
	}
}
