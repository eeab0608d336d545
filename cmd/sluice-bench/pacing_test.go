package main

import (
	"strings"
	"testing"
)

// Shape only: a tiny run of each mode must produce its table. Timing on a shared CI
// machine means nothing, so no figure is asserted.

func TestPacingTable(t *testing.T) {
	out, errOut, code := benchRun(t, "pacing", "--rates", "20", "--duration", "300ms", "--stall", "0")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, contender := range []string{"sluice pacer", "sluice transport", "sluice dispatcher", "x/time/rate", "time.Ticker", "deadline loop"} {
		if !strings.Contains(out, contender) {
			t.Errorf("no row for %s in\n%s", contender, out)
		}
	}
}

func TestParkingTable(t *testing.T) {
	out, errOut, code := benchRun(t, "parking", "--duration", "200ms", "--concurrency", "2")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, contender := range []string{"jetstream publish", "sluice park", "sluice ingress (HTTP 202)", "sluice park+idem"} {
		if !strings.Contains(out, contender) {
			t.Errorf("no row for %s in\n%s", contender, out)
		}
	}
}
