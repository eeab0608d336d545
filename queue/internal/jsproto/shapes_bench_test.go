package jsproto_test

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/queue/internal/jsproto"
	"github.com/sluicehq/sluice/queue/natstest"
)

// BenchmarkKeyedWriteShapes measures, on the server sluice embeds (one node, every
// write synced) and on a three-node cluster of nats-server processes (R3), what one
// synced write per keyed order could look like, beside the plain synchronous publish
// of an order: the same publish with an expected-last-sequence check of 0 on its own
// subject, and on a wildcard subject (Nats-Expected-Last-Subject-Sequence-Subject:
// the order's ticket under any prefix), and atomic batches of two messages (a key
// marker checked like that, and the order) and three (a per-client slot under a
// discard-new per-subject limit before them). Every message is a new subject, so
// every check passes: this is the price of the shapes, not of refusals.
//
//	go test -run '^$' -bench KeyedWriteShapes -count 3 ./queue/internal/jsproto/
func BenchmarkKeyedWriteShapes(b *testing.B) {
	b.Run("server=embedded", func(b *testing.B) {
		srv := natstest.Start(b)
		benchShapes(b, srv.Conn, 1)
	})
	b.Run("server=cluster", func(b *testing.B) {
		c := natstest.StartCluster(b, 3)
		benchShapes(b, c.Connect(b), 3)
	})
}

func benchShapes(b *testing.B, nc *nats.Conn, replicas int) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "Q",
		Subjects:  []string{"o.q.*", "o.k.*", "o.c.*"},
		Retention: jetstream.LimitsPolicy, Discard: jetstream.DiscardNew, DiscardNewPerSubject: true,
		MaxMsgsPerSubject: 1 << 20, AllowAtomicPublish: true, AllowMsgTTL: true, Replicas: replicas}); err != nil {
		b.Fatal(err)
	}
	body := make([]byte, 512)
	var seq atomic.Int64
	order := func(ticket string) *nats.Msg {
		m := nats.NewMsg("o.q." + ticket)
		m.Data = body
		return m
	}
	checked := func(m *nats.Msg, subject string) *nats.Msg {
		m.Header.Set(jetstream.ExpectedLastSubjSeqHeader, "0")
		if subject != "" {
			m.Header.Set("Nats-Expected-Last-Subject-Sequence-Subject", subject)
		}
		return m
	}
	batch := func(msgs ...*nats.Msg) error {
		_, err := jsproto.PublishBatch(ctx, nc, "b"+strconv.FormatInt(seq.Add(1), 36), msgs)
		return err
	}
	shapes := []struct {
		name string
		op   func(ticket string) error
	}{
		{"publish", func(t string) error { _, err := js.PublishMsg(ctx, order(t)); return err }},
		{"check-own-subject", func(t string) error { _, err := js.PublishMsg(ctx, checked(order(t), "")); return err }},
		{"check-wildcard", func(t string) error { _, err := js.PublishMsg(ctx, checked(order(t), "o.*."+t)); return err }},
		{"batch-marker-order", func(t string) error {
			return batch(checked(nats.NewMsg("o.k."+t), ""), order(t))
		}},
		{"batch-slot-marker-order", func(t string) error {
			slot := nats.NewMsg("o.c.client" + t[len(t)-1:])
			slot.Header.Set(jetstream.MsgTTLHeader, "1h")
			return batch(slot, checked(nats.NewMsg("o.k."+t), ""), order(t))
		}},
	}
	for _, callers := range []int{1, 16} {
		for _, s := range shapes {
			b.Run(fmt.Sprintf("%s/callers=%d", s.name, callers), func(b *testing.B) {
				op := func() {
					if err := s.op("t" + strconv.FormatInt(seq.Add(1), 36)); err != nil {
						b.Error(err)
					}
				}
				if callers == 1 {
					for range b.N {
						op()
					}
					return
				}
				b.SetParallelism((callers + 1) / 2) // 2 cores: 16 goroutines
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						op()
					}
				})
			})
		}
	}
}
