package rules

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue/webhook"
)

func TestQueueCallbacks(t *testing.T) {
	secret := webhook.NewSecret()
	t.Setenv("SLUICE_TEST_CALLBACK_SECRET", secret)
	const head = "domain: d\nqueues:\n  q:\n    outflow: 5/s\n    downstream: http://api:8080\n"
	s := mustParse(t, head+"    callback_hosts: [hooks.example.com, 'http://10.0.0.7:9000']\n    callback_secret: env:SLUICE_TEST_CALLBACK_SECRET\n")
	q := s.Queues()[0]
	if len(q.CallbackHosts) != 2 || q.CallbackSecret != secret {
		t.Fatalf("queue = hosts %v, secret set %v", q.CallbackHosts, q.CallbackSecret == secret)
	}
	if _, err := q.CheckCallback("https://hooks.example.com/cb"); err != nil {
		t.Errorf("allowed callback refused: %v", err)
	}
	if q.CallbackPrivate {
		t.Error("callback_private is on without being set")
	}
	if q := mustParse(t, head+"    callback_hosts: [hooks.internal]\n    callback_private: true\n    callback_secret: "+secret+"\n").Queues()[0]; !q.CallbackPrivate {
		t.Error("callback_private: true is not read")
	}
	cases := []struct{ name, src, want string }{
		{"env unset", head + "    callback_hosts: [h]\n    callback_secret: env:SLUICE_TEST_NOT_SET\n",
			"t.yaml:7:22: callback_secret: environment variable SLUICE_TEST_NOT_SET is not set"},
		{"callback_private not a boolean", head + "    callback_hosts: [h]\n    callback_private: yes please\n    callback_secret: " + secret + "\n", "t.yaml:7:23: callback_private"},
		{"hosts without secret", head + "    callback_hosts: [h]\n", "t.yaml:3:3: callback_hosts needs a callback_secret"},
		{"bad host", head + "    callback_hosts: ['https://h/x']\n    callback_secret: " + secret + "\n", "t.yaml:6:21: callback_hosts: \"https://h/x\" is not host or host:port"},
		{"bad literal secret", head + "    callback_hosts: [h]\n    callback_secret: whsec_c2hvcnQ=\n", "t.yaml:7:22: callback_secret: webhook: invalid secret: the key must be 24 to 64 bytes, got 5"},
		{"secret not a string", head + "    callback_hosts: [h]\n    callback_secret: [a]\n", "t.yaml:7:22: callback_secret must be a string"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse(File{Name: "t.yaml", Data: []byte(c.src)})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("problems = %v\nwant %s", err, c.want)
			}
			if strings.Contains(err.Error(), strings.TrimPrefix(secret, "whsec_")) {
				t.Errorf("a problem quotes the secret: %v", err)
			}
		})
	}
}
