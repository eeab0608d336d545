package deferral

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/parktest"
)

// BenchmarkDefer measures one order over the limit through the front door's
// middleware and deferrer to its 202, parked in a NATS server (natstest's): a 512-byte
// JSON body, with and without an Idempotency-Key of its own. Most of the time is the
// store's; the allocations beside Park's are the front door's.
func BenchmarkDefer(b *testing.B) {
	// parktest's orders, in a queue that takes any number of orders and keys.
	rules := strings.Replace(parktest.Orders, "max_depth: 3\n", "max_depth: 100000000\n    max_idempotency_keys: 10000000\n", 1)
	set, _, store := parktest.Open(b, rules)
	d := New(store)
	b.Cleanup(d.Close)
	h := newMiddleware(b, set, ingress.WithDeferrer(d)).Wrap(http.NotFoundHandler())
	body := []byte(strings.Repeat("x", 512))
	post := func(key string) int {
		r := httptest.NewRequest("POST", "/v1/orders", bytes.NewReader(body))
		r.RemoteAddr = "198.51.100.1:1000"
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("User-Agent", "sluice-bench")
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	post("") // spends the limit
	n := 0   // the keys' numbers, over every run
	for _, keyed := range []bool{false, true} {
		name := "unkeyed"
		if keyed {
			name = "keyed"
		}
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				key := ""
				if keyed {
					n++
					key = `"k-` + strconv.Itoa(n) + `"`
				}
				if code := post(key); code != http.StatusAccepted {
					b.Fatalf("answered %d", code)
				}
			}
		})
	}
}
