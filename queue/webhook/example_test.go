package webhook_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/sluicehq/sluice/queue/webhook"
)

// A receiver of sluice's completion callbacks: it verifies each one with the queue's
// callback_secret before trusting it, and answers 2xx only once it has the event (sluice
// retries otherwise, with the same webhook-id).
func Example_receiver() {
	secret, err := webhook.ParseSecret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw") // from a secret store
	if err != nil {
		log.Fatal(err)
	}
	seen := map[string]bool{} // a real receiver keeps this in its database
	receiver := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
		if err != nil {
			http.Error(w, "cannot read", http.StatusBadRequest)
			return
		}
		id, err := webhook.Verify(r.Header, body, time.Now(), 0, secret)
		if err != nil {
			http.Error(w, "not signed by sluice", http.StatusUnauthorized)
			return
		}
		if seen[id] {
			w.WriteHeader(http.StatusNoContent) // a retry of an event already handled
			return
		}
		seen[id] = true
		var ev struct {
			Ticket string `json:"ticket"`
			Status string `json:"status"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, "bad event", http.StatusBadRequest)
			return
		}
		fmt.Printf("order %s is %s\n", ev.Ticket, ev.Status)
		w.WriteHeader(http.StatusNoContent)
	})

	// What sluice sends (here by hand, to show the exchange).
	body := `{"type":"order.done","ticket":"abc","status":"done"}`
	req := httptest.NewRequest(http.MethodPost, "/hooks/sluice", strings.NewReader(body))
	secret.SetHeaders(req.Header, "evt_abc_done", time.Now(), []byte(body))
	rec := httptest.NewRecorder()
	receiver.ServeHTTP(rec, req)
	fmt.Println(rec.Code)

	forged := httptest.NewRequest(http.MethodPost, "/hooks/sluice", strings.NewReader(body))
	forged.Header.Set(webhook.HeaderID, "evt_abc_done")
	forged.Header.Set(webhook.HeaderTimestamp, fmt.Sprint(time.Now().Unix()))
	forged.Header.Set(webhook.HeaderSignature, "v1,bm90IGEgc2lnbmF0dXJl")
	rec = httptest.NewRecorder()
	receiver.ServeHTTP(rec, forged)
	fmt.Println(rec.Code)
	// Output:
	// order abc is done
	// 204
	// 401
}
