package jsproto_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/natstest"
)

func setup(t *testing.T) (*natstest.Server, jetstream.JetStream, context.Context) {
	t.Helper()
	srv := natstest.Start(t)
	js, err := jetstream.New(srv.Conn)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return srv, js, ctx
}

func stream(t *testing.T, ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) jetstream.Stream {
	t.Helper()
	st, err := js.CreateStream(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, subject, data string) uint64 {
	t.Helper()
	ack, err := js.Publish(ctx, subject, []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// KVPut writes a key the bucket's own API reads, with its TTL as the message's, and
// a compare-and-set on a stale revision is IsWrongLastSequence; KVStream and KVSubject
// name what the bucket's API uses.
func TestKVPut(t *testing.T) {
	_, js, ctx := setup(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "b", LimitMarkerTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, jsproto.KVStream("b"))
	if err != nil {
		t.Fatalf("the bucket's stream %s: %v", jsproto.KVStream("b"), err)
	}
	ack, err := jsproto.KVPut(ctx, js, "b", "k", []byte("one"), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "k")
	if err != nil || string(e.Value()) != "one" || e.Revision() != ack.Sequence {
		t.Fatalf("Get after KVPut: %v %v (ack %d)", e, err, ack.Sequence)
	}
	raw, err := st.GetLastMsgForSubject(ctx, jsproto.KVSubject("b", "k"))
	if err != nil || raw.Header.Get(jetstream.MsgTTLHeader) != "1h0m0s" {
		t.Fatalf("the stored message on %s: %+v %v", jsproto.KVSubject("b", "k"), raw, err)
	}
	if _, err := jsproto.KVPut(ctx, js, "b", "k", []byte("two"), time.Hour, jetstream.WithExpectLastSequencePerSubject(ack.Sequence)); err != nil {
		t.Fatalf("compare-and-set on the current revision: %v", err)
	}
	_, err = jsproto.KVPut(ctx, js, "b", "k", []byte("three"), time.Hour, jetstream.WithExpectLastSequencePerSubject(ack.Sequence))
	if !jsproto.IsWrongLastSequence(err) {
		t.Fatalf("compare-and-set on a stale revision: %v, want IsWrongLastSequence", err)
	}
	if e, _ := kv.Get(ctx, "k"); string(e.Value()) != "two" {
		t.Fatalf("value %q, want two", e.Value())
	}
	if jsproto.IsWrongLastSequence(errors.New("other")) || jsproto.IsWrongLastSequence(nil) {
		t.Fatal("IsWrongLastSequence of another error")
	}
}

// LeaderMsg reads by sequence, first on a subject from a sequence, and last on a
// subject, headers included; a missing message is jetstream.ErrMsgNotFound, a missing
// stream the server's error.
func TestLeaderMsg(t *testing.T) {
	srv, js, ctx := setup(t)
	stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	publish(t, ctx, js, "s.a", "a1")
	m := nats.NewMsg("s.b")
	m.Data, m.Header = []byte("b1"), nats.Header{"X-H": {"v"}}
	if _, err := js.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, "s.a", "a2")
	for _, tc := range []struct {
		q    jsproto.MsgQuery
		data string
		seq  uint64
	}{
		{jsproto.MsgQuery{Seq: 2}, "b1", 2},
		{jsproto.MsgQuery{Seq: 2, Next: "s.a"}, "a2", 3},
		{jsproto.MsgQuery{Last: "s.a"}, "a2", 3},
		{jsproto.MsgQuery{Seq: 1, Next: "s.*"}, "a1", 1},
	} {
		got, err := jsproto.LeaderMsg(ctx, srv.Conn, "S", tc.q)
		if err != nil || string(got.Data) != tc.data || got.Sequence != tc.seq || got.Time.IsZero() {
			t.Errorf("%+v: %+v %v, want %s at %d", tc.q, got, err, tc.data, tc.seq)
		}
	}
	if got, err := jsproto.LeaderMsg(ctx, srv.Conn, "S", jsproto.MsgQuery{Seq: 2}); err != nil || got.Header.Get("X-H") != "v" || got.Subject != "s.b" {
		t.Errorf("headers and subject: %+v %v", got, err)
	}
	if _, err := jsproto.LeaderMsg(ctx, srv.Conn, "S", jsproto.MsgQuery{Seq: 4, Next: "s.a"}); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("past the last: %v, want ErrMsgNotFound", err)
	}
	if _, err := jsproto.LeaderMsg(ctx, srv.Conn, "NONE", jsproto.MsgQuery{Seq: 1}); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("no such stream: %v, want ErrStreamNotFound", err)
	}
}

// A stream leader that drops a request (as nats-server does while the stream's group
// elects a leader) gets it again: LeaderMsg does not wait for its whole deadline. The
// leader here is a subscriber, which answers the second request only: the server maps the stream's API subject to the subscriber's.
func TestLeaderMsgAsksAgain(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "leader.conf")
	if err := os.WriteFile(conf, []byte(`mappings { "$JS.API.STREAM.MSG.GET.*": "test.leader.{{wildcard(1)}}" }`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartConfig(t, conf)
	nc := srv.Connect(t)
	asked := make(chan struct{}, 10)
	_, err := nc.Subscribe("test.leader.S", func(m *nats.Msg) {
		asked <- struct{}{}
		if len(asked) == 1 {
			return // dropped
		}
		_ = m.Respond([]byte(`{"message":{"subject":"s.a","seq":7,"data":"YTE=","time":"2026-12-01T00:00:00Z"}}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*jsproto.LeaderWait)
	defer cancel()
	got, err := jsproto.LeaderMsg(ctx, nc, "S", jsproto.MsgQuery{Last: "s.a"})
	if err != nil || got.Sequence != 7 || string(got.Data) != "a1" {
		t.Fatalf("LeaderMsg: %+v %v, want a1 at 7", got, err)
	}
	if n := len(asked); n != 2 {
		t.Errorf("asked %d times, want 2", n)
	}
	// A leader that never answers: LeaderMsg ends with ctx.
	if _, err := nc.Subscribe("test.leader.SILENT", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(context.Background(), jsproto.LeaderWait*3/2)
	defer cancel()
	if _, err := jsproto.LeaderMsg(short, nc, "SILENT", jsproto.MsgQuery{Seq: 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a silent leader: %v, want context.DeadlineExceeded", err)
	}
}

// AskAgain sends a read again when no answer came within LeaderWait, stops at the
// first answer or error that is not a missing answer, and ends with its context.
func TestAskAgain(t *testing.T) {
	srv, _, _ := setup(t)
	nc := srv.Conn
	asked := 0
	sub, err := nc.Subscribe("test.drops-first", func(m *nats.Msg) {
		asked++ // the handler runs on one goroutine
		if asked > 1 {
			_ = m.Respond([]byte("answer"))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, err := nc.Subscribe("test.silent", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	request := func(subject string, tries *int) func(context.Context) (*nats.Msg, error) {
		return func(ctx context.Context) (*nats.Msg, error) {
			*tries++
			return nc.RequestWithContext(ctx, subject, nil)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*jsproto.LeaderWait)
	defer cancel()
	var tries int
	m, err := jsproto.AskAgain(ctx, request("test.drops-first", &tries))
	if err != nil || string(m.Data) != "answer" || tries < 2 {
		t.Fatalf("a dropped request: %v %v after %d tries, want the answer after at least 2", m, err, tries)
	}
	tries = 0
	if _, err := jsproto.AskAgain(ctx, request("test.nobody", &tries)); !errors.Is(err, nats.ErrNoResponders) || tries != 1 {
		t.Errorf("no responders: %v after %d tries, want ErrNoResponders at once", err, tries)
	}
	short, cancel := context.WithTimeout(context.Background(), jsproto.LeaderWait*5/2)
	defer cancel()
	tries = 0
	if _, err := jsproto.AskAgain(short, request("test.silent", &tries)); !errors.Is(err, context.DeadlineExceeded) || tries < 2 {
		t.Errorf("a silent responder: %v after %d tries, want context.DeadlineExceeded after asking again", err, tries)
	}
}

// PurgeBelow removes the messages on the filter below the sequence, and only those,
// and says how many went.
func TestPurgeBelow(t *testing.T) {
	srv, js, ctx := setup(t)
	st := stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	for i := range 6 {
		publish(t, ctx, js, fmt.Sprintf("s.%c", "ab"[i%2]), "x") // a at 1, 3, 5
	}
	n, err := jsproto.PurgeBelow(ctx, srv.Conn, "S", "s.a", 5)
	if err != nil || n != 2 {
		t.Fatalf("PurgeBelow: %d %v, want 2", n, err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.State.Msgs != 4 {
		t.Fatalf("left: %+v %v, want 4", info.State, err)
	}
	if _, err := st.GetMsg(ctx, 5); err != nil {
		t.Errorf("the message at the bound went: %v", err)
	}
	if _, err := jsproto.PurgeBelow(ctx, srv.Conn, "NONE", "s.a", 5); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("no such stream: %v, want ErrStreamNotFound", err)
	}
}

// fetchOne fetches the next message of cons within wait (nil: none came).
func fetchOne(t *testing.T, cons jetstream.Consumer, wait time.Duration, opts ...jetstream.FetchOpt) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, append(opts, jetstream.FetchMaxWait(wait))...)
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		return m
	}
	return nil
}

// InProgress and NakWithDelay are answered by the consumer (a request, unlike the
// client's own forms), and fail once it is gone; a nak's delay holds the message
// back, and a short one lets it come again.
func TestAcknowledgements(t *testing.T) {
	srv, js, ctx := setup(t)
	st := stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	publish(t, ctx, js, "s.a", "x")
	cons, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "c", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m := fetchOne(t, cons, 5*time.Second)
	if m == nil {
		t.Fatal("no message")
	}
	if err := jsproto.InProgress(ctx, srv.Conn, m); err != nil {
		t.Fatalf("InProgress: %v", err)
	}
	if err := jsproto.NakWithDelay(ctx, srv.Conn, m, time.Hour); err != nil {
		t.Fatalf("NakWithDelay: %v", err)
	}
	if again := fetchOne(t, cons, 300*time.Millisecond); again != nil {
		t.Fatal("a message handed back for an hour came again at once")
	}
	info, err := cons.Info(ctx)
	if err != nil || info.NumAckPending != 1 {
		t.Fatalf("consumer after the nak: %+v %v, want one pending", info, err)
	}
	// The delay is the message's new deadline: a nak with a short one brings it back.
	if err := st.DeleteConsumer(ctx, "c"); err != nil {
		t.Fatal(err)
	}
	cons, err = st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "d", AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m = fetchOne(t, cons, 5*time.Second)
	if m == nil {
		t.Fatal("no message for the second consumer")
	}
	if err := jsproto.NakWithDelay(ctx, srv.Conn, m, time.Millisecond); err != nil {
		t.Fatalf("NakWithDelay: %v", err)
	}
	again := fetchOne(t, cons, 10*time.Second)
	if again == nil {
		t.Fatal("a message handed back for a millisecond did not come again")
	}
	if md, err := again.Metadata(); err != nil || md.NumDelivered != 2 {
		t.Fatalf("redelivery: %+v %v", md, err)
	}
	// Nobody answers for a consumer that is gone.
	if err := st.DeleteConsumer(ctx, "d"); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := jsproto.InProgress(wctx, srv.Conn, again); err == nil {
		t.Error("InProgress of a deleted consumer's message was answered")
	}
	if err := jsproto.NakWithDelay(wctx, srv.Conn, again, time.Second); err == nil {
		t.Error("NakWithDelay of a deleted consumer's message was answered")
	}
}

// PinID is the pin a pinned priority group's consumer gave the fetch, and empty for a
// consumer without one.
func TestPinID(t *testing.T) {
	_, js, ctx := setup(t)
	st := stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	publish(t, ctx, js, "s.a", "x")
	publish(t, ctx, js, "s.a", "y")
	pinned, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "p", AckPolicy: jetstream.AckExplicitPolicy,
		PriorityPolicy: jetstream.PriorityPolicyPinned, PriorityGroups: []string{"g"}, PinnedTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	m := fetchOne(t, pinned, 5*time.Second, jetstream.FetchPriorityGroup("g"))
	if m == nil {
		t.Fatal("no message")
	}
	info, err := pinned.Info(ctx)
	if err != nil || len(info.PriorityGroups) != 1 || info.PriorityGroups[0].PinnedClientID == "" {
		t.Fatalf("pinned consumer: %+v %v", info, err)
	}
	if got, want := jsproto.PinID(m), info.PriorityGroups[0].PinnedClientID; got != want {
		t.Errorf("PinID %q, want the consumer's pinned client %q", got, want)
	}
	plain, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "q", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	if m := fetchOne(t, plain, 5*time.Second); m == nil || jsproto.PinID(m) != "" {
		t.Errorf("a consumer without a pin: %v", m)
	}
}

// PublishBatch stores a batch whole, with consecutive sequences, each message keeping
// the batch headers in the stream and losing them in the caller's hands; a batch with
// one message the stream refuses stores nothing and is the server's error.
func TestPublishBatch(t *testing.T) {
	srv, js, ctx := setup(t)
	st := stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}, AllowAtomicPublish: true, Duplicates: time.Minute})
	publish(t, ctx, js, "s.first", "x")
	msgs := func(ids ...string) []*nats.Msg {
		var out []*nats.Msg
		for _, id := range ids {
			m := nats.NewMsg("s." + id)
			m.Data = []byte(id)
			m.Header.Set(jetstream.MsgIDHeader, id)
			out = append(out, m)
		}
		return out
	}
	batch := msgs("a", "b", "c")
	acks, err := jsproto.PublishBatch(ctx, srv.Conn, "batch1", batch)
	if err != nil {
		t.Fatal(err)
	}
	for i, ack := range acks {
		if ack.Stream != "S" || ack.Sequence != uint64(i+2) {
			t.Errorf("ack %d: %+v, want sequence %d", i, ack, i+2)
		}
		if h := batch[i].Header; h.Get(jsproto.HeaderBatchID) != "" || h.Get(jsproto.HeaderBatchSeq) != "" || h.Get(jsproto.HeaderBatchCommit) != "" {
			t.Errorf("message %d kept the batch headers: %v", i, h)
		}
		raw, err := st.GetMsg(ctx, ack.Sequence)
		if err != nil || string(raw.Data) != "abc"[i:i+1] || raw.Header.Get(jsproto.HeaderBatchID) != "batch1" {
			t.Errorf("stored %d: %+v %v", i, raw, err)
		}
	}
	// "b" repeats a stored message id: the batch is refused whole.
	if _, err := jsproto.PublishBatch(ctx, srv.Conn, "batch2", msgs("d", "b", "e")); jsproto.Description(err) == "" {
		t.Fatalf("a batch with a duplicate: %v, want the server's refusal", err)
	}
	if info, err := st.Info(ctx); err != nil || info.State.Msgs != 4 {
		t.Fatalf("after the refused batch: %+v %v, want 4 messages", info.State, err)
	}
	// A stream that does not allow batches refuses them (on a server that knows them).
	stream(t, ctx, js, jetstream.StreamConfig{Name: "N", Subjects: []string{"n.>"}})
	m := nats.NewMsg("n.x")
	m.Data = []byte("x")
	if _, err := jsproto.PublishBatch(ctx, srv.Conn, "batch3", []*nats.Msg{m, nats.NewMsg("n.y")}); err == nil {
		t.Fatal("a stream without AllowAtomicPublish took a batch")
	}
}

// The classifications of the server's refusals, each made by a real server.
func TestErrors(t *testing.T) {
	_, js, ctx := setup(t)
	stream(t, ctx, js, jetstream.StreamConfig{Name: "FULL", Subjects: []string{"full.>"}, MaxMsgs: 1, Discard: jetstream.DiscardNew})
	stream(t, ctx, js, jetstream.StreamConfig{Name: "SUBJ", Subjects: []string{"subj.>"}, MaxMsgsPerSubject: 1,
		Discard: jetstream.DiscardNew, DiscardNewPerSubject: true})
	stream(t, ctx, js, jetstream.StreamConfig{Name: "SIZE", Subjects: []string{"size.>"}, MaxMsgSize: 16})
	stream(t, ctx, js, jetstream.StreamConfig{Name: "HDR", Subjects: []string{"hdr.>"}})
	publish(t, ctx, js, "full.a", "x")
	publish(t, ctx, js, "subj.a", "x")
	_, full := js.Publish(ctx, "full.b", []byte("x"))
	_, subj := js.Publish(ctx, "subj.a", []byte("x"))
	_, size := js.Publish(ctx, "size.a", []byte(strings.Repeat("x", 64)))
	m := nats.NewMsg("hdr.a")
	for i := range 3000 {
		m.Header.Set(fmt.Sprintf("X-Header-%d", i), strings.Repeat("v", 16))
	}
	_, hdr := js.PublishMsg(ctx, m)
	other := errors.New("other")
	for _, tc := range []struct {
		name string
		is   func(error) bool
		yes  []error
		no   []error
	}{
		{"IsFull", jsproto.IsFull, []error{full, subj}, []error{size, hdr, other, nil}},
		{"IsPerSubjectLimit", jsproto.IsPerSubjectLimit, []error{subj}, []error{full, size, hdr, other, nil}},
		{"IsMsgTooLarge", jsproto.IsMsgTooLarge, []error{size}, []error{full, subj, hdr, other, nil}},
		{"IsHeaderTooLarge", jsproto.IsHeaderTooLarge, []error{hdr}, []error{full, subj, size, other, nil}},
		{"IsNoResources", jsproto.IsNoResources, nil, []error{full, subj, size, hdr, other, nil}},
	} {
		for _, err := range tc.yes {
			if !tc.is(err) {
				t.Errorf("%s(%v) false", tc.name, err)
			}
		}
		for _, err := range tc.no {
			if tc.is(err) {
				t.Errorf("%s(%v) true", tc.name, err)
			}
		}
	}
	if d := jsproto.Description(full); !strings.Contains(d, "maximum messages exceeded") {
		t.Errorf("Description: %q", d)
	}
	if d := jsproto.Description(fmt.Errorf("wrapped: %w", other)); d != "" {
		t.Errorf("Description of an error that is not the server's: %q", d)
	}
}

// A server without a memory store refuses a memory stream as IsNoMemory, and a file
// stream's other refusals are not that.
func TestNoMemory(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "nomem.conf")
	if err := os.WriteFile(conf, []byte("jetstream { max_memory_store: 0 }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartConfig(t, conf)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "M", Subjects: []string{"m"}, Storage: jetstream.MemoryStorage})
	if !jsproto.IsNoMemory(err) {
		t.Errorf("a memory stream: %v, want IsNoMemory", err)
	}
	stream(t, ctx, js, jetstream.StreamConfig{Name: "F", Subjects: []string{"f"}})
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "G", Subjects: []string{"f"}})
	if err == nil || jsproto.IsNoMemory(err) {
		t.Errorf("overlapping subjects: %v, want another refusal", err)
	}
}

// A server whose JetStream store is full refuses a write as IsNoResources.
func TestNoResources(t *testing.T) {
	conf := filepath.Join(t.TempDir(), "small.conf")
	if err := os.WriteFile(conf, []byte("jetstream { max_file_store: 1MB }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := natstest.StartConfig(t, conf)
	nc := srv.Connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stream(t, ctx, js, jetstream.StreamConfig{Name: "S", Subjects: []string{"s.>"}})
	body := make([]byte, 32<<10)
	for i := range 200 {
		_, err := js.Publish(ctx, "s.a", body)
		if err == nil {
			continue
		}
		if !jsproto.IsNoResources(err) || jsproto.IsFull(err) {
			t.Fatalf("write %d on a full store: %v, want IsNoResources", i, err)
		}
		return
	}
	t.Fatal("200 writes of 32 KiB fit a 1 MB store")
}
