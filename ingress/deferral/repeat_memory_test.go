package deferral

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
)

// TestRepeatLookupBodyCountsWhileProxied: a keyed request within the limit has its
// body read into memory for the repeat lookup (AnswerRepeat) and is then proxied
// from that copy. The copy must count against the deferred bodies' memory until the
// request is done: else concurrent keyed requests to a slow upstream hold their
// whole bodies each, past --defer-memory, which exists to bound exactly that.
func TestRepeatLookupBodyCountsWhileProxied(t *testing.T) {
	set, _, store := parktest.Open(t, parktest.Orders)
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	d := New(store)
	m := newMiddlewareOn(t, set, limiter.NewMemory(limiter.WithClock(func() time.Time { return now })), ingress.WithDeferrer(d))
	body := strings.Repeat("x", 8<<10)
	var inUse int64 = -1
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		inUse = d.memory.used.Load() // the upstream is still reading and answering
		w.WriteHeader(http.StatusOK)
	}))
	r := httptest.NewRequest("POST", "/v1/orders?x=1", strings.NewReader(body))
	r.RemoteAddr = "198.51.100.1:1000"
	r.Header.Set("Idempotency-Key", `"fresh-1"`)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	if w.Code != http.StatusOK {
		t.Fatalf("a keyed request within the limit: %d %s", w.Code, w.Body)
	}
	if inUse < int64(len(body)) {
		t.Errorf("while the keyed request was proxied from its in-memory copy, the deferred bodies' memory counted %d bytes, want at least %d", inUse, len(body))
	}
}
