package main

import (
	"context"
	"encoding/base64"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/subscriber"
)

// workersAccount is a service account beside deploy/nats/accounts.conf's SLUICE: it
// imports the paced work and the result service, as a team's workers would.
const workersAccount = `accounts {
  WORKERS {
    users: [{user: partner, password: partner-pw-0123456789abcdef}]
    imports: [
      {stream: {account: SLUICE, subject: "notifications.*.paced"}}
      {service: {account: SLUICE, subject: "sluice.result.orders.>"}}
      {service: {account: SLUICE, subject: "sluice.result.mail.>"}}
    ]
  }
`

// Passwords of the users of deploy/nats/accounts.conf in the tests (hex-like, as the
// file asks; set in the environment by accountsWithWorkers), and of WORKERS' partner.
const sluicePW, eventsPW, workerPW = "sluice-pw-0123456789abcdef0123456789", "events-pw-0123456789abcdef0123456789", "worker-pw-0123456789abcdef0123456789"

const partnerPW = "partner-pw-0123456789abcdef"

// accountsWithWorkers writes deploy/nats/accounts.conf, unchanged but for the account
// WORKERS (workersAccount) beside SLUICE, into a temporary file and returns its path;
// it sets the passwords the file reads from the environment.
func accountsWithWorkers(t *testing.T) string {
	t.Helper()
	t.Setenv("NATS_SLUICE_PASSWORD", sluicePW)
	t.Setenv("NATS_EVENTS_PASSWORD", eventsPW)
	t.Setenv("NATS_WORKER_PASSWORD", workerPW)
	conf, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nats", "accounts.conf"))
	if err != nil {
		t.Fatal(err)
	}
	withWorkers := strings.Replace(string(conf), "accounts {\n", workersAccount, 1)
	if withWorkers == string(conf) {
		t.Fatal("accounts.conf has no accounts block")
	}
	path := filepath.Join(t.TempDir(), "accounts.conf")
	if err := os.WriteFile(path, []byte(withWorkers), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// A worker in another account takes the orders of a nats: queue, checks them with
// the delivery key `sluice queue delivery-key` prints, and replies through the result
// service SLUICE exports; the reply lands in the ticket that
// GET /sluice/v1/deferred/{ticket} shows.
func TestSubscriberReplyLandsInTicket(t *testing.T) {
	srv := natstest.StartConfig(t, accountsWithWorkers(t))
	hostPort := strings.TrimPrefix(srv.URL, "nats://")
	sluiceURL := "nats://sluice:" + sluicePW + "@" + hostPort

	// The stream that captures the queue's subject, in sluice's account (the operator
	// makes it, as deploy/kubernetes/nats.yaml does).
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	admin := srv.Connect(t, nats.UserInfo("sluice", sluicePW))
	ajs, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.CreateStream(ctx, jetstream.StreamConfig{Name: "NOTIFY_EMAIL", Subjects: []string{"notifications.email.paced"}}); err != nil {
		t.Fatal(err)
	}

	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules("nats:notifications.email.paced", "outflow: {rate: 50/s}"))
	p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", up.URL, "--nats", sluiceURL, "--queue-key", testQueueKey}, dispatchFlags...)...)

	// The operator hands the worker the delivery key of its queue.
	t.Setenv("SLUICE_QUEUE_KEY", testQueueKey)
	v, err := subscriber.NewVerifier("orders", deliveryKey(t, "orders"))
	if err != nil {
		t.Fatal(err)
	}

	// The worker: core subscription to the imported subject, verify, reply.
	w := newMailWorker(t, srv.Connect(t, nats.UserInfo("partner", partnerPW)))
	wjs := w.js

	warmUp(t, p.url, "/v1/orders")
	acc := mustDefer(t, p.url, "/v1/orders", "mail-1")
	o := w.take(t)
	if err := v.Verify(o); err != nil {
		t.Fatalf("the delivered order does not verify: %v", err)
	}
	if o.Ticket != acc.Ticket || o.Queue != "orders" || o.Path != "/v1/orders" {
		t.Errorf("order %+v, ticket %s", o, acc.Ticket)
	}
	res := subscriber.Result{StatusCode: 202, Header: http.Header{"Content-Type": {"text/plain"}, "Location": {"/mails/17"}}, Body: []byte("queued for sending")}
	// The result stream exists once the dispatcher started; retry until then.
	waitFor(t, "the reply to be stored", 60*time.Second, func() bool {
		err = v.Reply(ctx, wjs, o, res)
		return err == nil
	})

	st := waitStatus(t, p.url, acc.Ticket, "done", 60*time.Second)
	waitFor(t, "the result in the ticket", 60*time.Second, func() bool {
		st, _ = getStatus(t, p.url, acc.Ticket)
		return st.Result != nil && st.Result.Status == 202
	})
	if st.Result.Body != "queued for sending" || st.Result.Headers.Get("Location") != "/mails/17" || st.Result.Headers.Get("Content-Type") != "text/plain" {
		t.Errorf("result %+v", st.Result)
	}
	if out := p.output.String(); strings.Contains(strings.ToLower(out), "permissions violation") {
		t.Errorf("sluice hit a permission it lacks:\n%s", grepLines(strings.ToLower(out), "permissions violation"))
	}
	// The worker's account reaches the results of its queue only.
	other := &subscriber.Order{Ticket: o.Ticket, Queue: "tiny"}
	tv, _ := subscriber.NewVerifier("tiny", deliveryKey(t, "tiny"))
	msg, err := tv.ReplyMsg(other, res)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wjs.PublishMsg(ctx, msg); err == nil {
		t.Error("the worker account published a result of queue tiny")
	}
}

// deliveryKey runs `sluice queue delivery-key` (SLUICE_QUEUE_KEY set by the caller).
func deliveryKey(t *testing.T, queueName string) []byte {
	t.Helper()
	code, stdout, stderr := runSluice(t, "queue", "delivery-key", queueName)
	if code != exitOK {
		t.Fatalf("sluice queue delivery-key: exit %d\n%s", code, stderr)
	}
	key, err := base64.StdEncoding.DecodeString(strings.TrimSpace(stdout))
	if err != nil || len(key) != subscriber.MinDeliveryKey {
		t.Fatalf("sluice queue delivery-key printed %q: %v", stdout, err)
	}
	return key
}

// mailWorker is a worker of the account WORKERS (workersAccount): a core subscription
// to the imported notifications.email.paced, and JetStream to reply with.
type mailWorker struct {
	js     jetstream.JetStream
	orders chan *nats.Msg
}

func newMailWorker(t *testing.T, nc *nats.Conn) *mailWorker {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	w := &mailWorker{js: js, orders: make(chan *nats.Msg, 16)}
	if _, err := nc.ChanSubscribe("notifications.email.paced", w.orders); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// take waits for the next order and decodes it.
func (w *mailWorker) take(t *testing.T) *subscriber.Order {
	t.Helper()
	select {
	case m := <-w.orders:
		o, err := subscriber.Decode(m)
		if err != nil {
			t.Fatal(err)
		}
		return o
	case <-time.After(60 * time.Second):
		t.Fatal("the worker got no order")
		return nil
	}
}
