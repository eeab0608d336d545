package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/limiter/redistest"
)

func grpcConn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func shouldRateLimit(t *testing.T, c rlsv3.RateLimitServiceClient, user string) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "route", Value: "orders"}, {Key: "user", Value: user}}}}})
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// sluice rls and sluice serve --grpc-listen share one Redis with the front door: the
// RLS of either and the front door count on the same counters.
func TestRLSSharesRedisWithServe(t *testing.T) {
	redistest.Require(t)
	up := newUpstream(t, 0)
	redisServer := redistest.Start(t)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(4))
	redisURL := "redis://" + redisServer.Addr() + "/0"
	rlsAddr, serveGRPC := freeAddr(t), freeAddr(t)
	// --redis-timeout 5s: the two share counts only while Redis answers (a late
	// answer on a loaded machine would be decided locally, by failure_mode).
	rls := startCommand(t, "rls", "--rules", rulesPath, "--redis", redisURL, "--redis-timeout", "5s", "--grpc-listen", rlsAddr)
	serve := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s", "--grpc-listen", serveGRPC)
	alone := rlsv3.NewRateLimitServiceClient(grpcConn(t, rlsAddr))
	beside := rlsv3.NewRateLimitServiceClient(grpcConn(t, serveGRPC))

	if r := shouldRateLimit(t, alone, "u1"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 3 {
		t.Fatalf("rls, first: %v", r)
	}
	if r := send(t, "GET", serve.url+"/v1/orders", nil, "X-User-ID", "u1"); r.status != 200 || r.header.Get("X-Ratelimit-Remaining") != "2" {
		t.Fatalf("front door, second: %d %v", r.status, r.header)
	}
	if r := shouldRateLimit(t, beside, "u1"); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 1 {
		t.Fatalf("serve's RLS, third: %v", r)
	}
	shouldRateLimit(t, alone, "u1")
	if r := shouldRateLimit(t, alone, "u1"); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("rls, fifth: %v", r)
	}
	if r := send(t, "GET", serve.url+"/v1/orders", nil, "X-User-ID", "u1"); r.status != 429 {
		t.Fatalf("front door after the RLS used the quota: %d", r.status)
	}
	metrics := send(t, "GET", rls.admin+"/metrics", nil)
	if !strings.Contains(metrics.body, `sluice_decisions_total{outcome="rejected",rule="orders_per_user"} 1`) {
		t.Fatalf("rls /metrics:\n%s", grepLines(metrics.body, "sluice_decisions_total"))
	}
	if code := rls.stop(t); code != 0 {
		t.Fatalf("sluice rls exited %d after SIGTERM", code)
	}
}

// ext_authz on sluice serve: an order over a defer rule, with its body, is parked
// and delivered downstream by the dispatcher; its ticket is followed on --check-listen.
func TestExtAuthzDefersThroughServe(t *testing.T) {
	down := newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
	grpcAddr, checkAddr := freeAddr(t), freeAddr(t)
	startSluice(t, "--rules", rulesPath, "--upstream", down.URL, "--grpc-listen", grpcAddr, "--check-listen", checkAddr)
	c := authv3.NewAuthorizationClient(grpcConn(t, grpcAddr))
	order := func(n string) *authv3.CheckResponse {
		body := `{"order":"` + n + `"}`
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := c.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
			Source: &authv3.AttributeContext_Peer{Address: &corev3.Address{Address: &corev3.Address_SocketAddress{
				SocketAddress: &corev3.SocketAddress{Address: "192.0.2.4"}}}},
			Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
				Method: "POST", Path: "/v1/orders", Host: "shop.example", RawBody: []byte(body),
				Headers: map[string]string{"content-type": "application/json", "x-order": n, "idempotency-key": `"` + n + `"`}}}}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if r := order("o1"); r.GetOkResponse() == nil {
		t.Fatalf("first order: %v", r)
	}
	d := order("o2").GetDeniedResponse()
	if d == nil || d.Status.GetCode() != http.StatusAccepted {
		t.Fatalf("second order: %v", d)
	}
	var acc struct{ Ticket string }
	if err := json.Unmarshal([]byte(d.Body), &acc); err != nil || acc.Ticket == "" {
		t.Fatalf("202 body %q: %v", d.Body, err)
	}
	down.waitArrived(t, []string{`"o2"`}, 30*time.Second)
	waitFor(t, "the ticket is done", 30*time.Second, func() bool {
		resp, err := http.Get("http://" + checkAddr + "/sluice/v1/deferred/" + acc.Ticket)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode == 200 && strings.Contains(string(b), `"status":"done"`)
	})
}

// Whatever hits_addend Envoy sends (0 to 2^32−1), `sluice rls` never answers a
// negative Retry-After or duration_until_reset: a hits_addend over the limit answered
// Retry-After: -9223372035.
func TestRLSHitsAddendNeverGivesANegativeWait(t *testing.T) {
	rulesPath := writeRules(t, t.TempDir(), e2eRules(4))
	rlsAddr := freeAddr(t)
	startCommand(t, "rls", "--rules", rulesPath, "--grpc-listen", rlsAddr)
	c := rlsv3.NewRateLimitServiceClient(grpcConn(t, rlsAddr))
	for i, hits := range []uint32{0, 1, 4, 5, 1 << 31, 1<<32 - 1} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "e2e", HitsAddend: hits, Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "route", Value: "orders"}, {Key: "user", Value: "u" + strconv.Itoa(i)}}}}})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if d := resp.Statuses[0].GetDurationUntilReset(); d != nil && d.AsDuration() < 0 {
			t.Errorf("hits %d: duration_until_reset %v", hits, d.AsDuration())
		}
		over := resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT
		if over != (hits > 4) {
			t.Errorf("hits %d of a limit of 4: %v", hits, resp.OverallCode)
		}
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key != "retry-after" {
				continue
			}
			if n, err := strconv.ParseInt(h.Value, 10, 64); err != nil || n < 1 || n > 3600 {
				t.Errorf("hits %d: Retry-After %q, want 1 to 3600 s", hits, h.Value)
			}
			over = false
		}
		if over {
			t.Errorf("hits %d: over the limit without Retry-After: %v", hits, resp.ResponseHeadersToAdd)
		}
	}
}

// quotaE2ERules: envoyproxy/ratelimit's example quota services (1 and 2 per minute,
// quota_mode), and a route of the front door that reaches both.
const quotaE2ERules = `domain: rl
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1, name: service_1}
    metadata:
      service_with_quota: {name: service_1}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: service_2}
    metadata:
      service_with_quota: {name: service_2}
routes:
  - name: quota
    match: {path: /quota}
    descriptors:
      - [{key: service, value: service_1}]
      - [{key: service, value: service_2}]
`

// Envoy's quota_mode through the binaries, sluice rls and the front door of sluice
// serve on one Redis (envoyproxy/ratelimit's integration test quota.sh, its three
// requests split between them): the first two pass, the second with service_1
// exhausted, the third is denied on both, every quota being exhausted.
func TestQuotaModeThroughRLSAndServe(t *testing.T) {
	redistest.Require(t)
	up := newUpstream(t, 0)
	redisServer := redistest.Start(t)
	rulesPath := writeRules(t, t.TempDir(), quotaE2ERules)
	redisURL := "redis://" + redisServer.Addr() + "/0"
	rlsAddr := freeAddr(t)
	rls := startCommand(t, "rls", "--rules", rulesPath, "--redis", redisURL, "--redis-timeout", "5s", "--grpc-listen", rlsAddr, "--rls-dynamic-metadata")
	serve := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s")
	c := rlsv3.NewRateLimitServiceClient(grpcConn(t, rlsAddr))
	// The quota with room, as the dynamic metadata names it for the proxy's route.
	withQuota := func(r *rlsv3.RateLimitResponse) string {
		return r.GetDynamicMetadata().GetFields()["metadata"].GetStructValue().GetFields()["service_with_quota"].GetStructValue().GetFields()["name"].GetStringValue()
	}
	ask := func() *rlsv3.RateLimitResponse {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "service", Value: "service_1"}}},
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "service", Value: "service_2"}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	ok, over := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	if r := ask(); r.OverallCode != ok || r.Statuses[0].Code != ok || r.Statuses[1].Code != ok || withQuota(r) != "service_1" {
		t.Fatalf("rls, first: %v", r)
	}
	if r := send(t, "GET", serve.url+"/quota", nil); r.status != 200 || r.header.Get("X-Ratelimit-Remaining") != "0" {
		t.Fatalf("front door, second (service_1 exhausted, service_2 has room): %d %v", r.status, r.header)
	}
	if r := ask(); r.OverallCode != over || r.Statuses[0].Code != over || r.Statuses[1].Code != over || withQuota(r) != "" {
		t.Fatalf("rls, third (every quota exhausted): %v", r)
	}
	r := send(t, "GET", serve.url+"/quota", nil)
	if r.status != 429 || !strings.Contains(r.body, "service_1") || !strings.Contains(r.body, "service_2") {
		t.Fatalf("front door, fourth: %d %s", r.status, r.body)
	}
	if r.header.Get("Retry-After") == "" {
		t.Fatalf("429 without Retry-After: %v", r.header)
	}
	metrics := send(t, "GET", serve.admin+"/metrics", nil)
	if !strings.Contains(metrics.body, `sluice_decisions_total{outcome="quota_exhausted",rule="service_1"} 1`) {
		t.Fatalf("serve /metrics:\n%s", grepLines(metrics.body, "sluice_decisions_total"))
	}
	if code := rls.stop(t); code != 0 {
		t.Fatalf("sluice rls exited %d after SIGTERM", code)
	}
}
