package queueconfig

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// A library caller's FlowBy gets the answers a rules file gets.
func TestValidateFlowBy(t *testing.T) {
	base := Config{Name: "q", Outflow: limiter.PerSecond(10), Downstream: "http://o:1"}
	for _, tc := range []struct {
		name string
		f    FlowBy
		want string // "" valid
	}{
		{"rate", FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)}, ""},
		{"max in flight", FlowBy{From: "client_ip", MaxInFlight: 2}, ""},
		{"none", FlowBy{}, ""},
		{"no from", FlowBy{Rate: limiter.PerSecond(5)}, "needs from"},
		{"bad from", FlowBy{From: "cookie:x", Rate: limiter.PerSecond(5)}, "must be header:NAME"},
		{"nothing", FlowBy{From: "host"}, "needs a rate"},
		{"period too short", FlowBy{From: "host", Rate: limiter.Rate{Count: 1, Period: time.Nanosecond}}, "period"},
		{"negative rate", FlowBy{From: "host", Rate: limiter.Rate{Count: -1, Period: time.Second}}, "rate"},
		{"negative in flight", FlowBy{From: "host", MaxInFlight: -1}, "at least 1"},
		{"above the queue", FlowBy{From: "host", MaxInFlight: DefaultMaxInFlight + 1}, "more than the queue's"},
	} {
		c := base
		c.FlowBy = tc.f
		err := c.Validate()
		var ce *ConfigError
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want) || !errors.As(err, &ce) || ce.Field != "flow_by"):
			t.Errorf("%s: %v, want a flow_by problem containing %q", tc.name, err, tc.want)
		}
	}
}
