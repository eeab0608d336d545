package ingress_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// The front door as net/http middleware: each user may create 2 orders a minute; the
// third is answered 429 with the headers that tell the client when to come back, and
// never reaches the handler. (A defer rule with WithDeferrer would park it instead.)
func ExampleMiddleware_Wrap() {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(`
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: orders_per_user}
routes:
  - name: create-order
    match: {method: [POST], path_prefix: /v1/orders}
    descriptors:
      - [{key: user, from: "header:X-User-ID"}]
`)})
	if err != nil {
		fmt.Println(err) // rules.Problems: every problem with its file and line
		return
	}
	now := time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC) // fixed, for exact output
	store := limiter.NewMemory(limiter.WithClock(func() time.Time { return now }))
	mw, err := ingress.New(ingress.StaticRules{S: set}, store)
	if err != nil {
		fmt.Println(err)
		return
	}
	orders := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})
	h := mw.Wrap(orders)

	for range 3 {
		r := httptest.NewRequest("POST", "/v1/orders", nil)
		r.Header.Set("X-User-ID", "42")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Printf("%d remaining=%s retry-after=%q\n", w.Code, w.Header().Get("X-Ratelimit-Remaining"), w.Header().Get("Retry-After"))
	}
	// Output:
	// 201 remaining=1 retry-after=""
	// 201 remaining=0 retry-after=""
	// 429 remaining=0 retry-after="60"
}
