package deferral

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
	"github.com/sluicehq/sluice/limiter"
)

// TestRepeatIsNotProxied: on a route that defers, a repeat of an accepted order (same
// Idempotency-Key and payload) that arrives within the limit is answered as a repeat
// of its defer — 202, the same ticket, duplicate — and never proxied; with another
// payload it is 422; a request whose key no order holds, or without a key, is proxied
// with its body intact. One order is parked in all.
func TestRepeatIsNotProxied(t *testing.T) {
	set, _, store := parktest.Open(t, parktest.Orders)
	var now atomic.Int64
	now.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	m := newMiddlewareOn(t, set, limiter.NewMemory(limiter.WithClock(clock)), ingress.WithDeferrer(New(store)))
	var proxied []string
	h := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Error(err)
		}
		proxied = append(proxied, r.Header.Get("Idempotency-Key")+" "+string(body))
		w.WriteHeader(http.StatusOK)
	}))
	post := func(body string, headers ...string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("POST", "/v1/orders?x=1", strings.NewReader(body))
		r.RemoteAddr = "198.51.100.1:1000"
		for i := 0; i+1 < len(headers); i += 2 {
			r.Header.Add(headers[i], headers[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	nextHour := func() { now.Add(int64(time.Hour)) } // the limit (1 an hour) is free again

	if w := post(`{"n":0}`); w.Code != http.StatusOK { // uses up the limit
		t.Fatalf("within the limit: %d", w.Code)
	}
	first := post(`{"order":1}`, "Idempotency-Key", `"order-1"`)
	if first.Code != http.StatusAccepted {
		t.Fatalf("over the limit: %d %s", first.Code, first.Body)
	}
	nextHour()
	again := post(`{"order":1}`, "Idempotency-Key", `"order-1"`)
	var a, b acceptedBody
	_ = json.Unmarshal(first.Body.Bytes(), &a)
	_ = json.Unmarshal(again.Body.Bytes(), &b)
	if again.Code != http.StatusAccepted || b.Ticket != a.Ticket || !b.Duplicate || again.Header().Get("Location") != first.Header().Get("Location") {
		t.Errorf("a repeat within the limit: %d %s, want 202 with ticket %s, duplicate", again.Code, again.Body, a.Ticket)
	}
	nextHour()
	if w := post(`{"order":2}`, "Idempotency-Key", `"order-1"`); w.Code != http.StatusUnprocessableEntity {
		t.Errorf("the key with another payload within the limit: %d, want 422", w.Code)
	}
	nextHour()
	if w := post(`{"order":3}`, "Idempotency-Key", `"order-3"`); w.Code != http.StatusOK {
		t.Errorf("a new key within the limit: %d, want 200 (proxied)", w.Code)
	}
	// What the lookup costs a keyed request that no order holds (reported: the cost of
	// this change on the proxy path, one embedded server on loopback).
	const misses = 50
	began := time.Now()
	for i := range misses {
		nextHour()
		if w := post(`{"order":4}`, "Idempotency-Key", fmt.Sprintf(`"miss-%d"`, i)); w.Code != http.StatusOK {
			t.Fatalf("a new key within the limit: %d", w.Code)
		}
	}
	t.Logf("a keyed request on the proxy path whose key no order holds: %s per request, the lookup included", time.Since(began)/misses)
	proxied = proxied[:len(proxied)-misses]
	want := []string{` {"n":0}`, `"order-3" {"order":3}`}
	if strings.Join(proxied, "|") != strings.Join(want, "|") {
		t.Errorf("proxied %q, want %q", proxied, want)
	}
	q, _ := store.Queue("orders")
	if depth, _ := q.Depth(context.Background()); depth != 1 {
		t.Errorf("queue depth %d, want 1", depth)
	}
}
