package subscriber_test

import (
	"bytes"
	"errors"
	"net/http"
	"net/textproto"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/subscriber"
)

// sameOrder reports whether a and b hold the same order (times compared as instants).
func sameOrder(a, b *subscriber.Order) bool {
	x, y := *a, *b
	if !x.ReceivedAt.Equal(y.ReceivedAt) {
		return false
	}
	x.ReceivedAt, y.ReceivedAt = time.Time{}, time.Time{}
	if len(x.Header) == 0 && len(y.Header) == 0 {
		x.Header, y.Header = nil, nil
	}
	if len(x.Body) == 0 && len(y.Body) == 0 {
		x.Body, y.Body = nil, nil
	}
	return reflect.DeepEqual(x, y)
}

// Encode and Decode are each other's inverse, in memory and through a NATS server's
// wire format: every field, repeated header values in order, absent optional fields,
// the delivery signature.
func TestEncodeDecodeRoundTrip(t *testing.T) {
	key := subscriber.DeliveryKey(signingKey, "pay")
	full := testOrder()
	full.Subject = "orders.paid"
	full.Rule, full.RawQuery, full.Client, full.IdempotencyKey, full.Fingerprint = "r", "a=1&b=%20", "c-hash", `"k-1"`, "f00d"
	full.ReceivedAt = time.Date(2026, 12, 1, 9, 30, 0, 500, time.UTC)
	full.Header = http.Header{"Content-Type": {"application/json"}, "X-Request-Id": {"r-1", "r-2", "r-1"},
		"Idempotency-Key": {`"k-1"`}, "Accept-Language": {"fr-CH, fr;q=0.9"}, "X-Name": {"Zoë ☃"}}
	full.Signature = subscriber.SignOrder(key, full)
	bare := &subscriber.Order{Ticket: "bbbbbbbbbbbbbbbbbbbbbbbbbb", Queue: "q", Method: "GET", Path: "/", Subject: "s", Header: http.Header{}}
	srv := natstest.Start(t)
	sub, err := srv.Conn.SubscribeSync("orders.paid")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []*subscriber.Order{full, bare} {
		msg := subscriber.Encode(o)
		if msg.Subject != o.Subject || msg.Header.Get(subscriber.HeaderMsgID) != o.Ticket {
			t.Errorf("%s: subject %q, Nats-Msg-Id %q", o.Ticket, msg.Subject, msg.Header.Get(subscriber.HeaderMsgID))
		}
		got, err := subscriber.Decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		if !sameOrder(got, o) {
			t.Errorf("decoded\n%+v\nwant\n%+v", got, o)
		}
		// Through the server: what a subscriber receives decodes to the same order.
		msg.Subject = "orders.paid"
		if err := srv.Conn.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
		in, err := sub.NextMsg(30 * time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if got, err = subscriber.Decode(in); err != nil {
			t.Fatal(err)
		}
		want := *o
		want.Subject = "orders.paid"
		if !sameOrder(got, &want) {
			t.Errorf("received\n%+v\nwant\n%+v", got, &want)
		}
	}
	v := mustVerifier(t, "pay", key)
	if got, err := subscriber.Decode(subscriber.Encode(full)); err != nil || v.Verify(got) != nil {
		t.Errorf("the round trip of a signed order does not verify: %v", err)
	}
}

// ReadOrder reads what Check refuses, so that sluice can dead-letter it; Decode refuses
// it with ErrNotOrder.
func TestReadOrderKeepsWhatCheckRefuses(t *testing.T) {
	o := testOrder()
	o.Path = "@evil.example/steal"
	msg := subscriber.Encode(o)
	got, err := subscriber.ReadOrder(msg.Subject, msg.Header, msg.Data)
	if err != nil || got.Path != o.Path {
		t.Fatalf("ReadOrder: %+v %v", got, err)
	}
	if err := got.Check(); !errors.Is(err, subscriber.ErrNotOrder) {
		t.Errorf("Check: %v", err)
	}
	if _, err := subscriber.Decode(msg); !errors.Is(err, subscriber.ErrNotOrder) {
		t.Errorf("Decode: %v", err)
	}
}

// FuzzEncodeDecode: decoding any message never panics, and an order Check accepts,
// with canonical header names that have values, comes back from Decode(Encode(…))
// field for field, with the same signature.
func FuzzEncodeDecode(f *testing.F) {
	f.Add("abcdefghijklmnopqrstuvwxyz", "pay", "r", "POST", "/v1/pay", "a=1", "c", "k", "ff", uint32(1764581400), uint32(500), "Content-Type", "application/json", "x", []byte(`{"n":1}`))
	f.Add("abcdefghijklmnopqrstuvwxyz", "pay", "", "GET", "/", "", "", "", "", uint32(0), uint32(0), "X-A", "1", "2", []byte(nil))
	f.Add("abcdefghijklmnopqrstuvwxyz", "pay", "", "GET", "@evil/x", "", "", "", "", uint32(0), uint32(0), "x-a", "", "", []byte{0})
	key := subscriber.DeliveryKey(signingKey, "pay")
	f.Fuzz(func(t *testing.T, ticket, queue, rule, method, path, query, client, idem, fp string, sec, nsec uint32, hk, hv1, hv2 string, body []byte) {
		o := &subscriber.Order{
			Ticket: ticket, Queue: queue, Rule: rule, Method: method, Path: path, RawQuery: query,
			Client: client, IdempotencyKey: idem, Fingerprint: fp, Body: body, Subject: "s",
			ReceivedAt: time.Unix(int64(sec), int64(nsec%1e9)).UTC(),
			Header:     http.Header{hk: {hv1, hv2}},
		}
		msg := subscriber.Encode(o)
		if _, err := subscriber.ReadOrder(msg.Subject, msg.Header, msg.Data); err != nil {
			t.Fatalf("ReadOrder of an encoded order: %v", err)
		}
		got, err := subscriber.Decode(msg)
		if o.Check() != nil {
			if !errors.Is(err, subscriber.ErrNotOrder) {
				t.Fatalf("Decode of an order Check refuses: %v", err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		if hk != "" && hk == textproto.CanonicalMIMEHeaderKey(hk) && !sameOrder(got, o) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, o)
		}
		again, err := subscriber.Decode(subscriber.Encode(got))
		if err != nil || subscriber.SignOrder(key, again) != subscriber.SignOrder(key, got) || !bytes.Equal(again.Body, o.Body) {
			t.Fatalf("a second round trip changed the order: %+v %v", again, err)
		}
	})
}
