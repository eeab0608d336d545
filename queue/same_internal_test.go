package queue

import (
	"reflect"
	"slices"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
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
	checkFields(t, "sameStream", sameStream, base, compared, ignored)
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
	checkFields(t, "sameConsumer", sameConsumer, base, compared, ignored)
}

// checkFields checks that compared and ignored name each field of T once, that same
// finds a change of each compared field alone, and that it lets a change of each
// ignored field through (where perturb can make one).
func checkFields[T any](t *testing.T, name string, same func(have, want T) bool, base T, compared []string, ignored map[string]string) {
	t.Helper()
	typ := reflect.TypeFor[T]()
	listed := map[string]bool{}
	for _, f := range compared {
		if _, ok := ignored[f]; ok {
			t.Errorf("%s: %s is listed as compared and as ignored", name, f)
		}
		listed[f] = true
	}
	for f := range ignored {
		listed[f] = true
	}
	var fields []string
	for f := range typ.Fields() {
		if !f.IsExported() || f.Anonymous {
			continue
		}
		fields = append(fields, f.Name)
		if !listed[f.Name] {
			t.Errorf("%s: %s.%s is new: compare it in %s or list it as ignored, with the reason", name, typ, f.Name, name)
		}
	}
	for f := range listed {
		if !slices.Contains(fields, f) {
			t.Errorf("%s: %s has no field %s any more", name, typ, f)
		}
	}
	if !same(base, base) {
		t.Fatalf("%s: the base configuration differs from itself", name)
	}
	for _, f := range compared {
		want := base
		if !perturb(reflect.ValueOf(&want).Elem().FieldByName(f)) {
			t.Errorf("%s: cannot change %s to check that it is compared", name, f)
			continue
		}
		if same(base, want) {
			t.Errorf("%s: a change of %s alone goes unseen, though it is listed as compared", name, f)
		}
	}
	for f := range ignored {
		want := base
		if perturb(reflect.ValueOf(&want).Elem().FieldByName(f)) && !same(base, want) {
			t.Errorf("%s: a change of %s alone is seen, though it is listed as ignored", name, f)
		}
	}
}

// perturb changes v to another value of its type (for a stream limit, one that limit
// does not fold into "none"), or reports that it cannot.
func perturb(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Bool:
		v.SetBool(!v.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(max(v.Int(), 6) + 1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(v.Uint() + 1)
	case reflect.Float32, reflect.Float64:
		v.SetFloat(v.Float() + 1)
	case reflect.String:
		v.SetString(v.String() + "x")
	case reflect.Slice:
		v.Set(reflect.Append(reflect.AppendSlice(reflect.MakeSlice(v.Type(), 0, v.Len()+1), v), reflect.Zero(v.Type().Elem())))
	case reflect.Map:
		if v.Type().Key().Kind() != reflect.String {
			return false
		}
		m := reflect.MakeMap(v.Type())
		for k, e := range v.Seq2() {
			m.SetMapIndex(k, e)
		}
		e := reflect.New(v.Type().Elem()).Elem()
		perturb(e) // not the zero value, which a lookup of a missing key returns too
		m.SetMapIndex(reflect.ValueOf("perturbed").Convert(v.Type().Key()), e)
		v.Set(m)
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		} else {
			v.SetZero()
		}
	default:
		return false
	}
	return true
}
