package envoy

import (
	"context"
	"crypto/tls"
	"runtime"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
)

// Server is the gRPC server of the Envoy-facing services, with the standard health
// service (grpc.health.v1: SERVING for "" and each service until Shutdown) and server
// reflection.
type Server struct {
	*grpc.Server
	health *health.Server
	names  []string
}

// ServerOption configures a Server.
type ServerOption func(*serverConfig)

type serverConfig struct {
	tls      *tls.Config
	maxRecv  int
	streams  uint32
	idle     time.Duration
	pingTime time.Duration
}

// GCPercent is the garbage collector's target (GOGC) that `sluice rls` runs with
// unless GOGC is set. The rate limit service's live heap is small (the rules, and on
// Redis the over-limit cache and the fallback store, each bounded) while every call
// leaves a few kilobytes of garbage (gRPC's stream, the request, the response): at
// Go's default of 100 the collector runs so often that it takes about a sixth of the
// CPU of a call on Redis; at 400 the heap may grow to five times the live data
// between collections, and the CPU per call falls by as much (sluice-bench rls).
const GCPercent = 400

// DefaultMaxMessageBytes is the default largest message a Server receives.
const DefaultMaxMessageBytes = 4 << 20

// WithTLS serves TLS with conf (with ClientAuth and ClientCAs set for mutual TLS).
func WithTLS(conf *tls.Config) ServerOption { return func(c *serverConfig) { c.tls = conf } }

// WithMaxMessageBytes caps received messages (default DefaultMaxMessageBytes; an
// ext_authz check carrying a request body needs room for it).
func WithMaxMessageBytes(n int) ServerOption { return func(c *serverConfig) { c.maxRecv = n } }

// WithKeepalive sets how long a connection may stay idle before it is closed, and how
// often an idle connection is pinged (defaults 10 minutes and 1 minute).
func WithKeepalive(idle, ping time.Duration) ServerOption {
	return func(c *serverConfig) { c.idle, c.pingTime = idle, ping }
}

// NewServer returns a Server offering rls and auth (either may be nil).
func NewServer(rls *RateLimitService, auth *AuthService, opts ...ServerOption) *Server {
	c := serverConfig{maxRecv: DefaultMaxMessageBytes, streams: 1024, idle: 10 * time.Minute, pingTime: time.Minute}
	for _, o := range opts {
		o(&c)
	}
	gopts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(c.maxRecv),
		grpc.MaxConcurrentStreams(c.streams),
		// Calls run on a pool of goroutines that keep their grown stacks, rather than
		// a new goroutine per call whose stack grows again on every call (about a
		// tenth of the CPU of ShouldRateLimit on Redis); calls beyond the pool still
		// get a goroutine of their own.
		grpc.NumStreamWorkers(uint32(max(64, 16*runtime.GOMAXPROCS(0)))),
		// Fixed flow-control windows instead of grpc-go's estimate of the
		// bandwidth-delay product, which pings a busy connection's peer about every
		// third call (a PING and its ACK each way, on the server and on Envoy) to
		// size windows for bulk transfers: rate limit calls are a few hundred bytes,
		// and an ext_authz body of up to WithMaxMessageBytes flows in a 1 MiB window.
		// 16 MiB for a connection is what the estimate grows to at most.
		grpc.StaticStreamWindowSize(1 << 20),
		grpc.StaticConnWindowSize(16 << 20),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: c.idle, Time: c.pingTime, Timeout: 20 * time.Second}),
		// Envoy pings idle connections when told to; a peer pinging more often than
		// every 10 s is cut off rather than allowed to keep the server busy.
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
	if c.tls != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(c.tls)))
	}
	s := &Server{Server: grpc.NewServer(gopts...), health: health.NewServer()}
	if rls != nil {
		rlsv3.RegisterRateLimitServiceServer(s.Server, rls)
		s.names = append(s.names, rlsv3.RateLimitService_ServiceDesc.ServiceName)
	}
	if auth != nil {
		authv3.RegisterAuthorizationServer(s.Server, auth)
		s.names = append(s.names, authv3.Authorization_ServiceDesc.ServiceName)
	}
	for _, n := range s.names {
		s.health.SetServingStatus(n, healthpb.HealthCheckResponse_SERVING)
	}
	healthpb.RegisterHealthServer(s.Server, s.health)
	reflection.Register(s.Server)
	return s
}

// Shutdown reports NOT_SERVING, so that Envoy's health checks turn elsewhere, then
// stops taking calls and waits for those under way until ctx is done, when it closes
// every connection.
func (s *Server) Shutdown(ctx context.Context) {
	s.health.Shutdown()
	done := make(chan struct{})
	go func() {
		s.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		s.Stop()
		<-done
	}
}
