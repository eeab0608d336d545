package queueconfig_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/webhook"
)

func TestCallbackConfig(t *testing.T) {
	secret := webhook.NewSecret()
	cases := []struct {
		name    string
		hosts   []string
		secret  string
		field   string // "" when valid
		problem string
	}{
		{"none", nil, "", "", ""},
		{"host and secret", []string{"hooks.example.com", "api.example.com:8443", "http://10.0.0.7:9000"}, secret, "", ""},
		{"hosts without secret", []string{"hooks.example.com"}, "", "callback_secret", "needs a callback_secret"},
		{"secret without hosts", nil, secret, "callback_secret", "without callback_hosts"},
		{"bad secret", []string{"hooks.example.com"}, "whsec_short", "callback_secret", "not standard base64"},
		{"url not host", []string{"https://hooks.example.com/x"}, secret, "callback_hosts", "not host or host:port"},
		{"wildcard", []string{"*.example.com"}, secret, "callback_hosts", "wildcard"},
		{"empty port", []string{"hooks.example.com:"}, secret, "callback_hosts", "not host or host:port"},
		{"credentials", []string{"user@hooks.example.com"}, secret, "callback_hosts", "credentials"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testConfig("q")
			cfg.CallbackHosts, cfg.CallbackSecret = c.hosts, c.secret
			err := cfg.Validate()
			if c.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ce *queueconfig.ConfigError
			if !errors.As(err, &ce) || ce.Field != c.field || !strings.Contains(err.Error(), c.problem) {
				t.Fatalf("Validate = %v; want a %s problem saying %q", err, c.field, c.problem)
			}
			if strings.Contains(err.Error(), strings.TrimPrefix(secret, "whsec_")) {
				t.Errorf("the problem quotes the secret: %v", err)
			}
		})
	}
}

func TestCheckCallback(t *testing.T) {
	cfg := testConfig("q")
	cfg.CallbackHosts = []string{"Hooks.Example.com", "api.example.com:8443", "http://10.0.0.7:9000"}
	cfg.CallbackSecret = webhook.NewSecret()
	cases := []struct {
		url string
		ok  bool
	}{
		{"https://hooks.example.com/sluice?x=1", true},
		{"https://HOOKS.example.com/sluice", true},
		{"https://api.example.com:8443/cb", true},
		{"http://10.0.0.7:9000/cb", true},
		{"https://10.0.0.7:9000/cb", true},
		{"http://hooks.example.com/sluice", false},      // https only
		{"https://hooks.example.com:444/sluice", false}, // other port
		{"https://api.example.com/cb", false},           // listed with a port only
		{"https://evil.example.com/cb", false},
		{"https://hooks.example.com.evil.net/cb", false},
		{"https://user:pw@hooks.example.com/cb", false},
		{"https://hooks.example.com/cb#frag", false},
		{"ftp://hooks.example.com/cb", false},
		{"/relative", false},
		{"hooks.example.com", false},
		{"https://hooks.example.com/" + strings.Repeat("a", queueconfig.MaxCallbackURL), false},
		{"https://[::1/", false},
	}
	for _, c := range cases {
		_, err := cfg.CheckCallback(c.url)
		if (err == nil) != c.ok {
			t.Errorf("CheckCallback(%.60q) = %v, want ok=%v", c.url, err, c.ok)
		}
		if err != nil && !errors.Is(err, queueconfig.ErrCallbackRefused) {
			t.Errorf("CheckCallback(%.60q): %v does not wrap ErrCallbackRefused", c.url, err)
		}
	}
	if _, err := testConfig("plain").CheckCallback("https://hooks.example.com/"); !errors.Is(err, queueconfig.ErrCallbackRefused) {
		t.Errorf("a queue without callback_hosts: %v", err)
	}
}
