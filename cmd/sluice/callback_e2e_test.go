package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/dispatcher/webhook"
	"github.com/sluicehq/sluice/queue"
)

// A deferred order with Sluice-Callback: its client is told, by a signed POST, when the
// order is done; a callback to a host the queue does not list is refused with 400
// before anything is parked; the downstream never sees the Sluice-Callback header.
func TestServeSendsSignedCallbacks(t *testing.T) {
	t.Parallel()
	secret := webhook.NewSecret()
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []queue.CallbackEvent
	var leaked []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if _, err := webhook.Verify(r.Header, body, time.Now(), 0, key); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		var ev queue.CallbackEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		events = append(events, ev)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if v := r.Header.Get(queue.HeaderCallback); v != "" {
			mu.Lock()
			leaked = append(leaked, v)
			mu.Unlock()
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer down.Close()
	up := newUpstream(t, 0)
	host := strings.TrimPrefix(receiver.URL, "http://")
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL,
		fmt.Sprintf("outflow: {rate: 50/s}\ncallback_hosts: ['http://%s']\ncallback_secret: %s", host, secret)))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")

	r, err := postOrder(p.url, "/v1/orders", "evil", "{}", "Sluice-Callback", "http://attacker.example.net/steal")
	if err != nil || r.status != http.StatusBadRequest || !strings.Contains(r.body, "callback_hosts") {
		t.Fatalf("callback to an unlisted host: %v %d %s", err, r.status, r.body)
	}
	a := mustDefer(t, p.url, "/v1/orders", "o1", "Sluice-Callback", receiver.URL+"/hooks/sluice?order=o1")
	waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	deadline := time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(events)
		mu.Unlock()
		if n > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no callback arrived")
		}
		time.Sleep(50 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(events) != 1 || events[0].Type != "order.done" || events[0].Data.Ticket != a.Ticket || events[0].Data.DownstreamStatus != 201 {
		t.Errorf("callbacks: %+v", events)
	}
	if len(leaked) != 0 {
		t.Errorf("the downstream saw Sluice-Callback: %v", leaked)
	}
	if strings.Contains(p.output.String(), strings.TrimPrefix(secret, "whsec_")) {
		t.Error("the secret appears in sluice's output")
	}
}
