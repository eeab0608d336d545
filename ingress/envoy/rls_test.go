package envoy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
	"github.com/sluicehq/sluice/limiter/redistest"
	"github.com/sluicehq/sluice/rules"
)

const rlsRules = `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: soft
    rate_limit: {unit: minute, requests_per_unit: 1}
    shadow_mode: true
  - key: free
    rate_limit: {unlimited: true}
  - key: blocked
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: multi
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {window: 30s, requests_per_unit: 2}
  - key: fail_open
    rate_limit: {unit: hour, requests_per_unit: 1}
    failure_mode: open
  - key: fail_closed
    rate_limit: {unit: hour, requests_per_unit: 1}
    failure_mode: closed
  - key: fail_local
    rate_limit: {unit: hour, requests_per_unit: 1}
routes:
  - name: users
    match: {path_prefix: /v1/users}
    descriptors:
      - [{key: user, from: "header:X-User"}]
`

func parseRules(t *testing.T, src string) *rules.Set {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "api.yaml", Data: []byte(src)})
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// serve starts s on a loopback port and returns a client connection to it.
func serve(t *testing.T, s *Server) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		s.Shutdown(ctx)
	})
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func rlsClient(t *testing.T, set *rules.Set, lim limiter.Limiter, opts ...Option) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsv3.NewRateLimitServiceClient(serve(t, NewServer(newRLS(t, set, lim, opts...), nil)))
}

// newRLS is NewRateLimitService for a test, which fails when it does.
func newRLS(t testing.TB, set *rules.Set, lim limiter.Limiter, opts ...Option) *RateLimitService {
	t.Helper()
	s, err := NewRateLimitService(ingress.StaticRules{S: set}, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// newMiddleware is ingress.New for a test, which fails when it does.
func newMiddleware(t testing.TB, set *rules.Set, lim limiter.Limiter, opts ...ingress.Option) *ingress.Middleware {
	t.Helper()
	mw, err := ingress.New(ingress.StaticRules{S: set}, lim, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return mw
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	if req.Domain == "" {
		req.Domain = "api"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

func TestShouldRateLimitCountsAndReports(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The front door's middleware on the same registry: the series are shared.
	newMiddleware(t, parseRules(t, rlsRules), limiter.NewMemory(), ingress.WithRegisterer(reg))
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory(), WithRegisterer(reg))

	for i, want := range []uint32{2, 1, 0} {
		resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "alice")}})
		st := resp.Statuses[0]
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != want {
			t.Fatalf("call %d: overall %v, status %v", i, resp.OverallCode, st)
		}
		if l := st.CurrentLimit; l.GetName() != "per_user" || l.GetRequestsPerUnit() != 3 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
			t.Fatalf("current_limit %v", l)
		}
		if d := st.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
			t.Fatalf("duration_until_reset %v", d)
		}
		if got := header(resp, "ratelimit-policy"); got != `"per_user";q=3;w=60` {
			t.Fatalf("RateLimit-Policy %q", got)
		}
		if got := header(resp, "x-ratelimit-remaining"); got != string(rune('0'+want)) {
			t.Fatalf("X-Ratelimit-Remaining %q", got)
		}
	}
	resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "alice"), desc("user", "bob")}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 2 {
		t.Fatalf("over the limit: %v", resp)
	}
	if ra := header(resp, "retry-after"); ra == "" || ra == "0" || header(resp, "x-ratelimit-retry-after") != ra {
		t.Fatalf("Retry-After %q", ra)
	}
	if !strings.HasPrefix(header(resp, "ratelimit"), `"per_user";r=0;t=`) {
		t.Fatalf("RateLimit %q describes the wrong limit", header(resp, "ratelimit"))
	}
	if got := decisiontest.Count(t, reg, "per_user", decide.OutcomeRejected); got != 1 {
		t.Fatalf("sluice_decisions_total{rule=per_user,outcome=rejected} = %v", got)
	}
	if got := decisiontest.Count(t, reg, "per_user", decide.OutcomeAllowed); got != 4 {
		t.Fatalf("sluice_decisions_total{rule=per_user,outcome=allowed} = %v", got)
	}
}

func TestShouldRateLimitFields(t *testing.T) {
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory())
	type step struct {
		name    string
		req     *rlsv3.RateLimitRequest
		overall rlsv3.RateLimitResponse_Code
		codes   []rlsv3.RateLimitResponse_Code
		check   func(t *testing.T, resp *rlsv3.RateLimitResponse)
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	withHits := func(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	withLimit := func(d *rlcommon.RateLimitDescriptor, n uint32, u typev3.RateLimitUnit) *rlcommon.RateLimitDescriptor {
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: n, Unit: u}
		return d
	}
	remaining := func(want ...uint32) func(*testing.T, *rlsv3.RateLimitResponse) {
		return func(t *testing.T, resp *rlsv3.RateLimitResponse) {
			for i, w := range want {
				if got := resp.Statuses[i].LimitRemaining; got != w {
					t.Errorf("status %d: limit_remaining %d, want %d", i, got, w)
				}
			}
		}
	}
	steps := []step{
		{"request hits_addend", &rlsv3.RateLimitRequest{HitsAddend: 2, Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "h")}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, remaining(1)},
		{"descriptor hits_addend overrides the request's", &rlsv3.RateLimitRequest{HitsAddend: 3,
			Descriptors: []*rlcommon.RateLimitDescriptor{withHits(desc("user", "h"), 1)}}, ok, []rlsv3.RateLimitResponse_Code{ok}, remaining(0)},
		{"hits over what remains", &rlsv3.RateLimitRequest{HitsAddend: 4, Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "h2")}},
			over, []rlsv3.RateLimitResponse_Code{over}, nil},
		{"limit override", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{withLimit(desc("user", "o"), 10, typev3.RateLimitUnit_HOUR)}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, func(t *testing.T, resp *rlsv3.RateLimitResponse) {
				l := resp.Statuses[0].CurrentLimit
				if l.GetRequestsPerUnit() != 10 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR || l.GetName() != "per_user" || resp.Statuses[0].LimitRemaining != 9 {
					t.Errorf("override status %v", resp.Statuses[0])
				}
			}},
		{"override has its own counter", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "o")}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, remaining(2)},
		{"override of an unknown descriptor", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{withLimit(desc("nothing", "x"), 1, typev3.RateLimitUnit_DAY)}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, remaining(0)},
		{"override of an unknown descriptor, again", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{withLimit(desc("nothing", "x"), 1, typev3.RateLimitUnit_DAY)}},
			over, []rlsv3.RateLimitResponse_Code{over}, nil},
		{"zero override allows nothing", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{withLimit(desc("user", "z"), 0, typev3.RateLimitUnit_SECOND)}},
			over, []rlsv3.RateLimitResponse_Code{over}, nil},
		{"no rule, unlimited", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("nothing", "x"), desc("free", "y")}},
			ok, []rlsv3.RateLimitResponse_Code{ok, ok}, func(t *testing.T, resp *rlsv3.RateLimitResponse) {
				if resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 0 {
					t.Errorf("no limit applies, yet %v", resp)
				}
			}},
		{"block list", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("blocked", "x")}},
			over, []rlsv3.RateLimitResponse_Code{over}, nil},
		{"descriptor shadow mode, first", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("soft", "x")}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, nil},
		{"descriptor shadow mode: over, not enforced", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("soft", "x")}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, nil},
		{"several limits: the closest is reported", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("multi", "m")}},
			ok, []rlsv3.RateLimitResponse_Code{ok}, func(t *testing.T, resp *rlsv3.RateLimitResponse) {
				l := resp.Statuses[0].CurrentLimit
				if l.GetRequestsPerUnit() != 2 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || l.GetUnitMultiplier().GetValue() != 30 {
					t.Errorf("current_limit %v, want 2 per 30 s", l)
				}
			}},
	}
	for _, s := range steps {
		resp := ask(t, c, s.req)
		if resp.OverallCode != s.overall {
			t.Errorf("%s: overall %v, want %v", s.name, resp.OverallCode, s.overall)
		}
		for i, want := range s.codes {
			if resp.Statuses[i].Code != want {
				t.Errorf("%s: status %d %v, want %v", s.name, i, resp.Statuses[i].Code, want)
			}
		}
		if s.check != nil {
			s.check(t, resp)
		}
	}
}

func TestShouldRateLimitGlobalShadowAndNoHeaders(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory(), WithShadow(true), WithResponseHeaders(false), WithRegisterer(reg))
	var resp *rlsv3.RateLimitResponse
	for range 4 {
		resp = ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "s")}})
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("global shadow mode: %v", resp)
	}
	if len(resp.ResponseHeadersToAdd) != 0 {
		t.Fatalf("headers turned off, yet %v", resp.ResponseHeadersToAdd)
	}
	if got := decisiontest.Count(t, reg, "per_user", decide.OutcomeShadowDenied); got != 1 {
		t.Fatalf("shadow_rejected = %v", got)
	}
}

func TestShouldRateLimitRefusesBadRequests(t *testing.T) {
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory())
	many := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc("user", "x")
	}
	huge := desc("user", "x")
	huge.HitsAddend = wrapperspb.UInt64(MaxHits + 1)
	badUnit := desc("user", "x")
	badUnit.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
		code codes.Code
	}{
		{"no domain", &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "x")}}, codes.InvalidArgument},
		{"no descriptors", &rlsv3.RateLimitRequest{Domain: "api"}, codes.InvalidArgument},
		{"empty descriptor", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{{}}}, codes.InvalidArgument},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: many}, codes.InvalidArgument},
		{"huge hits_addend", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{huge}}, codes.InvalidArgument},
		{"override without unit", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{badUnit}}, codes.InvalidArgument},
		{"override without unit after a valid descriptor", &rlsv3.RateLimitRequest{Domain: "api",
			Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "before"), badUnit}}, codes.InvalidArgument},
		{"message over the size cap", &rlsv3.RateLimitRequest{Domain: "api", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", strings.Repeat("x", DefaultMaxMessageBytes))}}, codes.ResourceExhausted},
	} {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != tc.code {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.code)
		}
	}
	// A refused request charged nothing, not even the descriptors before the bad one.
	if resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "before")}}); resp.Statuses[0].LimitRemaining != 2 {
		t.Errorf("after a refused request, the first of its own: limit_remaining %d, want 2 of 3", resp.Statuses[0].LimitRemaining)
	}
	// Unknown domain: Envoy's service answers OK.
	resp := ask(t, c, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "x")}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("unknown domain: %v", resp)
	}
}

// stores gives each test the memory store and a Redis store on a real redis-server.
func stores(t *testing.T) map[string]func() limiter.Limiter {
	return map[string]func() limiter.Limiter{
		"memory": func() limiter.Limiter { return limiter.NewMemory() },
		"redis": func() limiter.Limiter {
			redistest.Require(t)
			srv := redistest.Start(t)
			// A budget no loaded machine misses: a Redis timeout would fall back to
			// counting in memory, and these tests check Redis's own counting.
			r, err := redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			return r
		},
	}
}

func TestShouldRateLimitConcurrentExactlyTheLimit(t *testing.T) {
	const limit, callers, each = 50, 16, 8
	set := parseRules(t, `
domain: api
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 50}
`)
	for name, newStore := range stores(t) {
		t.Run(name, func(t *testing.T) {
			c := rlsClient(t, set, newStore())
			var granted, denied atomic.Int64
			var wg sync.WaitGroup
			for range callers {
				wg.Go(func() {
					for range each {
						resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "api",
							Descriptors: []*rlcommon.RateLimitDescriptor{desc("k", "one")}})
						switch {
						case err != nil:
							t.Error(err)
						case resp.OverallCode == rlsv3.RateLimitResponse_OK:
							granted.Add(1)
						default:
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if granted.Load() != limit || denied.Load() != callers*each-limit {
				t.Fatalf("granted %d, denied %d: want exactly %d granted", granted.Load(), denied.Load(), limit)
			}
		})
	}
}

// An RLS replica and a front door sharing one Redis count on the same counters.
func TestShouldRateLimitSharesRedisWithTheFrontDoor(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t)
	// Redis gets a budget no loaded machine misses: a timeout would fall back to
	// counting in memory, and this test checks the counters Redis shares.
	// Both on one fixed clock: the per-minute window must not roll over between the
	// requests (a run that crossed a minute boundary failed).
	set := parseRules(t, rlsRules)
	now := time.Date(2026, 11, 30, 12, 0, 30, 0, time.UTC)
	clock := redisstore.WithClock(func() time.Time { return now })
	front, err := redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second), clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { front.Close() })
	rls, err := redisstore.New(srv.Client(), redisstore.WithTimeout(10*time.Second), clock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rls.Close() })
	c := rlsClient(t, set, rls)
	mw := newMiddleware(t, set, front)
	h := mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	get := func() int {
		r := httptest.NewRequest("GET", "/v1/users/7", nil)
		r.Header.Set("X-User", "dana")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w.Code
	}
	if code := get(); code != 200 {
		t.Fatalf("front door: %d", code)
	}
	if resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "dana")}}); resp.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("the RLS does not see the front door's request: %v", resp.Statuses[0])
	}
	if code := get(); code != 200 {
		t.Fatalf("front door: %d", code)
	}
	if code := get(); code != http.StatusTooManyRequests {
		t.Fatalf("front door after 3 shared requests: %d, want 429", code)
	}
	if resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc("user", "dana")}}); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("RLS after the front door used the quota: %v", resp)
	}
}

// With Redis down, each rule's failure mode decides.
func TestShouldRateLimitRedisOutage(t *testing.T) {
	redistest.Require(t)
	srv := redistest.Start(t)
	store, err := redisstore.New(srv.Client(), redisstore.WithTimeout(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	c := rlsClient(t, parseRules(t, rlsRules), store)
	srv.Stop()
	for _, tc := range []struct {
		key   string
		codes []rlsv3.RateLimitResponse_Code // first and second call
	}{
		{"fail_open", []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK}},
		{"fail_closed", []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT}},
		{"fail_local", []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}},
	} {
		for i, want := range tc.codes {
			resp := ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{desc(tc.key, "x")}})
			if resp.OverallCode != want {
				t.Errorf("%s, call %d with Redis down: %v, want %v", tc.key, i+1, resp.OverallCode, want)
			}
		}
	}
	if store.Fallbacks() == 0 {
		t.Fatal("no fallback counted")
	}
}

// Metric labels stay bounded: request values and unknown domains never become labels.
func TestShouldRateLimitLabelsAreBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := rlsClient(t, parseRules(t, rlsRules), limiter.NewMemory(), WithRegisterer(reg))
	secret := desc("user", "sk_live_SECRET")
	secret.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
	ask(t, c, &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{secret, desc("nothing", "sk_live_OTHER")}})
	other := desc("user", "x")
	other.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_SECOND}
	ask(t, c, &rlsv3.RateLimitRequest{Domain: "attacker-chosen", Descriptors: []*rlcommon.RateLimitDescriptor{other}})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.Metric {
			for _, l := range m.Label {
				if strings.Contains(l.GetValue(), "sk_live") || strings.Contains(l.GetValue(), "attacker") {
					t.Errorf("%s has the label %s=%q", mf.GetName(), l.GetName(), l.GetValue())
				}
			}
		}
	}
	if decisiontest.Count(t, reg, "per_user", decide.OutcomeAllowed) != 1 {
		t.Error("the override was not counted under its rule's name")
	}
}

func TestNewRateLimitServiceBadOptions(t *testing.T) {
	set := parseRules(t, rlsRules)
	src := ingress.StaticRules{S: set}
	clash := prometheus.NewRegistry()
	clash.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "sluice_decision_duration_seconds", Help: "not sluice's"}))
	tests := []struct {
		name string
		src  ingress.RulesSource
		lim  limiter.Limiter
		opts []Option
	}{
		{"no rules", nil, limiter.NewMemory(), nil},
		{"no limiter", src, nil, nil},
		{"nil logger", src, limiter.NewMemory(), []Option{WithLogger(nil)}},
		{"clashing registry", src, limiter.NewMemory(), []Option{WithRegisterer(clash)}},
	}
	for _, tt := range tests {
		if s, err := NewRateLimitService(tt.src, tt.lim, tt.opts...); err == nil || s != nil {
			t.Errorf("%s: NewRateLimitService = %v, %v; want an error", tt.name, s, err)
		}
	}
}

// TestRateLimitHeadersAsHTTPHeader pins rateLimitHeaders, which ShouldRateLimit uses
// to skip the http.Header, to the list the front door's own header writers give.
func TestRateLimitHeadersAsHTTPHeader(t *testing.T) {
	set := parseRules(t, `
domain: api
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per_user}
  - key: multi
    rate_limits:
      - {unit: hour, requests_per_unit: 100}
      - {window: 30s, requests_per_unit: 2}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 10}
    algorithm: token_bucket
    burst: 20
`)
	ruleOf := func(key string) *rules.Rule {
		cs := set.Evaluate("api", [][]rules.Entry{{{Key: key, Value: "v"}}}, nil)
		if len(cs) != 1 {
			t.Fatalf("%s: %d checks", key, len(cs))
		}
		return cs[0].Rule
	}
	for _, tc := range []struct {
		name, key  string
		limit      int
		d          limiter.Decision
		retryAfter time.Duration // > 0: over the limit
	}{
		{"allowed", "user", 0, limiter.Decision{Allowed: true, Limit: 3, Remaining: 2, ResetAfter: 40 * time.Second}, 0},
		{"over", "user", 0, limiter.Decision{Limit: 3, Remaining: 0, RetryAfter: 1500 * time.Millisecond, ResetAfter: time.Minute}, 1500 * time.Millisecond},
		{"second limit", "multi", 1, limiter.Decision{Allowed: true, Limit: 2, Remaining: 1, ResetAfter: 29 * time.Second}, 0},
		{"bucket", "bucket", 0, limiter.Decision{Allowed: true, Limit: 20, Remaining: 19, ResetAfter: 100 * time.Millisecond}, 0},
		{"huge", "user", 0, limiter.Decision{Allowed: true, Limit: 1 << 60, Remaining: 1 << 60, ResetAfter: 1 << 62}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rule := ruleOf(tc.key)
			h := http.Header{}
			decide.FieldsOf(rule, tc.limit, tc.d).SetHeaders(h)
			var wait string
			if tc.retryAfter > 0 {
				decide.SetRetryAfter(h, tc.retryAfter)
				wait = strconv.FormatInt(decide.RetryAfterSeconds(tc.retryAfter), 10)
			}
			want := headerValues(h)
			got := rateLimitHeaders(decide.FieldsOf(rule, tc.limit, tc.d), wait)
			if len(got) != len(want) || len(want) < 4 {
				t.Fatalf("got %v, want %v", got, want)
			}
			for i := range want {
				if got[i].Key != want[i].Key || got[i].Value != want[i].Value {
					t.Errorf("header %d: got %s: %q, want %s: %q", i, got[i].Key, got[i].Value, want[i].Key, want[i].Value)
				}
			}
		})
	}
}
