package queue

import (
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/fieldtest"
	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// TestSameStreamFields holds sameStream to every field of jetstream.StreamConfig: each
// is compared (changing it alone in want makes sameStream false) or ignored for the
// reason given. A field that a nats.go upgrade adds fails here until it is put in one
// list or the other.
func TestSameStreamFields(t *testing.T) {
	base := jetstream.StreamConfig{Name: "Q_orders", Subjects: []string{"q.orders.>"}, Metadata: map[string]string{"sluice": "1"}}
	compared := []string{
		"Description", "Subjects", "Retention", "MaxMsgs", "MaxBytes", "Discard", "DiscardNewPerSubject",
		"MaxAge", "MaxMsgsPerSubject", "MaxMsgSize", "Storage", "Replicas", "Duplicates", "AllowRollup",
		"AllowDirect", "Metadata", "AllowMsgTTL", "SubjectDeleteMarkerTTL", "AllowAtomicPublish",
		"AllowMsgSchedules", "PersistMode",
	}
	const unset = "sluice does not set it: the server's default, or an operator's choice, stands"
	ignored := map[string]string{
		"Name":              "the stream is looked up by its name",
		"MaxConsumers":      unset,
		"NoAck":             unset,
		"Placement":         unset,
		"Mirror":            unset,
		"Sources":           unset,
		"Sealed":            unset,
		"DenyDelete":        unset,
		"DenyPurge":         unset,
		"Compression":       unset,
		"FirstSeq":          unset,
		"SubjectTransform":  unset,
		"RePublish":         unset,
		"MirrorDirect":      unset,
		"ConsumerLimits":    unset,
		"Template":          unset,
		"AllowMsgCounter":   unset,
		"AllowBatchPublish": unset,
	}
	fieldtest.Check(t, "sameStream", sameStream, base, compared, ignored)
}

// TestSameConsumerFields holds sameConsumer to every field of
// jetstream.ConsumerConfig, as TestSameStreamFields does for streams.
func TestSameConsumerFields(t *testing.T) {
	base := jetstream.ConsumerConfig{Durable: ConsumerName, FilterSubject: "q.orders.ready.*", AckPolicy: jetstream.AckExplicitPolicy}
	compared := []string{
		"AckPolicy", "AckWait", "MaxDeliver", "FilterSubject", "FilterSubjects", "MaxAckPending",
		"PriorityPolicy", "PinnedTTL", "PriorityGroups",
	}
	const unset = "sluice does not set it: the server's default stands"
	ignored := map[string]string{
		"Name":               "the consumer is looked up by its name",
		"Durable":            "the consumer is looked up by its name",
		"Description":        "text for operators; a difference needs no update",
		"DeliverPolicy":      "fixed at creation (the server refuses to change it); sluice always asks for all",
		"PauseUntil":         "the operator's pause, carried over from the consumer as it is (see Consumer.Ensure)",
		"Metadata":           "the server adds its own; sluice sets none",
		"OptStartSeq":        unset,
		"OptStartTime":       unset,
		"BackOff":            unset,
		"ReplayPolicy":       unset,
		"RateLimit":          unset,
		"SampleFrequency":    unset,
		"MaxWaiting":         unset,
		"HeadersOnly":        unset,
		"MaxRequestBatch":    unset,
		"MaxRequestExpires":  unset,
		"MaxRequestMaxBytes": unset,
		"InactiveThreshold":  unset,
		"Replicas":           unset,
		"MemoryStorage":      unset,
		"DeliverSubject":     unset,
		"DeliverGroup":       unset,
		"FlowControl":        unset,
		"IdleHeartbeat":      unset,
	}
	fieldtest.Check(t, "sameConsumer", sameConsumer, base, compared, ignored)
}

// TestEnsureAbsentStreamCreates: a stream that was not found when looked up is
// created, not updated, so that the settings another replica has just created it with
// are not rewritten while it creates consumers on the stream (nats-server does not
// serialise the two: the race detector saw it when two replicas started together);
// only settings that differ are updated.
func TestEnsureAbsentStreamCreates(t *testing.T) {
	s, _, ctx, srv := openInternalServer(t, queueconfig.Config{Name: "q", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1"})
	want := jetstream.StreamConfig{Name: "ENSURED", Subjects: []string{"ensured.>"}, Storage: jetstream.MemoryStorage}
	var st jetstream.Stream
	updates := natstest.PublishedDuring(t, srv.Conn, "$JS.API.STREAM.UPDATE.>", func() {
		for range 3 { // the first creates it; the others, not told it exists, find it the same
			if _, err := s.ensureFrom(ctx, nil, want); err != nil {
				t.Fatal(err)
			}
		}
		want.MaxMsgs = 7
		var err error
		if st, err = s.ensureFrom(ctx, nil, want); err != nil {
			t.Fatal(err)
		}
	})
	if got := st.CachedInfo().Config.MaxMsgs; got != 7 {
		t.Errorf("MaxMsgs %d after ensuring other settings, want 7", got)
	}
	if len(updates) != 1 {
		t.Errorf("stream updates %v, want one (the changed settings)", updates)
	}
}
