package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/envoy"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// leanServer serves sluice's rate limit service (memory store) on a free port with
// the benchmark's rules and a rule of limit 1 for key "once".
func leanServer(t *testing.T) string {
	t.Helper()
	set, err := rules.Parse(rules.File{Name: "rules.yaml", Data: []byte(rlsRules + `  - key: once
    rate_limit: {unit: hour, requests_per_unit: 1}
`)})
	if err != nil {
		t.Fatal(err)
	}
	rls, err := envoy.NewRateLimitService(ingress.StaticRules{S: set}, limiter.NewMemory())
	if err != nil {
		t.Fatal(err)
	}
	srv := envoy.NewServer(rls, nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String()
}

// leanMessage is req as a lean caller sends it: gRPC's length-prefixed message.
func leanMessage(t *testing.T, req *rlsv3.RateLimitRequest) []byte {
	t.Helper()
	b, err := proto.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	return append([]byte{0, byte(len(b) >> 24), byte(len(b) >> 16), byte(len(b) >> 8), byte(len(b))}, b...)
}

// TestLeanConnCalls makes enough concurrent calls on two connections that both
// directions' flow-control windows (64 KiB at first) are used up many times over,
// and checks every answer in full.
func TestLeanConnCalls(t *testing.T) {
	addr := leanServer(t)
	const callers, calls = 8, 1500
	newCaller, closeAll, err := rlsCallers("lean", addr, 2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll()
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for id := range callers {
		reqs := []*rlsv3.RateLimitRequest{rlsRequest(fmt.Sprintf("c%d-a", id)), rlsRequest(fmt.Sprintf("c%d-b", id))}
		call, err := newCaller(id, reqs)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			for i := range calls {
				b, err := call(context.Background(), i%len(reqs))
				if err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
					return
				}
				var resp rlsv3.RateLimitResponse
				if err := proto.Unmarshal(b, &resp); err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
					return
				}
				code, known := overallCode(b)
				want := uint32(rlsLimit - 1 - i/len(reqs))
				if !known || code != rlsv3.RateLimitResponse_OK || resp.OverallCode != code || len(resp.Statuses) != 1 ||
					resp.Statuses[0].LimitRemaining != want || len(resp.ResponseHeadersToAdd) == 0 {
					errs <- fmt.Errorf("call %d: code %v (known %v), response %v; want OK with %d remaining", i, code, known, &resp, want)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestLeanConnStreamLimit calls a server that allows 2 concurrent streams with 8
// callers on one connection: calls wait for a free stream instead of being refused.
func TestLeanConnStreamLimit(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "rules.yaml", Data: []byte(rlsRules)})
	if err != nil {
		t.Fatal(err)
	}
	rls, err := envoy.NewRateLimitService(ingress.StaticRules{S: set}, limiter.NewMemory())
	if err != nil {
		t.Fatal(err)
	}
	c := leanTo(t, rls, 2)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for id := range 8 {
		msg := leanMessage(t, rlsRequest(fmt.Sprintf("c%d", id)))
		wg.Go(func() {
			call := newLeanCall()
			for i := range 200 {
				if _, err := c.Call(context.Background(), call, msg); err != nil {
					errs <- fmt.Errorf("caller %d, call %d: %w", id, i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// blockingRLS answers domain "fast" at once and blocks other calls until they are
// cancelled; it reports each such call on started and its cancellation on cancelled.
type blockingRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	started, cancelled chan struct{}
}

func (b *blockingRLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.Domain == "fast" {
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	}
	b.started <- struct{}{}
	<-ctx.Done()
	b.cancelled <- struct{}{}
	return nil, ctx.Err()
}

// TestLeanConnCancel: a cancelled call resets its stream, so the server sees the
// cancellation and the stream no longer counts against its limit of one.
func TestLeanConnCancel(t *testing.T) {
	b := &blockingRLS{started: make(chan struct{}, 1), cancelled: make(chan struct{}, 1)}
	c := leanTo(t, b, 1)
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-b.started // the call is under way
		cancel()
	}()
	if _, err := c.Call(ctx, newLeanCall(), leanMessage(t, rlsRequest("slow"))); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v", err)
	}
	<-b.cancelled
	fast := leanMessage(t, &rlsv3.RateLimitRequest{Domain: "fast"})
	if b, err := c.Call(context.Background(), newLeanCall(), fast); err != nil {
		t.Fatalf("after the reset: %v", err)
	} else if code, _ := overallCode(b); code != rlsv3.RateLimitResponse_OK {
		t.Errorf("after the reset: %v", code)
	}
}

// TestLeanConnAnswers checks OVER_LIMIT, gRPC errors, cancellation and closing.
func TestLeanConnAnswers(t *testing.T) {
	addr := leanServer(t)
	c, err := dialLean(addr, rlsMethod)
	if err != nil {
		t.Fatal(err)
	}
	call := newLeanCall()
	req := rlsRequest("x")
	req.Descriptors[0].Entries[0].Key = "once"
	once := leanMessage(t, req)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		b, err := c.Call(context.Background(), call, once)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if code, known := overallCode(b); !known || code != want {
			t.Errorf("call %d: %v (known %v), want %v", i, code, known, want)
		}
	}
	// An empty domain is refused with InvalidArgument (3), a trailers-only answer.
	if _, err := c.Call(context.Background(), call, leanMessage(t, &rlsv3.RateLimitRequest{})); err == nil || !strings.Contains(err.Error(), "gRPC status 3") {
		t.Errorf("empty domain: %v", err)
	}
	// The connection goes on after an error.
	if _, err := c.Call(context.Background(), call, leanMessage(t, rlsRequest("after"))); err != nil {
		t.Errorf("after an error: %v", err)
	}
	other, err := dialLean(addr, "/envoy.service.ratelimit.v3.RateLimitService/Nope")
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.Call(context.Background(), newLeanCall(), leanMessage(t, rlsRequest("y"))); err == nil || !strings.Contains(err.Error(), "gRPC status 12") {
		t.Errorf("unknown method: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.Call(ctx, call, leanMessage(t, rlsRequest("z"))); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
	c.Close()
	if _, err := c.Call(context.Background(), newLeanCall(), leanMessage(t, rlsRequest("z"))); err == nil {
		t.Error("a call on a closed connection succeeded")
	}
}

func TestOverallCode(t *testing.T) {
	for _, tc := range []struct {
		resp  *rlsv3.RateLimitResponse
		code  rlsv3.RateLimitResponse_Code
		known bool
	}{
		{&rlsv3.RateLimitResponse{}, rlsv3.RateLimitResponse_UNKNOWN, true},
		{&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{LimitRemaining: 3}}}, rlsv3.RateLimitResponse_OVER_LIMIT, true},
		{&rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{}}, OverallCode: rlsv3.RateLimitResponse_OK}, rlsv3.RateLimitResponse_OK, true},
	} {
		b, err := proto.Marshal(tc.resp)
		if err != nil {
			t.Fatal(err)
		}
		if code, known := overallCode(b); code != tc.code || known != tc.known {
			t.Errorf("%v: %v %v", tc.resp, code, known)
		}
	}
	if _, known := overallCode([]byte{0x08}); known {
		t.Error("a truncated varint is known")
	}
	if _, known := overallCode([]byte{0xff}); known {
		t.Error("a truncated tag is known")
	}
}

// leanTo serves rls on a gRPC server of its own allowing streams concurrent streams
// per connection and returns a lean connection to it; both go when the test ends.
func leanTo(t *testing.T, rls rlsv3.RateLimitServiceServer, streams uint32) *leanConn {
	t.Helper()
	srv := grpc.NewServer(grpc.MaxConcurrentStreams(streams))
	rlsv3.RegisterRateLimitServiceServer(srv, rls)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	c, err := dialLean(ln.Addr().String(), rlsMethod)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
