package envoy

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/rules"
)

// BenchmarkShouldRateLimit drives ShouldRateLimit in-process (no gRPC) with 1 and 64
// concurrent callers, on the memory store and on a real redis-server, with the
// response headers on (the default) and off, and with one descriptor per request or
// three (three rules, so three limiter calls). The limit is never reached: every call
// is a full decision. The comparison with envoyproxy/ratelimit over gRPC is
// `sluice-bench rls` (cmd/sluice-bench).
//
//	go test -run '^$' -bench ShouldRateLimit -benchmem ./ingress/envoy/
func BenchmarkShouldRateLimit(b *testing.B) {
	set, err := rules.Parse(rules.File{Name: "bench.yaml", Data: []byte(`
domain: bench
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
  - key: route
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
`)})
	if err != nil {
		b.Fatal(err)
	}
	stores := []struct {
		name string
		new  func(b *testing.B) limiter.Limiter
	}{
		{"memory", func(*testing.B) limiter.Limiter { return limiter.NewMemory() }},
		{"redis", func(b *testing.B) limiter.Limiter {
			r, err := redisstore.New(redistest.Start(b).Client())
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { r.Close() })
			return r
		}},
	}
	for _, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			lim := st.new(b)
			for _, headers := range []bool{true, false} {
				for _, ndesc := range []int{1, 3} {
					for _, callers := range []int{1, 64} {
						name := "headers=" + strconv.FormatBool(headers) + "/descriptors=" + strconv.Itoa(ndesc) + "/callers=" + strconv.Itoa(callers)
						b.Run(name, func(b *testing.B) {
							s, err := NewRateLimitService(ingress.StaticRules{S: set}, lim, WithResponseHeaders(headers))
							if err != nil {
								b.Fatal(err)
							}
							benchCalls(b, s, ndesc, callers)
						})
					}
				}
			}
		})
	}
}

// benchCalls makes b.N calls of s spread over callers goroutines, each on its own
// 1,000 descriptor values used round-robin.
//
// On Redis it reports the decisions made without Redis (fallbacks/op): a loaded
// machine can make Redis miss the store's timeout, and those decisions are cheaper.
func benchCalls(b *testing.B, s *RateLimitService, ndesc, callers int) {
	var fallbacks0 int64
	r, onRedis := s.limiter.(*redisstore.Store)
	if onRedis {
		fallbacks0 = r.Fallbacks()
	}
	reqs := make([][]*rlsv3.RateLimitRequest, callers)
	for c := range reqs {
		reqs[c] = make([]*rlsv3.RateLimitRequest, 1000)
		for k := range reqs[c] {
			v := b.Name() + "-c" + strconv.Itoa(c) + "-k" + strconv.Itoa(k)
			req := &rlsv3.RateLimitRequest{Domain: "bench"}
			for _, key := range []string{"user", "tenant", "route"}[:ndesc] {
				req.Descriptors = append(req.Descriptors, &rlcommon.RateLimitDescriptor{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: key, Value: v}}})
			}
			reqs[c][k] = req
		}
	}
	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	b.ReportAllocs()
	b.ResetTimer()
	for c := range callers {
		wg.Go(func() {
			for i := 0; ; i++ {
				if next.Add(1) > int64(b.N) {
					return
				}
				resp, err := s.ShouldRateLimit(context.Background(), reqs[c][i%len(reqs[c])])
				if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
					failed.CompareAndSwap(nil, "not OK")
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	if f := failed.Load(); f != nil {
		b.Fatal("a call failed or was over the limit")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
	if onRedis {
		b.ReportMetric(float64(r.Fallbacks()-fallbacks0)/float64(b.N), "fallbacks/op")
	}
}
