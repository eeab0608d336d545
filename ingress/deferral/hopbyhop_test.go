package deferral

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue"
)

// TestParkedForwardingHeadersSurviveConnection: a client cannot strip the forwarding
// headers sluice sets on a deferred order by naming them in its Connection header. A
// proxied request gets them whatever Connection says (the proxy drops what Connection
// names, then writes its own), and go doc ./ingress promises deferred orders the same
// forwarding headers; a downstream that finds no X-Forwarded-For would take the
// dispatcher's address for the client's.
func TestParkedForwardingHeadersSurviveConnection(t *testing.T) {
	cases := []struct {
		name       string
		connection string
	}{
		{"X-Forwarded-For named", "X-Forwarded-For"},
		{"all three, lower case, with close", "close, x-forwarded-for, x-forwarded-host, x-forwarded-proto"},
		{"X-Forwarded-Host named", "X-Forwarded-Host"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newDeferFixture(t)
			if w := f.post(`{"n":0}`); w.Code != http.StatusOK {
				t.Fatalf("within the limit: %d", w.Code)
			}
			// A hop-by-hop header the client names is still dropped, as on a proxied
			// request.
			w := f.post(`{"n":1}`, "Connection", c.connection+", X-Hop", "X-Hop", "1", "X-Kept", "1")
			if w.Code != http.StatusAccepted {
				t.Fatalf("over the limit: %d %s", w.Code, w.Body)
			}
			h := f.firstParked(t).Header
			for name, want := range map[string]string{
				"X-Forwarded-For":   "198.51.100.1",
				"X-Forwarded-Host":  "example.com",
				"X-Forwarded-Proto": "http",
				"X-Kept":            "1",
				"X-Hop":             "",
			} {
				if got := strings.Join(h.Values(queue.HeaderPrefix+name), ","); got != want {
					t.Errorf("parked %s = %q, want %q", name, got, want)
				}
			}
		})
	}
}

// TestParkedOrderDropsClientTicket: the dispatcher sets Sluice-Ticket on deliveries,
// so that a downstream may recognise one; a client that sends its own cannot have it
// parked with the order (where a subscriber reading the kept headers would see it),
// as forged X-Forwarded-* are not.
func TestParkedOrderDropsClientTicket(t *testing.T) {
	f := newDeferFixture(t)
	if w := f.post(`{"n":0}`); w.Code != http.StatusOK {
		t.Fatalf("within the limit: %d", w.Code)
	}
	w := f.post(`{"n":1}`, queue.HeaderTicket, "forged-ticket", "X-Kept", "1")
	if w.Code != http.StatusAccepted {
		t.Fatalf("over the limit: %d %s", w.Code, w.Body)
	}
	raw := f.firstParked(t)
	if got := raw.Header.Values(queue.HeaderPrefix + queue.HeaderTicket); len(got) != 0 {
		t.Errorf("the client's %s was parked: %q", queue.HeaderTicket, got)
	}
	if got := raw.Header.Get(queue.HeaderPrefix + "X-Kept"); got != "1" {
		t.Errorf("parked X-Kept = %q, want 1", got)
	}
	if got := raw.Header.Get(queue.HeaderTicket); got == "" || got == "forged-ticket" {
		t.Errorf("the order's own ticket header is %q", got)
	}
}

// firstParked returns the first message of the orders queue's stream.
func (f *deferFixture) firstParked(t *testing.T) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st := f.nats.Stream(t, queue.StreamName("orders"))
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetMsg(ctx, info.State.FirstSeq)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}
