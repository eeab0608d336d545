package limiter_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice/limiter"
)

var errorsIs = errors.Is

// stores lists the stores the conformance suite runs on.
func stores(t *testing.T) []storeFactory {
	t.Helper()
	return []storeFactory{
		{"memory", func(t *testing.T, clock *testClock) limiter.Limiter {
			return limiter.NewMemory(limiter.WithClock(clock.Now))
		}},
	}
}
