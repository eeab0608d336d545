package deferral

import (
	"bytes"
	"encoding/json"
	"reflect"
	"testing"
)

// TestAcceptedJSON: the 202's body is what encoding/json's Encoder writes for it, byte
// for byte: every field set, the optional ones left out, and strings that need
// escaping (HTML characters, quotes, controls, non-ASCII, invalid UTF-8).
func TestAcceptedJSON(t *testing.T) {
	full := acceptedBody{Ticket: "abcdefghijklmnopqrstuvwxyz", Queue: "orders", Status: "queued", Position: 18446744073709551615,
		EstimatedDelivery: "2026-12-01T09:30:00Z", Duplicate: true, Monitor: Path + "abcdefghijklmnopqrstuvwxyz",
		MonitorWait: 60, MonitorEvents: true, NotBefore: "2026-12-01T10:00:00Z"}
	v := reflect.ValueOf(full)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Fatalf("the full case leaves %s unset", v.Type().Field(i).Name)
		}
	}
	for name, ab := range map[string]acceptedBody{
		"full":            full,
		"fewest":          {Ticket: "t", Queue: "q", EstimatedDelivery: "e", Monitor: "m"},
		"events, no wait": {Ticket: "t", Queue: "q", MonitorEvents: true, MonitorWait: 0},
		"negative wait":   {Ticket: "t", MonitorWait: -3},
		"escapes":         {Ticket: "a\"b\\c", Queue: "<q>&", Status: "\x00\x1f\t\n", Monitor: "é\u2028\u2029", NotBefore: "\xff\xfe"},
	} {
		var want bytes.Buffer
		if err := json.NewEncoder(&want).Encode(ab); err != nil {
			t.Fatal(err)
		}
		if got := ab.appendJSON(nil); !bytes.Equal(got, want.Bytes()) {
			t.Errorf("%s:\n got %s\nwant %s", name, got, want.Bytes())
		}
	}
}
