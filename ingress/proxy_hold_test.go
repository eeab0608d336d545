package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestProxyDoesNotForwardARequestHeldTooLong: a request the proxy could send on only
// after longer than its max hold (here its connection took ten times that to open) is
// answered 503 with Retry-After and never reaches the upstream; the next request, on
// the connection the first one opened, goes through.
func TestProxyDoesNotForwardARequestHeldTooLong(t *testing.T) {
	var reached atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(up.Close)
	u, _ := url.Parse(up.URL)
	const maxHold = 200 * time.Millisecond
	p, err := NewProxy(u, WithProxyMaxHold(maxHold), WithProxyLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.CloseIdleConnections)
	var dials atomic.Int64
	p.pool.Dialer().Control = func(string, string, syscall.RawConn) error {
		if dials.Add(1) == 1 {
			time.Sleep(10 * maxHold) // the first connection is slow to open
		}
		return nil
	}

	w := httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("POST", "/v1/orders", nil))
	if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") == "" || reached.Load() != 0 {
		t.Fatalf("held %s before it could be sent: %d (Retry-After %q), %d reached the upstream; want 503, none",
			10*maxHold, w.Code, w.Header().Get("Retry-After"), reached.Load())
	}
	w = httptest.NewRecorder()
	p.ServeHTTP(w, httptest.NewRequest("POST", "/v1/orders", nil))
	if w.Code != http.StatusOK || reached.Load() != 1 || dials.Load() != 1 {
		t.Fatalf("on the open connection: %d, %d reached the upstream, %d dials; want 200, 1, 1", w.Code, reached.Load(), dials.Load())
	}
	if _, err := NewProxy(u, WithProxyMaxHold(0)); err == nil {
		t.Error("WithProxyMaxHold(0): no error")
	}
}
