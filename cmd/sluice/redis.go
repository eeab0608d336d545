package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redisstore"
)

// redisConfig says where the limits live when they are shared: the Redis URL, and
// its credentials and TLS material.
type redisConfig struct {
	url      string
	password string
	ca       string
	cert     string
	key      string
	timeout  time.Duration
}

func (c *redisConfig) flags(fs *pflag.FlagSet) {
	fs.StringVar(&c.url, "redis", "", "keep limits in the Redis at this `URL` (redis://[user[:password]@]host:port/db, rediss:// for TLS; redis://host:port?addr=host2:port2 for a cluster)")
	fs.StringVar(&c.password, "redis-password", "", "Redis `password`, instead of one in the --redis URL (best from SLUICE_REDIS_PASSWORD or the config file, not the command line)")
	fs.StringVar(&c.ca, "redis-ca", "", "`file` of CA certificates that the Redis servers' TLS certificates are checked against, instead of the system's (rediss:// URLs)")
	fs.StringVar(&c.cert, "redis-cert", "", "client certificate `file` for Redis TLS (with --redis-key; rediss:// URLs)")
	fs.StringVar(&c.key, "redis-key", "", "client key `file` for Redis TLS")
	fs.DurationVar(&c.timeout, "redis-timeout", 50*time.Millisecond, "how long a decision waits for Redis before it follows the limit's failure_mode")
}

// redisHealth is the Redis check of /sluice/v1/status: whether Redis answers, whether
// the limiter still decides without it, and the failure modes of the rules' limits,
// which decide meanwhile.
func (g *gateway) redisHealth(ctx context.Context) ingress.DependencyReport {
	modes := map[limiter.FailureMode]int{}
	if set := g.watcher.Set(); set != nil {
		for _, r := range set.Rules() {
			for _, l := range r.Limits {
				modes[cmp.Or(l.FailureMode, limiter.FailLocal)]++
			}
		}
	}
	detail := map[string]any{"limiter_fallback": g.store.Down(), "fallback_decisions": g.store.Fallbacks(), "failure_modes": modes}
	if err := g.store.Ping(ctx); err != nil {
		return ingress.DependencyReport{State: ingress.DependencyDown, Err: err, Detail: detail}
	}
	if g.store.Down() {
		return ingress.DependencyReport{State: ingress.DependencyDegraded, Detail: detail,
			Err: errors.New("redis answers; the limiter decides without it until its next probe")}
	}
	return ingress.DependencyReport{State: ingress.DependencyUp, Detail: detail}
}

// openRedis returns a client of the Redis (or Redis Cluster, with addr= parameters)
// that c describes, or nil without --redis. It only checks the configuration: the
// client connects when first used. Every error names the flag at fault.
func openRedis(c redisConfig, log *slog.Logger) (redis.UniversalClient, error) {
	if c.url == "" {
		for _, f := range []struct{ name, value string }{{"redis-password", c.password}, {"redis-ca", c.ca}, {"redis-cert", c.cert}, {"redis-key", c.key}} {
			if f.value != "" {
				log.Warn("--" + f.name + " has no effect without --redis: limits are kept in memory")
			}
		}
		return nil, nil
	}
	u, err := url.Parse(c.url)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	tlsConf, err := loadTLS("redis", c.ca, c.cert, c.key)
	if err != nil {
		return nil, err
	}
	// configure completes what the URL gave: the password of --redis-password, the
	// CA and client certificate of the TLS that rediss:// turned on.
	configure := func(password *string, t **tls.Config) error {
		if c.password != "" {
			if *password != "" {
				return errors.New("--redis-password: the --redis URL has a password too; give it in one place")
			}
			*password = c.password
		}
		if tlsConf != nil {
			if *t == nil {
				return fmt.Errorf("--redis-ca, --redis-cert and --redis-key need a rediss:// URL; --redis is %s://", u.Scheme)
			}
			(*t).RootCAs = tlsConf.RootCAs
			(*t).GetClientCertificate = tlsConf.GetClientCertificate
		}
		return nil
	}
	if u.Query().Has("addr") {
		opts, err := redis.ParseClusterURL(c.url)
		if err != nil {
			return nil, fmt.Errorf("--redis: %w", err)
		}
		if err := configure(&opts.Password, &opts.TLSConfig); err != nil {
			return nil, err
		}
		// Calls end at their context's deadline, not after the read timeout and its
		// retries: a hung Redis must not hold a check or a decision past its bound.
		opts.ContextTimeoutEnabled = true
		return redis.NewClusterClient(opts), nil
	}
	opts, err := redis.ParseURL(c.url)
	if err != nil {
		return nil, fmt.Errorf("--redis: %w", err)
	}
	if err := configure(&opts.Password, &opts.TLSConfig); err != nil {
		return nil, err
	}
	opts.ContextTimeoutEnabled = true
	return redis.NewClient(opts), nil
}

// loadTLS checks the TLS files of the flags --PREFIX-ca, --PREFIX-cert and
// --PREFIX-key, and returns a configuration with their CA pool and a client
// certificate that is read again for every new connection (so that a renewed
// certificate is used without a restart); nil when none is given.
func loadTLS(prefix, ca, cert, key string) (*tls.Config, error) {
	if ca == "" && cert == "" && key == "" {
		return nil, nil
	}
	conf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("--%s-ca: %w", prefix, err)
		}
		conf.RootCAs = x509.NewCertPool()
		if !conf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%s-ca: no PEM certificate in %s", prefix, ca)
		}
	}
	switch {
	case cert != "" && key == "":
		return nil, fmt.Errorf("--%s-cert needs --%s-key", prefix, prefix)
	case key != "" && cert == "":
		return nil, fmt.Errorf("--%s-key needs --%s-cert", prefix, prefix)
	case cert != "":
		if _, err := tls.LoadX509KeyPair(cert, key); err != nil {
			return nil, fmt.Errorf("--%s-cert / --%s-key: %w", prefix, prefix, err)
		}
		conf.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(cert, key)
			return &c, err
		}
	}
	return conf, nil
}

// redisLimiter returns the limiter in Redis (--redis), made at the first call, which
// adds the Redis dependency: the front door's limits and the dispatchers' flow keys
// share it.
func (g *gateway) redisLimiter(reg *prometheus.Registry) (*redisstore.Store, error) {
	if g.store != nil {
		return g.store, nil
	}
	store, err := redisstore.New(g.redis, redisstore.WithRegisterer(reg), redisstore.WithLogger(g.log),
		redisstore.WithTimeout(g.cfg.front.redis.timeout))
	if err != nil {
		return nil, fmt.Errorf("redis limiter (--redis-timeout and the metrics registry): %w", err)
	}
	g.store = store
	g.deps.Add("redis", g.redisHealth)
	return store, nil
}
