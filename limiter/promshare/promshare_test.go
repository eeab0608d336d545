package promshare_test

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/limiter/promshare"
)

// TestRegisterShares: the second collector of a description gets the first one back,
// and both users count into the same series.
func TestRegisterShares(t *testing.T) {
	reg := prometheus.NewRegistry()
	opts := prometheus.CounterOpts{Name: "shared_total", Help: "A counter two users share."}
	first, err := promshare.Register(reg, prometheus.NewCounterVec(opts, []string{"l"}))
	if err != nil {
		t.Fatal(err)
	}
	second, err := promshare.Register(reg, prometheus.NewCounterVec(opts, []string{"l"}))
	if err != nil {
		t.Fatal(err)
	}
	if second != first {
		t.Fatal("the second registration did not return the first collector")
	}
	first.WithLabelValues("a").Inc()
	second.WithLabelValues("a").Inc()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 || mfs[0].GetMetric()[0].GetCounter().GetValue() != 2 {
		t.Fatalf("gathered %v, want one series of 2", mfs)
	}
}

// TestRegisterRefusesAnotherType: a collector of another type under the same
// description is reg's AlreadyRegisteredError, and the caller's collector comes back.
func TestRegisterRefusesAnotherType(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "taken", Help: "h"}, []string{"l"})); err != nil {
		t.Fatal(err)
	}
	mine := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "taken", Help: "h"}, []string{"l"})
	got, err := promshare.Register(reg, mine)
	var already prometheus.AlreadyRegisteredError
	if !errors.As(err, &already) {
		t.Fatalf("err = %v, want an AlreadyRegisteredError", err)
	}
	if got != mine {
		t.Fatal("the caller's collector did not come back with the error")
	}
}

// TestRegisterOtherErrors: a description that clashes with a registered one (same
// name, other labels) is reg's error, not a sharing.
func TestRegisterOtherErrors(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "clash_total", Help: "h"}, []string{"a"})); err != nil {
		t.Fatal(err)
	}
	_, err := promshare.Register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{Name: "clash_total", Help: "h"}, []string{"b"}))
	var already prometheus.AlreadyRegisteredError
	if err == nil || errors.As(err, &already) {
		t.Fatalf("err = %v, want the registry's refusal of a clashing description", err)
	}
}
