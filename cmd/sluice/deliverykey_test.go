package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"os"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue/natstest"
	"github.com/sluicehq/sluice/queue/subscriber"
)

func TestQueueDeliveryKey(t *testing.T) {
	run := func(args ...string) (int, string, string) {
		var out, errb bytes.Buffer
		code := run(context.Background(), append([]string{"queue"}, args...), &out, &errb)
		return code, out.String(), errb.String()
	}
	t.Setenv("SLUICE_QUEUE_KEY", testQueueKey)
	code, out, errs := run("delivery-key", "orders")
	want := base64.StdEncoding.EncodeToString(subscriber.DeliveryKey(natstest.SigningKey(), "orders")) + "\n"
	if code != exitOK || out != want {
		t.Errorf("delivery-key orders: exit %d, %q (want %q)\n%s", code, out, want, errs)
	}
	if _, other, _ := run("delivery-key", "tiny"); other == out {
		t.Error("two queues share a delivery key")
	}
	for _, c := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"no queue", []string{"delivery-key"}, testQueueKey, "delivery-key takes one queue"},
		{"bad queue", []string{"delivery-key", "a.b"}, testQueueKey, "is not a queue name"},
		{"short key", []string{"delivery-key", "orders"}, "c2hvcnQga2V5", "SLUICE_QUEUE_KEY: 9 bytes"},
		{"no key", []string{"delivery-key", "orders"}, "", "set SLUICE_QUEUE_KEY"},
	} {
		if c.env == "" {
			os.Unsetenv("SLUICE_QUEUE_KEY")
		} else {
			t.Setenv("SLUICE_QUEUE_KEY", c.env)
		}
		code, out, errs := run(c.args...)
		if code != exitUsage || out != "" || !strings.Contains(errs, c.want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q (want %q)", c.name, code, out, errs, c.want)
		}
	}
}
