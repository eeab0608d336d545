package queue

import (
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
)

// A stored flow key must have the form Park gives it: anything else makes the
// message unreadable as an order (never a key of a chosen form, a path, a subject).
func TestDecodeRefusesMalformedFlowKeys(t *testing.T) {
	good := strings.Repeat("0a", 16)
	for _, tc := range []struct {
		key string
		ok  bool
	}{
		{good, true},
		{strings.ToUpper(good), false},
		{good[:31], false},
		{good + "0", false},
		{"../" + good[3:], false},
		{strings.Repeat("g", 32), false},
		{"merchant-42", false},
	} {
		h := nats.Header{}
		h.Set(HeaderTicket, NewTicket())
		h.Set(HeaderQueue, "q")
		h.Set(HeaderMethod, "POST")
		h.Set(HeaderPath, "/x")
		h.Set(HeaderFlowKey, tc.key)
		m, err := decode("sluice.q.q", h, nil)
		if (err == nil) != tc.ok || tc.ok && m.FlowKey != tc.key {
			t.Errorf("flow key %q: %v, %v", tc.key, m, err)
		}
	}
}
