package queueconfig_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

func TestLanesValidate(t *testing.T) {
	good := testConfig("q")
	good.Priorities = queueconfig.Priorities{Levels: []string{"high", "normal", "low"}, Default: "normal",
		Mode: queueconfig.Weighted, Weights: map[string]int{"high": 8, "normal": 2, "low": 1}}
	good.FairBy, good.TenantMaxDepth = "header:X-Tenant", 100
	if err := good.Validate(); err != nil {
		t.Fatalf("valid lanes: %v", err)
	}
	d := good.WithDefaults()
	if d.FairLanes != queueconfig.DefaultFairLanes || !d.Laned() {
		t.Errorf("defaults: %+v", d)
	}
	if lv, tn := d.LaneCount(); lv != 3 || tn != queueconfig.DefaultFairLanes {
		t.Errorf("lane count %d × %d", lv, tn)
	}
	if d.Priorities.Level("high") != 0 || d.Priorities.Level("nope") != 1 || d.Priorities.Level("") != 1 || d.Priorities.Weight(2) != 1 {
		t.Error("levels or weights")
	}
	if p := (queueconfig.Config{Priorities: queueconfig.Priorities{Levels: []string{"a", "b"}}}).WithDefaults().Priorities; p.Mode != queueconfig.Weighted || p.Default != "b" {
		t.Errorf("priority defaults: %+v", p)
	}
	if testConfig("q").Laned() {
		t.Error("a queue without priorities and fair_by is laned")
	}
	for _, tc := range []struct {
		change func(*queueconfig.Config)
		field  string
		says   string
	}{
		{func(c *queueconfig.Config) { c.Priorities = queueconfig.Priorities{Mode: queueconfig.Strict} }, "priorities", "levels are required"},
		{func(c *queueconfig.Config) { c.Priorities.Levels = []string{"a", "a"} }, "priorities", "listed twice"},
		{func(c *queueconfig.Config) { c.Priorities.Levels = []string{"a.b"} }, "priorities", `level "a.b"`},
		{func(c *queueconfig.Config) { c.Priorities.Levels = strings.Split("a b c d e f g h i", " ") }, "priorities", "at most 8 levels"},
		{func(c *queueconfig.Config) {
			c.Priorities = queueconfig.Priorities{Levels: []string{"a"}, Mode: queueconfig.Strict, Weights: map[string]int{"a": 2}}
		}, "priorities", "weighted only"},
		{func(c *queueconfig.Config) {
			c.Priorities = queueconfig.Priorities{Levels: []string{"a"}, Weights: map[string]int{"a": 0}}
		}, "priorities", "between 1 and 1000"},
		{func(c *queueconfig.Config) { c.FairBy = "cookie:x" }, "fair_by", "must be header:NAME"},
		{func(c *queueconfig.Config) { c.FairBy = "header:bad name" }, "fair_by", "valid header name"},
		{func(c *queueconfig.Config) { c.FairBy = "query:" }, "fair_by", "parameter name"},
		{func(c *queueconfig.Config) { c.TenantMaxDepth = 3 }, "tenant_max_depth", "needs fair_by"},
		{func(c *queueconfig.Config) { c.FairBy, c.TenantMaxDepth = "client_ip", -1 }, "tenant_max_depth", "negative"},
		{func(c *queueconfig.Config) { c.FairBy, c.FairLanes = "host", 65 }, "fair_lanes", "between 1 and 64"},
		{func(c *queueconfig.Config) {
			c.FairBy, c.FairLanes = "method", 64
			c.Priorities.Levels = strings.Split("a b c d e", " ")
		}, "fair_lanes", "more than 256 lanes"},
	} {
		c := testConfig("q")
		tc.change(&c)
		err := c.Validate()
		var ce *queueconfig.ConfigError
		if !errors.As(err, &ce) || ce.Field != tc.field || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("%+v: got %v, want a %s problem saying %q", c.Priorities, err, tc.field, tc.says)
		}
	}
}

func FuzzCheckSource(f *testing.F) {
	for _, s := range []string{"header:X-Tenant", "query:t", "client_ip", "method", "host", "path:{x}", "header:", ":", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := queueconfig.CheckSource(s); err == nil {
			c := testConfig("q")
			c.FairBy = s
			if verr := c.Validate(); verr != nil {
				t.Errorf("source %q accepted alone, refused in a config: %v", s, verr)
			}
		}
	})
}
