package envoy

import (
	"context"
	"slices"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/limiter"
)

// TestOverrideUnitMultiplier: a `limit` override's unit_multiplier is taken as the
// package documentation says (a fixed window of the unit × the multiplier) as long as the window stays
// within what the limiter counts exactly (2^53 µs, about 285 years); only longer ones
// are refused. The bound was once computed as 2^53 ns / period, which refused any
// multiplier of a day or longer (DAY × 2, a two-day window) and SECOND × 10000.
func TestOverrideUnitMultiplier(t *testing.T) {
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory())
	for _, tc := range []struct {
		name       string
		unit       typev3.RateLimitUnit
		multiplier uint32
		want       codes.Code
	}{
		{"SECOND × 30", typev3.RateLimitUnit_SECOND, 30, codes.OK},
		{"SECOND × 10000", typev3.RateLimitUnit_SECOND, 10000, codes.OK},
		{"HOUR × 3", typev3.RateLimitUnit_HOUR, 3, codes.OK},
		{"DAY × 2", typev3.RateLimitUnit_DAY, 2, codes.OK},
		{"YEAR × 100", typev3.RateLimitUnit_YEAR, 100, codes.OK},
		{"YEAR × 1000: past 2^53 µs", typev3.RateLimitUnit_YEAR, 1000, codes.InvalidArgument},
		{"SECOND × 2^32-1 is fine", typev3.RateLimitUnit_SECOND, 1<<32 - 1, codes.OK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := desc("user", "override-"+tc.name)
			d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: tc.unit,
				UnitMultiplier: wrapperspb.UInt32(tc.multiplier)}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
			if got := status.Code(err); got != tc.want {
				t.Fatalf("%v, want %v", err, tc.want)
			}
			if err == nil && (resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 4) {
				t.Errorf("first call under a limit of 5: %v", resp)
			}
		})
	}
}

// TestEnvoyUnitsAreTheRules: the periods of Envoy's units, derived from the rules'
// unit table (limiter.UnitPeriod) by name, are Envoy's: every override unit but
// UNKNOWN has its period, and the answers' units run from the year down to the
// second, so that currentLimit picks the largest that divides a period.
func TestEnvoyUnitsAreTheRules(t *testing.T) {
	const day = 24 * time.Hour
	wantOverride := map[typev3.RateLimitUnit]time.Duration{
		typev3.RateLimitUnit_SECOND: time.Second, typev3.RateLimitUnit_MINUTE: time.Minute,
		typev3.RateLimitUnit_HOUR: time.Hour, typev3.RateLimitUnit_DAY: day,
		typev3.RateLimitUnit_MONTH: 30 * day, typev3.RateLimitUnit_YEAR: 365 * day,
	}
	if len(overridePeriods) != len(wantOverride) || len(typev3.RateLimitUnit_name) != len(wantOverride)+1 {
		t.Errorf("override periods %v, want %v (Envoy's units: %v)", overridePeriods, wantOverride, typev3.RateLimitUnit_name)
	}
	for u, d := range wantOverride {
		if got := overridePeriods[int32(u)]; got != d {
			t.Errorf("override unit %s: period %v, want %v", u, got, d)
		}
	}
	want := []responseUnit{
		{rlsv3.RateLimitResponse_RateLimit_YEAR, 365 * day}, {rlsv3.RateLimitResponse_RateLimit_MONTH, 30 * day},
		{rlsv3.RateLimitResponse_RateLimit_WEEK, 7 * day}, {rlsv3.RateLimitResponse_RateLimit_DAY, day},
		{rlsv3.RateLimitResponse_RateLimit_HOUR, time.Hour}, {rlsv3.RateLimitResponse_RateLimit_MINUTE, time.Minute},
		{rlsv3.RateLimitResponse_RateLimit_SECOND, time.Second},
	}
	if !slices.Equal(responseUnits, want) {
		t.Errorf("answer units %v, want %v", responseUnits, want)
	}
}
