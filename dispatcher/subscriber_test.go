package dispatcher_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/subscriber"
)

// worker consumes a queue's downstream stream with subscriber.Verifier.Handle until
// ctx ends.
// Orders that do not verify are reported on rejected.
func worker(ctx context.Context, t *testing.T, js jetstream.JetStream, stream string, v *subscriber.Verifier, rejected chan<- error, answer func(*subscriber.Order) subscriber.Result) {
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{Durable: "worker", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Error(err)
		return
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		if err != nil {
			continue
		}
		for jm := range batch.Messages() {
			err := v.Handle(ctx, js, jm, func(_ context.Context, o *subscriber.Order) (*subscriber.Result, error) {
				r := answer(o)
				return &r, nil
			})
			if errors.Is(err, subscriber.ErrForged) || errors.Is(err, subscriber.ErrNotOrder) {
				rejected <- err
			}
		}
	}
}

// payQueue starts a NATS server with a stream PAID capturing orders.paid and returns
// it, its JetStream and the configuration of queue pay delivering there (X-Receipt
// kept in results).
func payQueue(t *testing.T) (*natstest.Server, jetstream.JetStream, queueconfig.Config) {
	t.Helper()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{Name: "PAID", Subjects: []string{"orders.paid"}}); err != nil {
		t.Fatal(err)
	}
	cfg := baseConfig("pay", "nats:orders.paid")
	cfg.ResultHeaders = []string{"X-Receipt"}
	return srv, js, cfg
}

// A consumer of a nats: queue verifies each order and replies; the dispatcher writes
// the reply into the ticket, with the headers the queue keeps. Forged results — signed
// with another queue's key, or for a ticket of an HTTP queue — never land.
func TestSubscriberResultLandsInTicket(t *testing.T) {
	srv, js, cfg := payQueue(t)
	httpCfg := baseConfig("web", "http://127.0.0.1:1")
	store, _ := openStore(t, srv.Conn, cfg)
	if _, err := store.Declare(ctxT(t), httpCfg); err != nil {
		t.Fatal(err)
	}

	// A result for an HTTP queue's ticket and one signed with another queue's key,
	// published before any genuine one: the dispatcher drops both.
	webTicket := park(t, store, "web", 0, 1)[0]
	tickets := park(t, store, "pay", 0, 3)
	var logs lockedBuffer
	startReplica(t, srv, cfg, "a", dispatcher.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	waitFor(t, "the result stream", 20*time.Second, func() bool {
		_, err := js.Stream(ctxT(t), queue.ResultStream)
		return err == nil
	})
	forge := func(signer, queueName, ticket string) {
		t.Helper()
		v, err := subscriber.NewVerifier(signer, store.DeliveryKey(signer))
		if err != nil {
			t.Fatal(err)
		}
		msg, err := v.ReplyMsg(&subscriber.Order{Ticket: ticket, Queue: signer}, subscriber.Result{StatusCode: 299, Body: []byte("forged")})
		if err != nil {
			t.Fatal(err)
		}
		msg.Subject = subscriber.ResultSubject(queueName, ticket)
		msg.Header.Del(subscriber.HeaderMsgID)
		if _, err := js.PublishMsg(ctxT(t), msg); err != nil {
			t.Fatal(err)
		}
	}
	forge("web", "pay", tickets[0]) // web's consumer writing pay's result
	forge("web", "web", webTicket)  // a result for an HTTP delivery

	v, err := subscriber.NewVerifier("pay", store.DeliveryKey("pay"))
	if err != nil {
		t.Fatal(err)
	}
	rejected := make(chan error, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		worker(ctx, t, js, "PAID", v, rejected, func(o *subscriber.Order) subscriber.Result {
			return subscriber.Result{
				StatusCode: 201,
				Header:     http.Header{"Content-Type": {"text/plain"}, "X-Receipt": {"rcpt-" + o.RawQuery}, "Set-Cookie": {"s=1"}, "X-Internal": {"1"}},
				Body:       fmt.Appendf(nil, "paid %s %s", o.Method, o.Body),
			}
		})
	}()
	t.Cleanup(func() { cancel(); <-done })

	// Deliveries run side by side (max in flight), so the orders reach PAID in any
	// order: each result names its own message, and together they are PAID's first 3.
	var seqs []uint64
	for i, tk := range tickets {
		var st *queue.Record
		waitFor(t, "the result of "+tk, 30*time.Second, func() bool {
			st, err = store.Status(ctxT(t), tk)
			return err == nil && st.Result != nil && st.Result.StatusCode != 0
		})
		r := st.Result
		if st.Status != queue.StatusDone || r.StatusCode != 201 || string(r.Body) != fmt.Sprintf(`paid POST {"order":%d}`, i) ||
			r.Subject != "orders.paid" {
			t.Errorf("ticket %d: %s, result %+v", i, st.Status, r)
		}
		seqs = append(seqs, r.Sequence)
		if r.Header.Get("X-Receipt") != fmt.Sprintf("rcpt-n=%d", i) || r.Header.Get("Content-Type") != "text/plain" ||
			r.Header.Get("Set-Cookie") != "" || r.Header.Get("X-Internal") != "" {
			t.Errorf("ticket %d: result headers %v", i, r.Header)
		}
	}
	if slices.Sort(seqs); !slices.Equal(seqs, []uint64{1, 2, 3}) {
		t.Errorf("the results name PAID's messages %v, want 1, 2 and 3", seqs)
	}
	// The forged results were consumed (the stream is empty) and left no trace.
	waitFor(t, "the result stream to drain", 20*time.Second, func() bool {
		st, err := js.Stream(ctxT(t), queue.ResultStream)
		if err != nil {
			return false
		}
		info, err := st.Info(ctxT(t))
		return err == nil && info.State.Msgs == 0
	})
	for _, want := range []string{
		"result refused", tickets[0] + ": subscriber: forged", webTicket + `: queue \"web\" has no nats: downstream`,
	} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the logs do not say %q:\n%s", want, logs.String())
		}
	}
	if rec, err := store.Record(ctxT(t), webTicket); err == nil && rec.Result != nil && rec.Result.StatusCode == 299 {
		t.Errorf("forged result landed on the HTTP ticket: %+v", rec.Result)
	}
	st, err := store.Status(ctxT(t), tickets[0])
	if err != nil || st.Result.StatusCode != 201 {
		t.Errorf("first ticket: %+v, %v", st, err)
	}

	// A delivered order with its body changed, republished on the subject: the
	// worker rejects it, and the ticket keeps its result.
	raw, err := js.Stream(ctxT(t), "PAID")
	if err != nil {
		t.Fatal(err)
	}
	orig, err := raw.GetMsg(ctxT(t), 3)
	if err != nil {
		t.Fatal(err)
	}
	tampered := nats.NewMsg("orders.paid")
	tampered.Header = orig.Header
	tampered.Header.Del(subscriber.HeaderMsgID)
	tampered.Data = []byte(`{"order":999}`)
	if _, err := js.PublishMsg(ctxT(t), tampered); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-rejected:
		if !errors.Is(err, subscriber.ErrForged) {
			t.Errorf("tampered order rejected with %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the tampered order was not rejected")
	}
	select {
	case err := <-rejected:
		t.Errorf("a second order was rejected: %v", err)
	default:
	}

	// A second, genuine result of the same ticket does not replace the first.
	o := &subscriber.Order{Ticket: tickets[1], Queue: "pay"}
	msg, err := v.ReplyMsg(o, subscriber.Result{StatusCode: 500, Body: []byte("again")})
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Del(subscriber.HeaderMsgID) // past the duplicate window, as it were
	if _, err := js.PublishMsg(ctxT(t), msg); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the repeated result to be consumed", 20*time.Second, func() bool {
		st, err := js.Stream(ctxT(t), queue.ResultStream)
		if err != nil {
			return false
		}
		info, err := st.Info(ctxT(t))
		return err == nil && info.State.Msgs == 0
	})
	if st, err := store.Status(ctxT(t), tickets[1]); err != nil || st.Result.StatusCode != 201 {
		t.Errorf("second ticket after a repeated result: %+v, %v", st.Result, err)
	}

	// A result over the bounds is refused by the stream itself.
	if _, err := js.Publish(ctxT(t), subscriber.ResultSubject("pay", tickets[2]), make([]byte, 200<<10)); err == nil {
		t.Error("the result stream stored a 200 KiB result")
	}
}

// A worker written in Python from the subscriber package's documentation alone
// (queue/subscriber/testdata/worker.py: the NATS client protocol over a socket and the
// signature specification, standard library only) receives the orders of a nats: queue
// through a real NATS server, verifies them, refuses one forged on the subject, and
// answers the genuine ones with signed results that land in their tickets. The server
// runs deploy/nats/accounts.conf, sluice as its user sluice and the worker as its user
// worker, so a permission the worker lacks fails the test; a Go worker as that user
// then reads the same orders through a durable JetStream consumer of the stream,
// acknowledges them and replies, and whatever else it tries (publish an order, read the
// queues or sluice's replies, purge the stream) the server refuses.
func TestPythonWorkerFromTheSpecification(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		if runtime.GOOS == "linux" && os.Getenv("CI") != "" {
			t.Fatal("python3 is not installed")
		}
		t.Skip("python3 is not installed")
	}
	const sluicePW, eventsPW, workerPW = "sluice-pw-0123456789abcdef", "events-pw-0123456789abcdef", "worker-pw-0123456789abcdef"
	t.Setenv("NATS_SLUICE_PASSWORD", sluicePW)
	t.Setenv("NATS_EVENTS_PASSWORD", eventsPW)
	t.Setenv("NATS_WORKER_PASSWORD", workerPW)
	srv := natstest.StartConfig(t, filepath.Join("..", "deploy", "nats", "accounts.conf"))
	asSluice := func() *nats.Conn { return srv.Connect(t, nats.UserInfo("sluice", sluicePW)) }
	sc := asSluice()
	sjs, err := jetstream.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	// The stream of deploy/ that captures the nats: queues' subjects.
	if _, err := sjs.CreateStream(ctxT(t), jetstream.StreamConfig{Name: "NOTIFICATIONS", Subjects: []string{"notifications.>"}}); err != nil {
		t.Fatal(err)
	}
	const name, subject = "notifications-email", "notifications.email.paced" // as in deploy/rules
	cfg := baseConfig(name, "nats:"+subject)
	cfg.ResultHeaders = []string{"X-Receipt"}
	store, _ := openStore(t, sc, cfg)
	key := base64.StdEncoding.EncodeToString(store.DeliveryKey(name))
	hostPort := strings.TrimPrefix(srv.URL, "nats://")
	cmd := exec.Command(py, "../queue/subscriber/testdata/worker.py", "worker:"+workerPW+"@"+hostPort, subject, name, key, "3")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 64) // the worker writes a handful
	exited := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		exited <- cmd.Wait() // after its output is read, as Wait requires
	}()
	var seen []string
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("the worker stopped before %s: %s", what, stderr.String())
			}
			seen = append(seen, l)
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("no %s from the worker (it said %q): %s", what, seen, stderr.String())
		}
		return ""
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	if l := next("ready"); l != `{"ready": true}` {
		t.Fatalf("worker: %s", l)
	}
	tickets := park(t, store, name, 0, 2)
	startReplicaOn(t, asSluice(), cfg, "a")
	want := map[string]bool{}
	for _, tk := range tickets {
		want[`{"ticket": "`+tk+`", "verified": true}`] = true
	}
	for range tickets { // in either order: the queue delivers several at once
		if l := next("an order"); !want[l] {
			t.Fatalf("the worker on a genuine order: %s, want one of %v", l, want)
		}
	}
	forged := nats.NewMsg(subject)
	forged.Header.Set(subscriber.HeaderTicket, "abcdefghijklmnopqrstuvwxyz")
	forged.Header.Set(subscriber.HeaderQueue, name)
	forged.Header.Set(subscriber.HeaderMethod, "POST")
	forged.Header.Set(subscriber.HeaderPath, "/v1/orders")
	forged.Header.Set(subscriber.HeaderDeliverySignature, "v1=AAAA")
	if _, err := sjs.PublishMsg(ctxT(t), forged); err != nil {
		t.Fatal(err)
	}
	if l := next("the forged order"); l != `{"ticket": "abcdefghijklmnopqrstuvwxyz", "verified": false}` {
		t.Fatalf("the worker on a forged order: %s", l)
	}
	for i, tk := range tickets {
		var st *queue.Record
		waitFor(t, "the Python worker's result of "+tk, 60*time.Second, func() bool {
			st, err = store.Status(ctxT(t), tk)
			return err == nil && st.Result != nil && st.Result.StatusCode != 0
		})
		r := st.Result
		if r.StatusCode != 201 || string(r.Body) != fmt.Sprintf(`python took {"order":%d}`, i) || r.Header.Get("X-Receipt") != "py-"+tk[:6] {
			t.Errorf("ticket %s: result %+v", tk, r)
		}
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("the worker: %v: %s", err, stderr.String())
		}
		exited <- err // for the cleanup
	case <-time.After(30 * time.Second):
		t.Errorf("the worker did not end after its three orders: %s", stderr.String())
	}
	t.Logf("worker said: %q", seen)

	// The same user through JetStream, as package subscriber's worker runs: the three
	// orders from the stream, the genuine ones answered (again: the first result
	// stays) and acknowledged, the forged one terminated.
	var violations lockedBuffer
	wc := srv.Connect(t, nats.UserInfo("worker", workerPW), nats.CustomInboxPrefix("_INBOX_worker"),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { fmt.Fprintln(&violations, err) }))
	wjs, err := jetstream.New(wc)
	if err != nil {
		t.Fatal(err)
	}
	v, err := subscriber.NewVerifier(name, store.DeliveryKey(name))
	if err != nil {
		t.Fatal(err)
	}
	cons, err := wjs.CreateOrUpdateConsumer(ctxT(t), "NOTIFICATIONS", jetstream.ConsumerConfig{Durable: "email-worker",
		FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatalf("the worker user creates its consumer: %v", err)
	}
	var results []error
	waitFor(t, "the Go worker to take the three orders", 60*time.Second, func() bool {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatalf("the worker user pulls: %v", err)
		}
		for jm := range batch.Messages() {
			results = append(results, v.Handle(ctxT(t), wjs, jm, func(_ context.Context, o *subscriber.Order) (*subscriber.Result, error) {
				return &subscriber.Result{StatusCode: 202, Body: []byte("go took it")}, nil
			}))
		}
		return len(results) >= 3
	})
	if len(results) != 3 || results[0] != nil || results[1] != nil || !errors.Is(results[2], subscriber.ErrForged) {
		t.Errorf("the Go worker: %v, want two answered and the forged one refused", results)
	}
	waitFor(t, "the three acknowledged", 30*time.Second, func() bool {
		info, err := cons.Info(ctxT(t))
		return err == nil && info.AckFloor.Stream == 3 && info.NumAckPending == 0
	})
	for _, tk := range tickets {
		if st, err := store.Status(ctxT(t), tk); err != nil || st.Result == nil || st.Result.StatusCode != 201 {
			t.Errorf("ticket %s after a second result: %+v %v", tk, st, err)
		}
	}
	// What it may not do.
	if err := wc.Publish(subject, []byte("an order of my own")); err != nil {
		t.Fatal(err)
	}
	if err := wc.Publish(queue.ReadySubject(name, "", "aaaaaaaaaaaaaaaaaaaaaaaaaa"), []byte("forged")); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"sluice.q.>", "_INBOX.>"} {
		if _, err := wc.SubscribeSync(s); err != nil {
			t.Fatal(err)
		}
	}
	pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if st, err := wjs.Stream(ctxT(t), "NOTIFICATIONS"); err != nil {
		t.Errorf("the worker user looks up its stream: %v", err)
	} else if err := st.Purge(pctx); err == nil {
		t.Error("the worker user purged the stream")
	}
	if err := wc.Flush(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the server's refusals", 30*time.Second, func() bool {
		v := violations.String()
		return strings.Contains(v, `Publish to "`+subject+`"`) && strings.Contains(v, `Publish to "sluice.q.`) &&
			strings.Contains(v, `Subscription to "sluice.q.>"`) && strings.Contains(v, `Subscription to "_INBOX.>"`) &&
			strings.Contains(v, `Publish to "$JS.API.STREAM.PURGE.NOTIFICATIONS"`)
	})
	if st, err := store.Status(ctxT(t), tickets[0]); err != nil || st.Status != queue.StatusDone {
		t.Errorf("after the refusals: %+v %v", st, err)
	}
}
