package telemetry

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// RegisterShared registers c on reg, or returns the collector of the same
// description registered before, so that two users of one registry count into the
// same series. It fails when reg holds a different collector under c's names.
func RegisterShared[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("registering metrics: %w", err)
	}
	return c, nil
}
