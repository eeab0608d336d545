package queueconfig_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func testConfig(name string) queueconfig.Config {
	return queueconfig.Config{
		Name:       name,
		Outflow:    limiter.PerSecond(10),
		Downstream: "http://127.0.0.1:1/api",
	}
}

func TestConfigValidate(t *testing.T) {
	good := testConfig("orders")
	if err := good.Validate(); err != nil {
		t.Fatalf("valid config: %v", err)
	}
	bad := queueconfig.Config{
		Name:            "bad name",
		Outflow:         limiter.Rate{Count: -1, Period: time.Second},
		MaxAge:          time.Minute,
		DuplicateWindow: time.Hour,
		Backoff:         queueconfig.Backoff{Initial: time.Minute, Max: time.Second},
		Downstream:      "nats:orders.*",
		DropHeaders:     []string{"bad header"},
	}
	err := bad.Validate()
	if err == nil || !errors.Is(err, queueconfig.ErrInvalidConfig) {
		t.Fatalf("want ErrInvalidConfig, got %v", err)
	}
	for _, want := range []string{"name", "outflow", "duplicate window", "backoff max", "subject", "drop_headers"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems %q lack %q", err, want)
		}
	}
	for _, d := range []string{"ftp://x", "http://", "http://h/p?q=1", "http://h/?", "http://h#f", "http://:80", "http://h:99999",
		"nats:sluice.q.x", "nats:sluice.q.*", "nats:sluice.done.q", "nats:$JS.API.STREAM.LIST", "nats:$KV.b.k", "nats:a.b*",
		"nats:a b", "nats:a..b", "nats:", " http://h"} {
		c := testConfig("q")
		c.Downstream = d
		if c.Validate() == nil {
			t.Errorf("downstream %q accepted", d)
		}
	}
	// A refused downstream is reported without its credentials.
	for _, d := range []string{"ftp://u:s3cret@x", "https://u:s3cret@x/?q=1", "http://u:s3cret@x:99999", "http://u:s3cret@[::1"} {
		c := testConfig("q")
		c.Downstream = d
		if err := c.Validate(); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("downstream %q: %v", d, err)
		}
	}
	for _, d := range []string{"https://orders.example/api/", "nats:orders.created"} {
		c := testConfig("q")
		c.Downstream = d
		if err := c.Validate(); err != nil {
			t.Errorf("downstream %q: %v", d, err)
		}
	}
	for _, tc := range []struct {
		downstream string
		delivery   queueconfig.Delivery
		ok         bool
	}{
		{"nats:orders.created", queueconfig.AtMostOnce, true},
		{"nats:orders.created", queueconfig.AtLeastOnce, true},
		{"http://orders:8080", queueconfig.AtMostOnce, false},
		{"nats:orders.created", "exactly_once", false},
	} {
		c := testConfig("q")
		c.Downstream, c.Delivery = tc.downstream, tc.delivery
		if err := c.Validate(); (err == nil) != tc.ok {
			t.Errorf("delivery %q to %s: %v", tc.delivery, tc.downstream, err)
		}
	}
	c := testConfig("q").WithDefaults()
	if c.Delivery != queueconfig.AtLeastOnce {
		t.Errorf("default delivery %q", c.Delivery)
	}
	if c.MaxDepth != queueconfig.DefaultMaxDepth || c.IdempotencyTTL != 24*time.Hour || c.MaxAttempts != 8 {
		t.Errorf("defaults: %+v", c)
	}
}

func TestConfigScheduleBounds(t *testing.T) {
	for _, tc := range []struct {
		maxDelay, delay time.Duration
		field           string // "": valid
	}{
		{0, 0, ""},
		{time.Hour, 0, ""},
		{0, time.Minute, ""},
		{queueconfig.MaxScheduleDelay, queueconfig.MaxScheduleDelay, ""},
		{-time.Second, 0, "max_delay"},
		{queueconfig.MaxScheduleDelay + time.Second, 0, "max_delay"},
		{0, -time.Second, "delay"},
		{0, queueconfig.MaxScheduleDelay + time.Second, "delay"},
	} {
		c := testConfig("q")
		c.MaxDelay, c.Delay = tc.maxDelay, tc.delay
		err := c.Validate()
		var ce *queueconfig.ConfigError
		switch {
		case tc.field == "" && err != nil:
			t.Errorf("max_delay %s, delay %s: %v", tc.maxDelay, tc.delay, err)
		case tc.field != "" && (!errors.As(err, &ce) || ce.Field != tc.field):
			t.Errorf("max_delay %s, delay %s: %v; want a problem of %s", tc.maxDelay, tc.delay, err, tc.field)
		}
		if got, want := c.Scheduled(), tc.maxDelay > 0 || tc.delay > 0; got != want {
			t.Errorf("max_delay %s, delay %s: Scheduled() = %v", tc.maxDelay, tc.delay, got)
		}
	}
}
