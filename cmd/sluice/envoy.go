package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/ingress/envoy"
)

// envoyConfig configures the services that proxies call instead of sending traffic
// through the front door: Envoy's rate limit service and ext_authz over gRPC, and the
// HTTP check of nginx auth_request and Traefik ForwardAuth.
type envoyConfig struct {
	grpcListen  string
	cert, key   string
	ca          string
	maxMessage  sizeFlag
	headers     bool
	dynMeta     bool
	checkListen string
}

func (c *envoyConfig) flags(fs *pflag.FlagSet, front bool) {
	def := ""
	if !front {
		def = "127.0.0.1:8081" // sluice rls is nothing without it
	}
	fs.StringVar(&c.grpcListen, "grpc-listen", def, "`address` of the gRPC services for Envoy: envoy.service.ratelimit.v3 RateLimitService, envoy.service.auth.v3 Authorization, health and reflection; empty: none")
	fs.StringVar(&c.cert, "grpc-cert", "", "certificate `file` for TLS on --grpc-listen (with --grpc-key)")
	fs.StringVar(&c.key, "grpc-key", "", "key `file` for TLS on --grpc-listen")
	fs.StringVar(&c.ca, "grpc-ca", "", "`file` of CA certificates: --grpc-listen then requires client certificates signed by them (mutual TLS)")
	c.maxMessage = sizeFlag(ingress.DefaultMaxBody + 64<<10)
	fs.Var(&c.maxMessage, "grpc-max-message", "largest gRPC message, in bytes or with a unit (4MiB): an ext_authz check carrying a body needs --max-body and some room")
	fs.BoolVar(&c.headers, "rls-headers", true, "the rate limit service returns response_headers_to_add (X-Ratelimit-*, RateLimit, RateLimit-Policy, Retry-After)")
	fs.BoolVar(&c.dynMeta, "rls-dynamic-metadata", false, "the rate limit service returns dynamic_metadata, as Envoy's RESPONSE_DYNAMIC_METADATA: the domain, the descriptors and the metadata of the rules whose descriptors are OK (with quota_mode: the quotas with room)")
	fs.StringVar(&c.checkListen, "check-listen", "", "`address` of the HTTP check for nginx auth_request and Traefik ForwardAuth ("+ingress.CheckPath+") and of the deferred tickets; for the proxies only; empty: none")
}

// check checks the flags before anything starts.
func (c *envoyConfig) check(mode gatewayMode) error {
	if mode.rls && c.grpcListen == "" && c.checkListen == "" {
		return errors.New("--grpc-listen or --check-listen is required")
	}
	if (c.cert == "") != (c.key == "") {
		return errors.New("--grpc-cert and --grpc-key go together")
	}
	if c.ca != "" && c.cert == "" {
		return errors.New("--grpc-ca needs --grpc-cert and --grpc-key")
	}
	if c.grpcListen == "" && (c.cert != "" || c.ca != "") {
		return errors.New("--grpc-cert / --grpc-ca need --grpc-listen")
	}
	if c.maxMessage < 4<<10 || c.maxMessage > 1<<30 {
		return errors.New("--grpc-max-message must be between 4KiB and 1GiB")
	}
	_, err := c.tls()
	return err
}

// tls is the server TLS configuration of the flags; nil without --grpc-cert. The
// certificate is read again for each handshake, so a renewed one is used without a
// restart.
func (c *envoyConfig) tls() (*tls.Config, error) {
	if c.cert == "" {
		return nil, nil
	}
	if _, err := tls.LoadX509KeyPair(c.cert, c.key); err != nil {
		return nil, fmt.Errorf("--grpc-cert / --grpc-key: %w", err)
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
			cert, err := tls.LoadX509KeyPair(c.cert, c.key)
			return &cert, err
		}}
	if c.ca != "" {
		pem, err := os.ReadFile(c.ca)
		if err != nil {
			return nil, fmt.Errorf("--grpc-ca: %w", err)
		}
		conf.ClientCAs = x509.NewCertPool()
		if !conf.ClientCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--grpc-ca: no PEM certificate in %s", c.ca)
		}
		conf.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return conf, nil
}

// envoyServers builds the gRPC server and the check listener the flags ask for,
// deciding with mw (ext_authz, the check) and its limiter (the rate limit service).
// The gRPC address is taken here, so that a taken port fails the start.
func (g *gateway) envoyServers(mw *ingress.Middleware, deferrer *deferral.Deferrer, reg *prometheus.Registry) error {
	c := g.cfg.envoy
	if c.checkListen != "" {
		mux := http.NewServeMux()
		mux.Handle(ingress.CheckPath, mw.CheckHandler())
		if deferrer != nil {
			mux.Handle("GET "+deferral.Path+"{ticket}", deferrer.StatusHandler())
			mux.Handle("DELETE "+deferral.Path+"{ticket}", deferrer.CancelHandler())
		}
		g.check = newHTTPServer(c.checkListen, mux, g.log)
	}
	if c.grpcListen == "" {
		return nil
	}
	conf, err := c.tls()
	if err != nil {
		return err
	}
	maxMsg := int(c.maxMessage)
	rls, err := envoy.NewRateLimitService(g.watcher, g.limiter, envoy.WithShadow(g.cfg.front.shadow),
		envoy.WithResponseHeaders(c.headers), envoy.WithDynamicMetadata(c.dynMeta), envoy.WithRegisterer(reg), envoy.WithLogger(g.log))
	if err != nil {
		return err
	}
	opts := []envoy.ServerOption{envoy.WithMaxMessageBytes(maxMsg)}
	if conf != nil {
		opts = append(opts, envoy.WithTLS(conf))
	}
	ln, err := net.Listen("tcp", c.grpcListen)
	if err != nil {
		return &unusableError{listenError("grpc-listen", c.grpcListen, err)}
	}
	g.grpc, g.grpcLn = envoy.NewServer(rls, envoy.NewAuthService(mw), opts...), ln
	return nil
}

var rlsMode = gatewayMode{name: "rls", help: rlsHelp, rls: true, admin: "127.0.0.1:9090", started: "serving"}

const rlsHelp = `Usage: sluice rls --rules FILE_OR_DIR[,…] [--grpc-listen ADDR] [--redis URL] [flags]

Runs the services that Envoy (and Istio, Envoy Gateway, Contour, Gloo) calls instead of
sending traffic through sluice: envoy.service.ratelimit.v3 RateLimitService and
envoy.service.auth.v3 Authorization on --grpc-listen (with the gRPC health service and
reflection), and the HTTP check of nginx auth_request and Traefik ForwardAuth on
--check-listen. No front door and no queues: defer rules answer 429 here (sluice serve
or ingress with --grpc-listen park them). Limits are in memory unless --redis is given;
replicas and front doors sharing that Redis share the counters.
`
