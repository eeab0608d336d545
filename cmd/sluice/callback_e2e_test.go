package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/webhook"
)

// newCallbackSecret returns a fresh callback_secret and its key.
func newCallbackSecret(t *testing.T) (string, webhook.Secret) {
	t.Helper()
	secret := webhook.NewSecret()
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	return secret, key
}

// A deferred order with Sluice-Callback: its client is told, by a signed POST, when the
// order is done; a callback to a host the queue does not list is refused with 400
// before anything is parked; the downstream never sees the Sluice-Callback header.
func TestServeSendsSignedCallbacks(t *testing.T) {
	t.Parallel()
	secret, key := newCallbackSecret(t)
	receiver := newCallbackReceiver(t, key)
	var mu sync.Mutex
	var leaked []string
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
	waitFor(t, "the callback", 30*time.Second, func() bool { return len(receiver.received()) > 0 })
	events := receiver.received()
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

// A callback to `localhost`, listed by name, is refused: the name resolves to loopback
// and the queue does not set callback_private, so the receiver listening there never
// sees it (the attempt counts as failed and is logged). Once a reload sets
// callback_private, the retried callback arrives.
func TestServeRefusesCallbackToLocalhostByName(t *testing.T) {
	t.Parallel()
	secret, key := newCallbackSecret(t)
	var mu sync.Mutex
	var got []string
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		id, err := webhook.Verify(r.Header, body, time.Now(), 0, key)
		mu.Lock()
		got = append(got, id+" "+fmt.Sprint(err))
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer receiver.Close()
	received := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), got...)
	}
	down := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
	defer down.Close()
	up := newUpstream(t, 0)
	_, port, _ := strings.Cut(strings.TrimPrefix(receiver.URL, "http://"), ":")
	extra := fmt.Sprintf("outflow: {rate: 50/s}\ncallback_hosts: ['http://localhost:%s']\ncallback_secret: %s", port, secret)
	dir := t.TempDir()
	rulesPath := writeRules(t, dir, deferRules(down.URL, extra))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	a := mustDefer(t, p.url, "/v1/orders", "o1", "Sluice-Callback", "http://localhost:"+port+"/hooks")
	waitStatus(t, p.url, a.Ticket, "done", 30*time.Second)
	waitFor(t, "the refused callback attempt", 30*time.Second, func() bool {
		return clMetric(t, p, `sluice_callbacks_total{outcome="retried",queue="orders"}`) >= 1
	})
	if r := received(); len(r) != 0 {
		t.Fatalf("the receiver on loopback was called through localhost: %v", r)
	}
	logged := false
	for _, line := range strings.Split(p.output.String(), "\n") {
		logged = logged || strings.Contains(line, "callback refused") && strings.Contains(line, "localhost resolves to a refused address")
	}
	if !logged {
		t.Errorf("the refusal is not logged with the name:\n%s", p.output.String())
	}
	writeRules(t, dir, deferRules(down.URL, extra+"\ncallback_private: true"))
	waitFor(t, "the callback once callback_private is set", 60*time.Second, func() bool { return len(received()) > 0 })
	if r := received(); len(r) != 1 || r[0] != "evt_"+a.Ticket+"_done <nil>" {
		t.Errorf("received %v", r)
	}
}

// callbackReceiver is a client's endpoint for completion callbacks: it keeps the
// events whose signature verifies with its key and refuses the others.
type callbackReceiver struct {
	*httptest.Server
	mu     sync.Mutex
	events []queue.CallbackEvent
}

func newCallbackReceiver(t *testing.T, key webhook.Secret) *callbackReceiver {
	c := &callbackReceiver{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
		c.mu.Lock()
		c.events = append(c.events, ev)
		c.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(c.Close)
	return c
}

// received returns the verified events so far.
func (c *callbackReceiver) received() []queue.CallbackEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.events)
}
