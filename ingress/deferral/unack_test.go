package deferral

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A deferred request whose park gets no acknowledgement in time (the NATS node frozen)
// is answered 503 with Retry-After and the ticket it may have become, not "nothing was
// accepted"; once the node is back, that ticket's status says the order is queued.
func TestDeferNotAcknowledgedNamesTheTicket(t *testing.T) {
	c := natstest.StartCluster(t, 3)
	nc := c.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	store, err := queue.Open(ctx, nc, queue.WithSigningKey(natstest.SigningKey()), queue.WithPublishTimeout(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	set := parktest.Rules(t, parktest.Orders)
	for _, q := range set.Queues() {
		if _, err := store.Declare(ctx, q.Config); err != nil {
			t.Fatal(err)
		}
	}
	f := newDeferFixtureOn(t, set, store)
	f.post(`{}`) // use up the limit

	node := c.Node(nc.ConnectedServerName())
	c.Pause(node)
	w := f.post(`{"order":1}`)
	c.Resume(node)
	var p struct {
		Status int    `json:"status"`
		Detail string `json:"detail"`
		Ticket string `json:"ticket"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" {
		t.Fatalf("park on a frozen node: %d %q %s (%v), want 503 with Retry-After", w.Code, w.Header().Get("Retry-After"), w.Body, err)
	}
	if !queue.ValidTicket(p.Ticket) || !strings.Contains(p.Detail, Path+p.Ticket) || !strings.Contains(p.Detail, "may have been accepted") ||
		!strings.Contains(p.Detail, "without an Idempotency-Key may deliver it twice") {
		t.Fatalf("503 body %s", w.Body)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		st := f.get(Path + p.Ticket)
		if st.Code == http.StatusOK && strings.Contains(st.Body.String(), `"queued"`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("status of %s once the node is back: %d %s", p.Ticket, st.Code, st.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
