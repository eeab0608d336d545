package ingress

import (
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/linktest"
)

// heavyModules are what a program that only limits requests must not link: the NATS
// server and client (parking lives in ingress/deferral and queue), fsnotify (the rules
// watcher lives in rules/watch) and go-redis (the Redis store lives in
// limiter/redisstore).
var heavyModules = []string{
	"github.com/nats-io/nats-server/v2",
	"github.com/nats-io/nats.go",
	"github.com/fsnotify/fsnotify",
	"github.com/redis/go-redis/v9",
	"go.opentelemetry.io/otel/sdk",
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace",
}

// otelSDK is what only cmd/sluice may link of OpenTelemetry: the SDK and the exporters
// (the libraries use the API alone).
var otelSDK = []string{"go.opentelemetry.io/otel/sdk", "go.opentelemetry.io/otel/exporters/"}

// TestLightPackages: the packages a program imports to limit requests pull in no NATS
// server and no Redis client (nor, for rules and ingress, any NATS or fsnotify); none
// of the libraries links the OpenTelemetry SDK or an exporter (ingress, queue and
// dispatcher use the otel API; limiter and rules not even that); the upstream pool
// (ingress/proxy) links nothing but the standard library and the warning limiter.
func TestLightPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, tc := range []struct {
		pkg    string
		banned []string
	}{
		{"limiter", append([]string{"github.com/nats-io/", "github.com/redis/", "go.opentelemetry.io/"}, otelSDK...)},
		{"rules", append([]string{"github.com/nats-io/", "github.com/fsnotify/", "github.com/redis/", "github.com/sluicehq/sluice/queue\n", "go.opentelemetry.io/"}, otelSDK...)},
		{"ingress", append([]string{"github.com/nats-io/", "github.com/fsnotify/", "github.com/redis/", "github.com/sluicehq/sluice/queue\n"}, otelSDK...)},
		// The decision engine every entry point shares: no transport, no ingress.
		{"ingress/decide", append([]string{"github.com/nats-io/", "github.com/fsnotify/", "github.com/redis/",
			"github.com/sluicehq/sluice/ingress\n", "github.com/sluicehq/sluice/ingress/proxy", "google.golang.org/grpc"}, otelSDK...)},
		// The upstream pool: the standard library and the warning limiter alone.
		{"ingress/proxy", append([]string{"github.com/nats-io/", "github.com/fsnotify/", "github.com/redis/", "github.com/prometheus/",
			"go.opentelemetry.io/", "github.com/sluicehq/sluice/limiter", "github.com/sluicehq/sluice/rules", "github.com/sluicehq/sluice/ingress\n"}, otelSDK...)},
		// What a Go client links to follow its tickets: the standard library.
		{"ingress/ticket", []string{"github.com/nats-io/", "github.com/redis/", "github.com/prometheus/", "github.com/fsnotify/",
			"go.opentelemetry.io/", "\ngolang.org/x/", "github.com/sluicehq/sluice/ingress\n", "github.com/sluicehq/sluice/queue",
			"github.com/sluicehq/sluice/limiter", "github.com/sluicehq/sluice/rules"}},
		{"queue", otelSDK},
		{"dispatcher", otelSDK},
	} {
		linktest.CheckDeps(t, "github.com/sluicehq/sluice/"+tc.pkg, tc.banned, nil)
	}
}

// TestLightMiddleware builds a program that uses only the middleware on the memory
// store (testdata/lightmw) and reads the modules it links (go version -m); it reports
// its size beside the same handler on x/time/rate with client_golang (testdata/ratemw).
func TestLightMiddleware(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	bin, size := linktest.Build(t, "./testdata/lightmw")
	mods := linktest.Go(t, "version", "-m", bin)
	linked := func(mod string) bool { return strings.Contains(mods, "\tdep\t"+mod+"\t") }
	if !linked("github.com/prometheus/client_golang") {
		t.Fatalf("go version -m lists no modules we know; the check would prove nothing:\n%s", mods)
	}
	for _, m := range heavyModules {
		if linked(m) {
			t.Errorf("the middleware-only program links %s", m)
		}
	}
	_, stripped := linktest.Build(t, "./testdata/lightmw", "-ldflags=-s -w")
	_, rateSize := linktest.Build(t, "./testdata/ratemw")
	_, rateStripped := linktest.Build(t, "./testdata/ratemw", "-ldflags=-s -w")
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	t.Logf("middleware on the memory store: %.1f MiB (%.1f MiB with -s -w); x/time/rate with client_golang: %.1f MiB (%.1f MiB)",
		mb(size), mb(stripped), mb(rateSize), mb(rateStripped))
}
