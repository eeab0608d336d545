package envoy

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/limiter"
)

// hitsRules has a limit of 5 per minute for every algorithm.
func hitsRules() string {
	var b strings.Builder
	b.WriteString("\ndomain: api\ndescriptors:\n")
	for _, a := range limiter.Algorithms {
		fmt.Fprintf(&b, "  - {key: algo, value: %[1]s, rate_limit: {unit: minute, requests_per_unit: 5}, algorithm: %[1]s}\n", a)
	}
	return b.String()
}

// checkWaits asks for hits on algo, on the request or on the descriptor, and fails
// when duration_until_reset or a Retry-After the answer carries is negative, or when an
// answer over the limit says to retry in less than nothing.
func checkWaits(t testing.TB, s *RateLimitService, algo string, hits uint64, onDescriptor bool) *rlsv3.RateLimitResponse {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "algo", Value: algo}}}
	req := &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{d}}
	if onDescriptor {
		d.HitsAddend = wrapperspb.UInt64(hits)
	} else {
		req.HitsAddend = uint32(hits)
	}
	resp, err := s.ShouldRateLimit(context.Background(), req)
	if err != nil {
		t.Fatalf("%s, hits %d: %v", algo, hits, err)
	}
	for _, st := range resp.Statuses {
		if r := st.GetDurationUntilReset(); r != nil && (r.Seconds < 0 || r.Nanos < 0 || r.AsDuration() < 0) {
			t.Errorf("%s, hits %d: duration_until_reset %v", algo, hits, r.AsDuration())
		}
	}
	for _, name := range []string{"retry-after", "x-ratelimit-retry-after"} {
		v := header(resp, name)
		if v == "" {
			if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
				t.Errorf("%s, hits %d: over the limit without %s", algo, hits, name)
			}
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > maxRetryAfterSeconds {
			t.Errorf("%s, hits %d: %s %q", algo, hits, name, v)
		}
	}
	return resp
}

// maxRetryAfterSeconds is the most any answer may say: a day, well past a minute's
// window (a request larger than the limit is told when the quota is whole again).
const maxRetryAfterSeconds = 24 * 3600

func TestHitsAddendNeverGivesANegativeWait(t *testing.T) {
	set := parseRules(t, hitsRules())
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			s := newRLS(t, set, store())
			for _, algo := range limiter.AlgorithmNames() {
				for _, hits := range []uint64{0, 1, 5, 6, 1 << 31, math.MaxUint32} {
					for _, onDesc := range []bool{false, true} {
						resp := checkWaits(t, s, algo, hits, onDesc)
						over := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
						if hits > 5 && !over {
							t.Errorf("%s, hits %d: allowed over a limit of 5", algo, hits)
						}
					}
				}
			}
		})
	}
}

// FuzzHitsAddend: whatever hits_addend (request or descriptor) and clock, on every
// algorithm, no wait is negative.
func FuzzHitsAddend(f *testing.F) {
	for _, h := range []uint64{0, 1, 5, 6, 1 << 31, math.MaxUint32, MaxHits} {
		f.Add(h, uint8(0), false, int64(0))
	}
	f.Fuzz(func(t *testing.T, hits uint64, algo uint8, onDescriptor bool, advance int64) {
		if !onDescriptor {
			hits &= math.MaxUint32
		} else if hits > MaxHits {
			hits %= MaxHits + 1
		}
		now := time.Unix(1_700_000_000, 0)
		clock := func() time.Time { return now }
		s := newRLS(t, parseRules(t, hitsRules()), limiter.NewMemory(limiter.WithClock(clock)))
		a := string(limiter.Algorithms[int(algo)%len(limiter.Algorithms)])
		checkWaits(t, s, a, hits, onDescriptor)
		now = now.Add(time.Duration(advance % int64(time.Hour)).Abs())
		checkWaits(t, s, a, hits, onDescriptor)
		checkWaits(t, s, a, 1, onDescriptor)
	})
}
