package deferral

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newMiddleware returns the front door's middleware deciding set on a memory limiter.
func newMiddleware(t testing.TB, set *rules.Set, opts ...ingress.Option) *ingress.Middleware {
	t.Helper()
	return newMiddlewareOn(t, set, limiter.NewMemory(), opts...)
}

// newMiddlewareOn is newMiddleware on the limiter lim.
func newMiddlewareOn(t testing.TB, set *rules.Set, lim limiter.Limiter, opts ...ingress.Option) *ingress.Middleware {
	t.Helper()
	m, err := ingress.New(ingress.StaticRules{S: set}, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
