package deferral

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/internal/openapitest"
	"github.com/sluicehq/sluice/limiter"
)

// TestLookupLimit: each client's ticket lookups, status and cancel together, are
// limited; past the limit 429 with Retry-After and no NATS read; another client still
// gets its answers.
func TestLookupLimit(t *testing.T) {
	f := newDeferFixture(t)
	d := New(f.store, WithLookupLimit(nil, limiter.Rate{Count: 1, Period: time.Hour})) // a burst of 2
	mux := http.NewServeMux()
	mux.Handle("GET "+Path+"{ticket}", d.StatusHandler())
	mux.Handle("DELETE "+Path+"{ticket}", d.CancelHandler())
	doc := openapitest.Load(t)
	const unknown = "aaaaaaaaaaaaaaaaaaaaaaaaaa"
	lookup := func(method, peer string) *httptest.ResponseRecorder {
		r := httptest.NewRequest(method, Path+unknown, nil)
		r.RemoteAddr = peer
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		return w
	}
	for i, method := range []string{"GET", "DELETE"} { // the burst: both answered
		if w := lookup(method, "198.51.100.1:1000"); w.Code != http.StatusNotFound {
			t.Fatalf("lookup %d within the limit: %d %s", i, w.Code, w.Body)
		}
	}
	for _, method := range []string{"GET", "DELETE"} {
		w := lookup(method, "198.51.100.1:1001")
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
			t.Errorf("%s past the limit: %d, Retry-After %q; want 429 with Retry-After", method, w.Code, w.Header().Get("Retry-After"))
		}
		doc.Conforms(t, Path+"{ticket}", method, w)
	}
	if w := lookup("GET", "203.0.113.7:1000"); w.Code != http.StatusNotFound {
		t.Errorf("another client: %d %s, want its own limit", w.Code, w.Body)
	}
	// No limit unless asked for.
	open := New(f.store).StatusHandler()
	for range 5 {
		w := httptest.NewRecorder()
		open.ServeHTTP(w, httptest.NewRequest("GET", Path+unknown, nil))
		if w.Code != http.StatusNotFound {
			t.Fatalf("without a lookup limit: %d", w.Code)
		}
	}
}
