package subscriber_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/sluicehq/sluice/queue/subscriber"
)

// specKey is the signing key of the package documentation's worked example.
var specKey = func() []byte {
	k := make([]byte, 32)
	for i := range k {
		k[i] = byte(i)
	}
	return k
}()

// pyResult is what testdata/verify.py answers.
type pyResult struct {
	DeliveryKey     string `json:"delivery_key"`
	Verified        bool   `json:"verified"`
	Signature       string `json:"signature"`
	ResultSignature string `json:"result_signature"`
}

// verifyInPython runs testdata/verify.py, the documentation's specification written
// in Python with its standard library, on a delivered message.
func verifyInPython(t *testing.T, queue string, msg *nats.Msg, res *subscriber.Result) pyResult {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		if runtime.GOOS == "linux" && os.Getenv("CI") != "" {
			t.Fatal("python3 is not installed")
		}
		t.Skip("python3 is not installed: the specification is not checked from outside Go")
	}
	var pairs [][2]string
	for k, vs := range msg.Header {
		for _, v := range vs {
			pairs = append(pairs, [2]string{k, v})
		}
	}
	in := map[string]any{"signing_key": hex.EncodeToString(specKey), "queue": queue, "headers": pairs,
		"body": base64.StdEncoding.EncodeToString(msg.Data)}
	if res != nil {
		var rh [][2]string
		for k, vs := range res.Header {
			for _, v := range vs {
				rh = append(rh, [2]string{k, v})
			}
		}
		in["result"] = map[string]any{"status": res.StatusCode, "truncated": res.Truncated, "headers": rh,
			"body": base64.StdEncoding.EncodeToString(res.Body)}
	}
	b, _ := json.Marshal(in)
	cmd := exec.Command(py, "testdata/verify.py")
	cmd.Stdin = bytes.NewReader(b)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("verify.py: %v", err)
	}
	var r pyResult
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("verify.py: %q: %v", out, err)
	}
	return r
}

// signed returns msg with the delivery signature sluice sets: over the order as
// Decode reads the message (queue.Store.Forward does the same).
func signed(t *testing.T, queue string, msg *nats.Msg) *nats.Msg {
	t.Helper()
	o, err := subscriber.Decode(msg)
	if err != nil {
		t.Fatal(err)
	}
	msg.Header.Set(subscriber.HeaderDeliverySignature, subscriber.SignOrder(subscriber.DeliveryKey(specKey, queue), o))
	return msg
}

// The signatures of orders and results follow the package documentation byte for byte:
// a Python implementation of it alone (testdata/verify.py) derives the same delivery key,
// verifies the orders Go signs (the worked example, and one with repeated headers, no
// Sluice-Received-At, an idempotency key and non-ASCII values) and computes the same
// result signatures; the documentation's worked example is what Go computes.
func TestSignaturesFromTheSpecification(t *testing.T) {
	example := nats.NewMsg("orders.in")
	for k, v := range map[string]string{
		"Sluice-Ticket": "abcdefghijklmnopqrstuvwxyz", "Sluice-Queue": "orders", "Sluice-Rule": "create-order",
		"Sluice-Method": "POST", "Sluice-Path": "/v1/orders", "Sluice-Query": "n=1",
		"Sluice-Received-At": "2026-12-01T09:30:00.5Z", "Sluice-Client": "c1", "Sluice-Fingerprint": "ff",
		"Sluice-H-Content-Type": "application/json",
	} {
		example.Header.Set(k, v)
	}
	example.Data = []byte(`{"n":1}`)
	signed(t, "orders", example)
	exampleResult := &subscriber.Result{StatusCode: 201, Header: http.Header{"Location": {"/orders/1"}}, Body: []byte("ok")}

	other := nats.NewMsg("orders.in")
	other.Header["Sluice-Ticket"] = []string{"zyxwvutsrqponmlkjihgfedcba"}
	other.Header["Sluice-Queue"] = []string{"orders"}
	other.Header["Sluice-Method"] = []string{"PUT"}
	other.Header["Sluice-Path"] = []string{"/v1/caf%C3%A9"}
	other.Header["Sluice-Idempotency-Key"] = []string{`"order-7"`}
	other.Header["Sluice-H-X-Tag"] = []string{"b", "a", "ü"}
	other.Header["Sluice-H-Accept"] = []string{"*/*"}
	other.Header["Traceparent"] = []string{"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	other.Data = []byte{0, 1, 2, 0xff}
	signed(t, "orders", other)
	otherResult := &subscriber.Result{StatusCode: 409, Truncated: true, Header: http.Header{"X-B": {"2", "1"}, "X-A": {"é"}}, Body: nil}

	v, err := subscriber.NewVerifier("orders", subscriber.DeliveryKey(specKey, "orders"))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		msg  *nats.Msg
		res  *subscriber.Result
	}{{"worked example", example, exampleResult}, {"repeated and non-ASCII headers", other, otherResult}} {
		t.Run(c.name, func(t *testing.T) {
			o, err := subscriber.Decode(c.msg)
			if err != nil || v.Verify(o) != nil {
				t.Fatalf("Go does not verify its own order: %v", err)
			}
			py := verifyInPython(t, "orders", c.msg, c.res)
			if py.DeliveryKey != hex.EncodeToString(subscriber.DeliveryKey(specKey, "orders")) || !py.Verified {
				t.Errorf("Python, from the specification: %+v; Go signed %s", py, c.msg.Header.Get(subscriber.HeaderDeliverySignature))
			}
			// The result signature, as Reply would set it.
			rmsg, err := v.ReplyMsg(o, *c.res)
			if err != nil {
				t.Fatal(err)
			}
			if got := rmsg.Header.Get(subscriber.HeaderResultSignature); got != py.ResultSignature {
				t.Errorf("result signature: Go %s, Python %s", got, py.ResultSignature)
			}
			if c.name != "worked example" {
				return
			}
			doc, err := os.ReadFile("doc.go")
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range []string{py.DeliveryKey, py.Signature, py.ResultSignature} {
				if !strings.Contains(string(doc), want) {
					t.Errorf("doc.go's worked example lacks %s", want)
				}
			}
		})
	}
}

// Kept headers whose names differ only in case (sluice writes canonical ones; such a
// message is made up) join in byte order of their names, the same on every decode, so
// that a signature over them is one thing.
func TestDecodeJoinsCaseVariantsInOneOrder(t *testing.T) {
	msg := nats.NewMsg("orders.in")
	msg.Header.Set(subscriber.HeaderTicket, "abcdefghijklmnopqrstuvwxyz")
	msg.Header.Set(subscriber.HeaderQueue, "orders")
	msg.Header.Set(subscriber.HeaderMethod, "POST")
	msg.Header.Set(subscriber.HeaderPath, "/")
	msg.Header["Sluice-H-X-Tag"] = []string{"a", "b"}
	msg.Header["Sluice-H-x-tag"] = []string{"c"}
	msg.Header["Sluice-H-X-TAG"] = []string{"d"}
	for range 20 { // map order changes from one range to the next
		o, err := subscriber.Decode(msg)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Join(o.Header["X-Tag"], ","); got != "d,a,b,c" {
			t.Fatalf("X-Tag = %s, want d,a,b,c", got)
		}
	}
}
