package embedded

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// While JetStream restarts, no client is told that a stream or consumer it had does
// not exist: nats-server answers its API before it has reopened them, and a client
// that declares them anew on that answer would put a second store over their files,
// or a consumer without its state. Clients asking in a loop, over the in-process
// connection and over TCP, with the token, through thirty restarts: every answer is
// the stream as it was, or no answer; the consumer keeps its acknowledgements. Fails
// without loginGate ("not found" 6 to 110 times a run, in 8 runs of 8).
func TestNoClientSeesARestartHalfDone(t *testing.T) {
	e, err := Start(Config{DataDir: t.TempDir(), Listen: "127.0.0.1:0", Token: "s3cret"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	inProcess, err := e.Connect()
	if err != nil {
		t.Fatal(err)
	}
	defer inProcess.Close()
	overTCP, err := nats.Connect(e.ClientURL(), nats.Token("s3cret"), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer overTCP.Close()
	if nc, err := nats.Connect(e.ClientURL(), nats.Token("wrong")); err == nil {
		nc.Close()
		t.Fatal("a wrong token logged in")
	}

	js, _ := jetstream.New(inProcess)
	const streams, msgs = 60, 100
	name := func(i int) string { return fmt.Sprintf("S%02d", i) }
	config := func(i int) jetstream.StreamConfig {
		return jetstream.StreamConfig{Name: name(i), Subjects: []string{name(i)}, Storage: jetstream.FileStorage}
	}
	for i := range streams {
		if _, err := js.CreateStream(ctx, config(i)); err != nil {
			t.Fatal(err)
		}
		for range msgs {
			if _, err := js.Publish(ctx, name(i), make([]byte, 1000)); err != nil {
				t.Fatal(err)
			}
		}
	}
	last := streams - 1
	cons, err := js.CreateOrUpdateConsumer(ctx, name(last), jetstream.ConsumerConfig{Durable: "D", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(msgs / 2)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		if err := m.DoubleAck(ctx); err != nil {
			t.Fatal(err)
		}
	}

	var notFound, answered atomic.Int64
	stop := make(chan struct{})
	var askers sync.WaitGroup
	for _, nc := range []*nats.Conn{inProcess, overTCP, inProcess, overTCP} {
		js, _ := jetstream.New(nc)
		askers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				_, serr := js.Stream(actx, name(last))
				_, cerr := js.Consumer(actx, name(last), "D")
				cancel()
				for _, err := range []error{serr, cerr} {
					switch {
					case err == nil:
						answered.Add(1)
					case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
						notFound.Add(1)
					}
				}
				if serr != nil || cerr != nil {
					time.Sleep(time.Millisecond) // disconnected: its reconnection
				}
			}
		})
	}
	for range 30 {
		if err := e.restartJetStream(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // the askers back in
	}
	close(stop)
	askers.Wait()
	w := time.Now()
	for !inProcess.IsConnected() || !overTCP.IsConnected() {
		time.Sleep(time.Millisecond)
	}
	t.Logf("reconnected after %v; in-process reconnects %d, tcp %d", time.Since(w), inProcess.Stats().Reconnects, overTCP.Stats().Reconnects)
	if n := notFound.Load(); n > 0 {
		t.Errorf("a stream or consumer was 'not found' %d times during the restarts (%d answers)", n, answered.Load())
	}
	if answered.Load() == 0 {
		t.Error("no asker had an answer: the test tested nothing")
	}
	for i := range streams {
		st, err := js.Stream(ctx, name(i))
		if err != nil {
			t.Fatalf("%s: %v", name(i), err)
		}
		if got := st.CachedInfo().State.Msgs; got != msgs {
			t.Errorf("%s holds %d messages, want %d", name(i), got, msgs)
		}
	}
	info, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != msgs/2 {
		t.Errorf("the consumer's ack floor is %d after the restarts, want %d", info.AckFloor.Stream, msgs/2)
	}
}
