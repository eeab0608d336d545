package rules_test

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/rules"
)

func TestQueueScheduleSettings(t *testing.T) {
	const base = "domain: d\nqueues:\n  q:\n    outflow: 1/s\n    downstream: 'nats:x'\n"
	set, err := rules.Parse(rules.File{Name: "t.yaml", Data: []byte(base + "    max_delay: 2h\n    delay: 30s\n")})
	if err != nil {
		t.Fatal(err)
	}
	qs := set.Queues()
	if len(qs) != 1 || qs[0].MaxDelay != 2*time.Hour || qs[0].Delay != 30*time.Second {
		t.Fatalf("queues %+v", qs)
	}
	_, err = rules.Parse(rules.File{Name: "t.yaml", Data: []byte(base + "    max_delay: 400d\n")})
	if err == nil || !strings.Contains(err.Error(), "t.yaml:6:16: max_delay must be between") {
		t.Fatalf("max_delay 400d: %v", err)
	}
}
