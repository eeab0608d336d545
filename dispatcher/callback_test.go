package dispatcher_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/webhook"
)

// receiver is a callback receiver that verifies every callback like a real one would.
type receiver struct {
	*httptest.Server
	secret webhook.Secret
	mu     sync.Mutex
	fail   int // answer 500 to this many attempts first
	tries  map[string]int
	events map[string]queue.CallbackEvent // by webhook-id, once verified
	bad    int                            // attempts that did not verify
}

func newReceiver(t *testing.T, secret string, fail int) *receiver {
	s, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	rc := &receiver{secret: s, fail: fail, tries: map[string]int{}, events: map[string]queue.CallbackEvent{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		id, err := webhook.Verify(r.Header, body, time.Now(), 0, rc.secret)
		if err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/json" {
			rc.bad++
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rc.tries[id]++
		if rc.fail > 0 {
			rc.fail--
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		var ev queue.CallbackEvent
		if err := json.Unmarshal(body, &ev); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		rc.events[id] = ev
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *receiver) event(id string) (queue.CallbackEvent, int, bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	ev, ok := rc.events[id]
	return ev, rc.tries[id], ok
}

var fastCallbacks = dispatcher.WithCallbackPolicy(dispatcher.CallbackPolicy{
	Timeout: 2 * time.Second, MaxAttempts: 4, Workers: 2,
	Backoff: queueconfig.Backoff{Initial: 20 * time.Millisecond, Max: 50 * time.Millisecond},
})

// Every way an order ends reaches its callback, signed, retried until the receiver
// takes it, with the same webhook-id on every attempt.
func TestCallbacksOnDoneFailedAndDead(t *testing.T) {
	srv := natstest.Start(t)
	secret := webhook.NewSecret()
	rc := newReceiver(t, secret, 2)
	ds := newDownstream(t, func(h hit, n int) (int, http.Header, string) {
		switch {
		case strings.Contains(h.path, "refused"):
			return http.StatusBadRequest, nil, "no"
		case strings.Contains(h.path, "broken"):
			return http.StatusInternalServerError, nil, "down"
		}
		return http.StatusCreated, nil, "ok"
	})
	cfg := baseConfig("orders", ds.URL)
	cfg.MaxAttempts = 1
	cfg.CallbackHosts = []string{"http://" + strings.TrimPrefix(rc.URL, "http://")}
	cfg.CallbackSecret = secret
	reg := prometheus.NewRegistry()
	store, _ := openStore(t, srv.Conn, cfg)

	want := map[string]string{} // event id → type
	for _, path := range []string{"/v1/orders", "/v1/refused", "/v1/broken"} {
		req := orderReq("orders", 1)
		req.Path = path
		req.Callback = rc.URL + "/hooks?order=" + path
		r, err := store.Park(ctxT(t), req)
		if err != nil {
			t.Fatal(err)
		}
		kind := map[string]string{"/v1/orders": "done", "/v1/refused": "failed", "/v1/broken": "dead"}[path]
		want["evt_"+r.Ticket+"_"+kind] = "order." + kind
	}
	// No callback asked: none sent.
	park(t, store, "orders", 10, 12)

	startReplica(t, srv, cfg, "a", fastCallbacks, dispatcher.WithRegisterer(reg))
	for id, typ := range want {
		waitFor(t, "callback "+id, 30*time.Second, func() bool { _, _, ok := rc.event(id); return ok })
		ev, tries, _ := rc.event(id)
		if ev.Type != typ || "evt_"+ev.Data.Ticket+"_"+string(ev.Data.Status) != id || ev.Data.Queue != "orders" {
			t.Errorf("callback %s = %+v", id, ev)
		}
		if tries < 1 {
			t.Errorf("callback %s: %d attempts", id, tries)
		}
		// Each order was tried once (MaxAttempts 1): delivered, refused or dead after it.
		if ev.Data.Attempts != 1 {
			t.Errorf("callback %s: data.attempts %d, want 1 (the delivery tried)", id, ev.Data.Attempts)
		}
	}
	rc.mu.Lock()
	retried, bad, n := 0, rc.bad, len(rc.events)
	for _, c := range rc.tries {
		retried += c - 1
	}
	rc.mu.Unlock()
	if retried != 2 || bad != 0 || n != 3 {
		t.Errorf("receiver saw %d repeats (want the 2 failed ones), %d unverifiable attempts, %d events", retried, bad, n)
	}
	waitFor(t, "callback metrics", 10*time.Second, func() bool {
		return gather(t, reg, "sluice_callbacks_total", "queue", "orders", "outcome", "delivered") == 3
	})
	if got := gather(t, reg, "sluice_callbacks_total", "queue", "orders", "outcome", "retried"); got != 2 {
		t.Errorf("retried = %v", got)
	}
}

// A callback whose receiver never takes it is given up after MaxAttempts and counted;
// the queue keeps flowing meanwhile.
func TestCallbackGivenUpAfterMaxAttempts(t *testing.T) {
	srv := natstest.Start(t)
	secret := webhook.NewSecret()
	rc := newReceiver(t, secret, 1000)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	cfg.CallbackHosts = []string{strings.TrimPrefix(rc.URL, "http://"), "http://" + strings.TrimPrefix(rc.URL, "http://")}
	cfg.CallbackSecret = secret
	reg := prometheus.NewRegistry()
	store, _ := openStore(t, srv.Conn, cfg)
	req := orderReq("orders", 1)
	req.Callback = rc.URL + "/hooks"
	if _, err := store.Park(ctxT(t), req); err != nil {
		t.Fatal(err)
	}
	park(t, store, "orders", 2, 12)
	startReplica(t, srv, cfg, "a", fastCallbacks, dispatcher.WithRegisterer(reg))
	waitFor(t, "the callback given up", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_callbacks_total", "queue", "orders", "outcome", "failed") == 1
	})
	waitFor(t, "every order delivered", 30*time.Second, func() bool { return len(ds.keys()) == 11 })
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for id, n := range rc.tries {
		if n != 4 {
			t.Errorf("%s: %d attempts, want MaxAttempts 4", id, n)
		}
	}
}

// A callback survives its dispatcher: one stopped while the receiver is down leaves
// the job stored, and the next dispatcher sends it.
func TestCallbackSurvivesDispatcherRestart(t *testing.T) {
	srv := natstest.Start(t)
	secret := webhook.NewSecret()
	rc := newReceiver(t, secret, 1000)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	cfg.CallbackHosts = []string{"http://" + strings.TrimPrefix(rc.URL, "http://")}
	cfg.CallbackSecret = secret
	store, _ := openStore(t, srv.Conn, cfg)
	req := orderReq("orders", 1)
	req.Callback = rc.URL + "/hooks"
	r, err := store.Park(ctxT(t), req)
	if err != nil {
		t.Fatal(err)
	}
	id := "evt_" + r.Ticket + "_done"
	slow := dispatcher.WithCallbackPolicy(dispatcher.CallbackPolicy{Timeout: 2 * time.Second, MaxAttempts: 100, Workers: 1,
		Backoff: queueconfig.Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond}})
	a := startReplica(t, srv, cfg, "a", slow)
	waitFor(t, "a failed attempt", 30*time.Second, func() bool { _, n, _ := rc.event(id); return n >= 1 })
	a.kill()
	rc.mu.Lock()
	rc.fail = 0
	rc.mu.Unlock()
	startReplica(t, srv, cfg, "b", slow)
	waitFor(t, "the callback after the restart", 30*time.Second, func() bool { _, _, ok := rc.event(id); return ok })
}

// Park refuses a callback its queue does not allow; a job forged on sluice.cb.> (no
// valid signature) is dropped and never sent.
func TestCallbackRefusalsAndForgedJobs(t *testing.T) {
	srv := natstest.Start(t)
	secret := webhook.NewSecret()
	rc := newReceiver(t, secret, 0)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	cfg.CallbackHosts = []string{"hooks.example.com"}
	cfg.CallbackSecret = secret
	reg := prometheus.NewRegistry()
	store, _ := openStore(t, srv.Conn, cfg)
	for _, u := range []string{rc.URL + "/hooks", "http://hooks.example.com/x", "https://evil.example.com/x", "https://hooks.example.com/x\r\nX: y"} {
		req := orderReq("orders", 1)
		req.Callback = u
		_, err := store.Park(ctxT(t), req)
		if !errors.Is(err, queue.ErrInvalidRequest) {
			t.Errorf("Park with callback %q: %v, want ErrInvalidRequest", u, err)
		}
	}
	startReplica(t, srv, cfg, "a", fastCallbacks, dispatcher.WithRegisterer(reg))
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	forged := nats.NewMsg("sluice.cb.orders.x")
	forged.Data = []byte(`{"type":"order.done"}`)
	forged.Header.Set("Sluice-Callback", rc.URL+"/hooks")
	forged.Header.Set("Sluice-Queue", "orders")
	forged.Header.Set("Sluice-Event-Id", "evt_x_done")
	forged.Header.Set("Sluice-Signature", "v1=AAAA")
	waitFor(t, "the callback stream", 10*time.Second, func() bool {
		_, err := js.Stream(ctxT(t), queue.CallbackStream)
		return err == nil
	})
	if _, err := js.PublishMsg(ctxT(t), forged); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the forged job dropped", 30*time.Second, func() bool {
		return gather(t, reg, "sluice_callbacks_total", "queue", "", "outcome", "dropped") == 1
	})
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.tries) != 0 || rc.bad != 0 {
		t.Errorf("the receiver was called: %v, %d", rc.tries, rc.bad)
	}
}

// hungReceiver takes callbacks and never answers them (until the test ends); it counts
// the attempts it holds at once and those that ended (the sender gave up waiting).
type hungReceiver struct {
	*httptest.Server
	mu             sync.Mutex
	holding, most  int
	started, ended int
}

func newHungReceiver(t *testing.T) *hungReceiver {
	hr := &hungReceiver{}
	release := make(chan struct{})
	hr.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hr.mu.Lock()
		hr.holding++
		hr.started++
		hr.most = max(hr.most, hr.holding)
		hr.mu.Unlock()
		select {
		case <-release:
		case <-r.Context().Done():
		}
		hr.mu.Lock()
		hr.holding--
		hr.ended++
		hr.mu.Unlock()
	}))
	t.Cleanup(func() {
		close(release)
		hr.Close()
	})
	return hr
}

// Callbacks never block each other: 100 callbacks to a receiver that answers 500 and 50
// to one that never answers, all ahead of a healthy receiver's in the stream, leave the
// healthy ones to arrive while the bad ones are still pending: before any attempt at
// the silent receiver has run out its timeout, and with that receiver never holding more
// than its host's share of the senders. (Before, the consumer's pending limit was the
// worker count and a failed callback waited out its backoff inside it: 8 failures
// stopped every callback of the deployment.)
func TestCallbacksDoNotBlockEachOther(t *testing.T) {
	srv := natstest.Start(t)
	secret := webhook.NewSecret()
	healthy := newReceiver(t, secret, 0)
	failing := newReceiver(t, secret, 1<<30)
	hung := newHungReceiver(t)
	ds := newDownstream(t, nil)
	cfg := baseConfig("orders", ds.URL)
	cfg.Outflow = limiter.PerSecond(1000)
	cfg.MaxInFlight = 16
	for _, rc := range []string{healthy.URL, failing.URL, hung.URL} {
		cfg.CallbackHosts = append(cfg.CallbackHosts, "http://"+strings.TrimPrefix(rc, "http://"))
	}
	cfg.CallbackSecret = secret
	store, _ := openStore(t, srv.Conn, cfg)
	parkTo := func(url string, n int) []string {
		var tickets []string
		for i := range n {
			req := orderReq("orders", i)
			req.Callback = url + "/hooks"
			r, err := store.Park(ctxT(t), req)
			if err != nil {
				t.Fatal(err)
			}
			tickets = append(tickets, r.Ticket)
		}
		return tickets
	}
	parkTo(failing.URL, 100)
	parkTo(hung.URL, 50)
	good := parkTo(healthy.URL, 10)

	// A timeout long enough that no attempt at the silent receiver ends within the
	// test, a backoff long enough that no failed callback comes back within it.
	const timeout = 40 * time.Second
	policy := dispatcher.DefaultCallbackPolicy
	policy.Timeout = timeout
	policy.MaxAttempts = 100
	policy.Backoff = queueconfig.Backoff{Initial: time.Minute, Max: time.Hour}
	start := time.Now()
	startReplica(t, srv, cfg, "a", dispatcher.WithCallbackPolicy(policy))
	waitFor(t, "every healthy callback", timeout-5*time.Second, func() bool {
		for _, tk := range good {
			if _, _, ok := healthy.event("evt_" + tk + "_done"); !ok {
				return false
			}
		}
		return true
	})
	took := time.Since(start)
	var late time.Duration
	for _, tk := range good {
		ev, tries, _ := healthy.event("evt_" + tk + "_done")
		if tries != 1 {
			t.Errorf("healthy callback %s: %d attempts", tk, tries)
		}
		late = max(late, time.Since(ev.Data.At))
	}
	hung.mu.Lock()
	started, ended, most := hung.started, hung.ended, hung.most
	hung.mu.Unlock()
	failing.mu.Lock()
	failed := len(failing.tries)
	failing.mu.Unlock()
	t.Logf("healthy callbacks all in %v after the dispatcher started (the last %v after its order ended); the silent receiver held %d at most (%d started), the failing one was tried for %d callbacks",
		took, late, most, started, failed)
	if ended != 0 {
		t.Errorf("%d attempts at the silent receiver ended before the healthy callbacks were all in", ended)
	}
	if most > policy.PerHost {
		t.Errorf("the silent receiver held %d of the %d senders at once, its share is %d", most, policy.Workers, policy.PerHost)
	}
	// Its failure budget spent, the failing receiver cools down: its other callbacks
	// wait untried (the attempts already under way when the streak ran out aside).
	if failed > policy.HostFailures+policy.PerHost {
		t.Errorf("the failing receiver was tried for %d callbacks, its budget is %d failures in a row", failed, policy.HostFailures)
	}
}

// loopbackResolver resolves every name to one address.
type loopbackResolver netip.Addr

func (r loopbackResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.Addr(r)}, nil
}

// A callback host listed by name whose address is loopback (or IPv4-mapped loopback)
// is refused: the attempt fails, the receiver on that address never sees it. The same
// queue with CallbackPrivate reaches it.
func TestCallbackByNameToLoopbackRefused(t *testing.T) {
	for _, addr := range []string{"127.0.0.1", "::ffff:127.0.0.1"} {
		t.Run(addr, func(t *testing.T) {
			srv := natstest.Start(t)
			secret := webhook.NewSecret()
			rc := newReceiver(t, secret, 0)
			ds := newDownstream(t, nil)
			cfg := baseConfig("orders", ds.URL)
			_, port, _ := strings.Cut(strings.TrimPrefix(rc.URL, "http://"), ":")
			cfg.CallbackHosts = []string{"http://hooks.test:" + port}
			cfg.CallbackSecret = secret
			reg := prometheus.NewRegistry()
			store, _ := openStore(t, srv.Conn, cfg)
			req := orderReq("orders", 1)
			req.Callback = "http://hooks.test:" + port + "/hooks"
			r, err := store.Park(ctxT(t), req)
			if err != nil {
				t.Fatal(err)
			}
			res := dispatcher.WithCallbackResolver(loopbackResolver(netip.MustParseAddr(addr)))
			a := startReplica(t, srv, cfg, "a", fastCallbacks, res, dispatcher.WithRegisterer(reg))
			waitFor(t, "the refused attempts", 30*time.Second, func() bool {
				return gather(t, reg, "sluice_callbacks_total", "queue", "orders", "outcome", "retried") >= 2
			})
			rc.mu.Lock()
			tries, bad := len(rc.tries), rc.bad
			rc.mu.Unlock()
			if tries != 0 || bad != 0 {
				t.Fatalf("the receiver on loopback was called by name: %d callbacks, %d unverified", tries, bad)
			}
			a.cancel()
			<-a.done
			cfg.CallbackPrivate = true
			slow := dispatcher.WithCallbackPolicy(dispatcher.CallbackPolicy{Timeout: 2 * time.Second, MaxAttempts: 100, Workers: 2,
				Backoff: queueconfig.Backoff{Initial: 50 * time.Millisecond, Max: 100 * time.Millisecond}})
			startReplica(t, srv, cfg, "b", slow, res)
			waitFor(t, "the callback with callback_private", 30*time.Second, func() bool {
				_, _, ok := rc.event("evt_" + r.Ticket + "_done")
				return ok
			})
		})
	}
}
