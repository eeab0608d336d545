package deferral

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// A deferred request whose park gets no acknowledgement in time (the NATS node frozen)
// is answered 503 with Retry-After and the ticket it may have become, not "nothing was
// accepted"; once the node is back, that ticket's status says the order is queued. A
// client that leaves while its order is written is logged at debug level, not warned
// of: the warning, one an interval, is the outage's.
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
	var logs bytes.Buffer
	f := newDeferFixtureOn(t, set, store, WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	f.post(`{}`) // use up the limit

	node := c.Node(nc.ConnectedServerName())
	c.Pause(node)
	left, leave := context.WithCancel(context.Background()) // as net/http's server when the client hangs up
	time.AfterFunc(200*time.Millisecond, leave)
	r := httptest.NewRequestWithContext(left, "POST", "/v1/orders", strings.NewReader(`{"order":0}`))
	r.RemoteAddr = "198.51.100.1:1000"
	f.handler.ServeHTTP(httptest.NewRecorder(), r)
	leave()
	w := f.post(`{"order":1}`)
	c.Resume(node)
	// The departed client's park may also end before its publish (a read of the
	// stream's state cancelled): then nothing at all is logged of it.
	out := logs.String()
	if n := strings.Count(out, `level=WARN msg="deferring not acknowledged"`); n != 1 || strings.Contains(out, "level=WARN") && strings.Contains(out, "context canceled") {
		t.Errorf("a client that left and one answered 503: %d warnings, want 1, the second's (its publish timed out):\n%s", n, out)
	}
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
