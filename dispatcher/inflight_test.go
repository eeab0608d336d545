package dispatcher_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
)

// stuckTransport holds every request until release, whatever its context says (a
// dispatcher stalled mid-delivery, a transport that outlives the delivery timeout),
// then sends it through Base without a deadline. It counts the requests of each
// ticket it holds at once.
type stuckTransport struct {
	base     http.RoundTripper
	released chan struct{}
	once     sync.Once

	mu      sync.Mutex
	running map[string]int // ticket → requests held now
	most    int            // the most requests of one ticket held at once
}

func newStuckTransport() *stuckTransport {
	return &stuckTransport{base: http.DefaultTransport, released: make(chan struct{}), running: map[string]int{}}
}

func (s *stuckTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	tk := req.Header.Get(queue.HeaderTicket)
	s.mu.Lock()
	s.running[tk]++
	s.most = max(s.most, s.running[tk])
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.running[tk]--
		s.mu.Unlock()
	}()
	<-s.released
	return s.base.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
}

func (s *stuckTransport) release() { s.once.Do(func() { close(s.released) }) }

func (s *stuckTransport) mostAtOnce() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.most
}

// An order whose delivery outlasts its ack wait comes back from the server to the
// dispatcher that is still delivering it (it holds the queue's pin). The dispatcher
// does not start it again beside itself: the redelivery is left to the delivery under
// way, whose outcome settles the order. The delivery here is stuck past the delivery
// timeout and the ack wait (3s) until the test releases it, once the dispatcher has
// said it held the redelivery; the downstream then sees the order once, and nothing
// of it is left in the queue.
func TestRedeliveryWaitsForTheDeliveryUnderWay(t *testing.T) {
	srv := natstest.Start(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("stuck", ds.URL)
	store, q := openStore(t, srv.Conn, cfg)
	ticket := park(t, store, "stuck", 0, 1)[0]

	tr := newStuckTransport()
	var logs lockedBuffer
	startReplica(t, srv, cfg, "a", dispatcher.WithHTTPClient(&http.Client{Transport: tr}),
		dispatcher.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	t.Cleanup(tr.release) // before the dispatcher's stop, which waits for its deliveries

	waitFor(t, "the order handed out again, and held or delivered beside itself", 60*time.Second, func() bool {
		return tr.mostAtOnce() > 1 || strings.Contains(logs.String(), "came back while this dispatcher still holds it")
	})
	if n := tr.mostAtOnce(); n > 1 {
		t.Fatalf("the dispatcher delivered one order %d times at once (its redelivery beside the delivery under way)", n)
	}
	tr.release()
	waitFor(t, "status done", 30*time.Second, func() bool {
		st, err := store.Status(ctxT(t), ticket)
		return err == nil && st.Status == queue.StatusDone
	})
	waitFor(t, "the queue empty, nothing in flight", 30*time.Second, func() bool {
		in, err := q.Info(ctxT(t))
		return err == nil && in.Depth == 0 && in.InFlight == 0
	})
	if n := ds.count(ticket); n != 1 {
		t.Errorf("the downstream saw the order %d times, want 1", n)
	}
	if n := tr.mostAtOnce(); n > 1 {
		t.Errorf("the dispatcher delivered one order %d times at once", n)
	}
}
