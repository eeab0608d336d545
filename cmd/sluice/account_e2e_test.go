package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/ingress/ticket"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/subscriber"
	"github.com/sluicehq/sluice/queue/webhook"
)

// everyFeatureRules has a queue per feature that needs subjects of its own: orders
// (HTTP, callbacks, idempotency keys, two attempts then a dead letter), later
// (scheduled delivery), lanes (priorities and fair_by lanes) and mail (a nats:
// downstream whose worker replies with a result). Each route's first request an hour
// is proxied, the others are deferred.
func everyFeatureRules(downstreamURL, callbackHost, callbackSecret string) string {
	var desc, routes strings.Builder
	for _, name := range []string{"orders", "later", "lanes", "mail"} {
		fmt.Fprintf(&desc, `  - key: route
    value: %[1]s
    rate_limit: {unit: hour, requests_per_unit: 1, name: %[1]s}
    on_limit: defer
    queue: %[1]s
`, name)
		fmt.Fprintf(&routes, `  - name: %[1]s
    match: {method: [POST], path: /v1/%[1]s}
    descriptors:
      - [{key: route, value: %[1]s}]
`, name)
		if name == "lanes" {
			routes.WriteString("    priority: {from: \"header:X-Priority\", default: low}\n")
		}
	}
	return fmt.Sprintf(`domain: e2e-account
descriptors:
%sroutes:
%squeues:
  orders:
    downstream: %[3]s
    outflow: {rate: 50/s}
    max_attempts: 2
    backoff: {initial: 50ms, max: 200ms}
    callback_hosts: ['http://%[4]s']
    callback_secret: %[5]s
  later:
    downstream: %[3]s
    outflow: {rate: 50/s}
    max_delay: 1h
  lanes:
    downstream: %[3]s
    outflow: {rate: 50/s}
    priorities: {levels: [high, low], mode: strict}
    fair_by: header:X-Tenant
    fair_lanes: 8
  mail:
    downstream: nats:notifications.email.paced
    outflow: {rate: 50/s}
`, desc.String(), routes.String(), downstreamURL, callbackHost, callbackSecret)
}

// startEveryFeature starts `sluice serve` with everyFeatureRules on the NATS cluster
// at natsURL (R3 streams), a receiver for its callbacks and a downstream for its HTTP
// queues.
func startEveryFeature(t *testing.T, natsURL string) (*sluiceProcess, *callbackReceiver, *downstream) {
	t.Helper()
	secret := webhook.NewSecret()
	key, err := webhook.ParseSecret(secret)
	if err != nil {
		t.Fatal(err)
	}
	receiver := newCallbackReceiver(t, key)
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), everyFeatureRules(down.URL, strings.TrimPrefix(receiver.URL, "http://"), secret))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL, "--nats", natsURL, "--replicas", "3", "--queue-key", testQueueKey}, dispatchFlags...)...)
	return p, receiver, down
}

// TestSharedClusterAccount runs sluice on a three-node JetStream cluster (separate
// nats-server processes of the version in go.mod) whose nodes include
// deploy/nats/accounts.conf as the shipped clusters do, connected as its user sluice
// with R3 streams. With only that user's permissions every feature works — parking,
// delivery, acknowledgement, ticket records, idempotency keys, completion callbacks,
// scheduled delivery, priority and tenant lanes, a nats: downstream and the result its
// worker sends back, dead letters with dlq list, requeue and purge — and no node logs
// a permission violation: a subject sluice starts to use without its line in the file
// fails here. The stream of the nats: downstream is made as the shipped nats-streams
// job makes it, as the user sluice. The user events receives the events and can do
// nothing else; a client without credentials is refused.
func TestSharedClusterAccount(t *testing.T) {
	cluster := natstest.StartCluster(t, 3, natstest.WithAccounts(accountsWithWorkers(t), "sluice", sluicePW))
	var urls []string
	for _, u := range strings.Split(cluster.URL(), ",") {
		urls = append(urls, strings.Replace(u, "nats://", "nats://sluice:"+sluicePW+"@", 1))
	}
	sluiceURL := strings.Join(urls, ",")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	ajs, err := jetstream.New(cluster.Connect(t, nats.UserInfo("sluice", sluicePW)))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.CreateStream(ctx, jetstream.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"},
		Storage: jetstream.FileStorage, Replicas: 3, Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardOld,
		MaxAge: 7 * 24 * time.Hour, Duplicates: 2 * time.Minute}); err != nil {
		t.Fatalf("the user sluice creates the stream of the nats: downstreams: %v", err)
	}

	var violations syncBuffer
	events := cluster.Connect(t, nats.UserInfo("events", eventsPW), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		fmt.Fprintln(&violations, err)
	}))
	done := make(chan *nats.Msg, 64)
	if _, err := events.ChanSubscribe("sluice.done.>", done); err != nil {
		t.Fatal(err)
	}
	dead := make(chan *nats.Msg, 16)
	if _, err := events.ChanSubscribe("sluice.dead.>", dead); err != nil {
		t.Fatal(err)
	}
	if err := events.Flush(); err != nil {
		t.Fatal(err)
	}

	p, receiver, down := startEveryFeature(t, sluiceURL)
	for _, path := range []string{"/v1/orders", "/v1/later", "/v1/lanes", "/v1/mail"} {
		warmUp(t, p.url, path)
	}

	// A completion callback, and the completion event.
	ok := mustDefer(t, p.url, "/v1/orders", "ok-1", "Sluice-Callback", receiver.URL+"/hooks/sluice")
	waitStatus(t, p.url, ok.Ticket, "done", 60*time.Second)
	waitFor(t, "the callback", 60*time.Second, func() bool { return len(receiver.received()) > 0 })
	if ev := receiver.received()[0]; ev.Data.Ticket != ok.Ticket {
		t.Errorf("callback %+v, want ticket %s", ev, ok.Ticket)
	}
	select {
	case m := <-done:
		if !strings.Contains(string(m.Data), ok.Ticket) {
			t.Errorf("done event %s", m.Data)
		}
	case <-time.After(30 * time.Second):
		t.Error("the events user got no completion event")
	}
	// Same key, same payload: the idempotency bucket answers with the same ticket.
	k1 := mustDefer(t, p.url, "/v1/orders", "idem", "Idempotency-Key", `"shared-1"`)
	if k2 := mustDefer(t, p.url, "/v1/orders", "idem", "Idempotency-Key", `"shared-1"`); k2.Ticket != k1.Ticket {
		t.Errorf("idempotent resubmission: tickets %s and %s", k1.Ticket, k2.Ticket)
	}
	waitStatus(t, p.url, k1.Ticket, "done", 60*time.Second)

	// Scheduled delivery: parked on sluice.s.later.{ticket} until it is due.
	later := mustDefer(t, p.url, "/v1/later", "later-1", "Sluice-Not-Before", "2")
	if later.Status != "scheduled" {
		t.Errorf("Sluice-Not-Before: status %q, want scheduled", later.Status)
	}
	// Lanes: a high and a low order of one tenant.
	high := mustDefer(t, p.url, "/v1/lanes", "lane-high", "X-Tenant", "tenant-a", "X-Priority", "high")
	low := mustDefer(t, p.url, "/v1/lanes", "lane-low", "X-Tenant", "tenant-b")
	for _, a := range []accepted{later, high, low} {
		waitStatus(t, p.url, a.Ticket, "done", 60*time.Second)
	}

	// A nats: downstream: a worker of another account takes the order and replies.
	t.Setenv("SLUICE_QUEUE_KEY", testQueueKey)
	v, err := subscriber.NewVerifier("mail", deliveryKey(t, "mail"))
	if err != nil {
		t.Fatal(err)
	}
	w := newMailWorker(t, cluster.Connect(t, nats.UserInfo("partner", partnerPW)))
	mail := mustDefer(t, p.url, "/v1/mail", "mail-1")
	o := w.take(t)
	if err := v.Verify(o); err != nil || o.Ticket != mail.Ticket {
		t.Fatalf("the delivered order %+v (ticket %s): %v", o, mail.Ticket, err)
	}
	waitFor(t, "the reply to be stored", 60*time.Second, func() bool {
		return v.Reply(ctx, w.js, o, subscriber.Result{StatusCode: 202, Body: []byte("sent")}) == nil
	})
	waitFor(t, "the result in the ticket", 60*time.Second, func() bool {
		st, _ := getStatus(t, p.url, mail.Ticket)
		return st.Status == "done" && st.Result != nil && st.Result.Status == 202
	})

	// Dead letters, and the dlq commands as the user sluice.
	down.failing.Store(true)
	bad := mustDefer(t, p.url, "/v1/orders", "bad-1")
	waitStatus(t, p.url, bad.Ticket, "dead", 60*time.Second)
	select {
	case <-dead:
	case <-time.After(30 * time.Second):
		t.Error("the events user got no dead-letter event")
	}
	code, stdout, stderr := runSluice(t, "dlq", "list", "orders", "--nats", sluiceURL, "--queue-key", testQueueKey)
	if code != exitOK || !strings.Contains(stdout, bad.Ticket) {
		t.Errorf("dlq list as sluice: exit %d\n%s%s", code, stdout, stderr)
	}
	down.failing.Store(false)
	if code, stdout, stderr = runSluice(t, "dlq", "requeue", "orders", "--nats", sluiceURL, "--queue-key", testQueueKey); code != exitOK {
		t.Errorf("dlq requeue as sluice: exit %d\n%s%s", code, stdout, stderr)
	}
	waitStatus(t, p.url, bad.Ticket, "done", 60*time.Second)
	down.failing.Store(true)
	bad2 := mustDefer(t, p.url, "/v1/orders", "bad-2")
	waitStatus(t, p.url, bad2.Ticket, "dead", 60*time.Second)
	if code, stdout, stderr = runSluice(t, "dlq", "purge", "orders", "--yes", "--nats", sluiceURL, "--queue-key", testQueueKey); code != exitOK || !strings.Contains(stdout, "purged 1") {
		t.Errorf("dlq purge as sluice: exit %d\n%s%s", code, stdout, stderr)
	}

	// A wait on the front door watches the ticket records: with these permissions too.
	waited := mustDefer(t, p.url, "/v1/orders", "waited")
	wctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if st, err := ticket.Wait(wctx, p.url+waited.Monitor); err != nil || st.Status != ticket.Dead {
		t.Errorf("ticket.Wait as sluice: %+v %v, want dead (the downstream fails)", st, err)
	}

	// Nothing above was refused: not in sluice's log, not in any node's.
	if out := p.output.String(); strings.Contains(strings.ToLower(out), "violation") || strings.Contains(out, "cannot watch") {
		t.Errorf("sluice hit a permission it lacks:\n%s", grepLines(strings.ToLower(out), "violation")+grepLines(out, "cannot watch"))
	}
	for i := range 3 {
		if log := cluster.Log(i); strings.Contains(log, "Violation") {
			t.Errorf("node %d refused something:\n%s", i+1, grepLines(log, "Violation"))
		}
	}

	// The events user reads events, and nothing else: no queue, no JetStream API, no
	// forged order.
	if _, err := events.SubscribeSync("sluice.q.>"); err != nil {
		t.Fatal(err)
	}
	if err := events.Publish("sluice.q.orders.aaaaaaaaaaaaaaaaaaaaaaaaaa", []byte("forged")); err != nil {
		t.Fatal(err)
	}
	if _, err := events.Request("$JS.API.STREAM.PURGE."+queue.StreamName("orders"), nil, 2*time.Second); err == nil {
		t.Error("the events user purged the queue")
	}
	if err := events.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server's refusals", 30*time.Second, func() bool {
		v := violations.String()
		return strings.Contains(v, `Subscription to "sluice.q.>"`) && strings.Contains(v, `Publish to "sluice.q.orders.`)
	})
	if _, err := nats.Connect(cluster.URL(), nats.Timeout(10*time.Second)); err == nil || !strings.Contains(strings.ToLower(err.Error()), "authorization violation") {
		t.Errorf("connect without credentials: %v", err)
	}
}
