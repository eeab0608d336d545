// Package promshare registers Prometheus collectors that several users of one
// registry share: two stores, dispatchers or middlewares in one process count into
// the same series instead of failing to register. It lives under limiter, the lowest
// folder, so that every package registering metrics (limiter/redisstore, queue,
// dispatcher, ingress) imports it downwards.
package promshare

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg and returns it; when reg already holds a collector of
// the same description and of type C (with an interface C, any collector that
// implements it), it returns that one instead, for the caller to use in c's place. Any other failure (a collector of another type under c's
// description, an inconsistent description) is reg's error, wrapped, with c.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var already prometheus.AlreadyRegisteredError
	if errors.As(err, &already) {
		if existing, ok := already.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, fmt.Errorf("registering metrics: %w", err)
}
