package redisstore_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/limiter/redistest"
)

// TestMain owns the Redis servers the tests share (started on first use) and checks
// that no goroutine outlives the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	shared.stop()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// shared holds one standalone Redis and one 3-master Cluster for the whole test
// binary. Tests that share them isolate themselves with a unique key prefix
// (uniquePrefix), never with FLUSHALL. Tests that stop or restart a server start
// their own with redistest.Start.
var shared sharedRedis

type sharedRedis struct {
	standaloneOnce sync.Once
	standalone     *redistest.Server
	standaloneErr  error

	clusterOnce sync.Once
	cluster     *redistest.Cluster
	clusterErr  error

	prefixes atomic.Int64
}

// server returns the shared standalone server, or nil when Redis is not installed
// (t fails instead under CI).
func (s *sharedRedis) server(t testing.TB) *redistest.Server {
	t.Helper()
	s.standaloneOnce.Do(func() { s.standalone, s.standaloneErr = redistest.New() })
	if !s.usable(t, s.standaloneErr) {
		return nil
	}
	return s.standalone
}

// clusterOf returns the shared 3-master cluster, or nil when Redis is not installed.
func (s *sharedRedis) clusterOf(t testing.TB) *redistest.Cluster {
	t.Helper()
	s.clusterOnce.Do(func() { s.cluster, s.clusterErr = redistest.NewCluster(3) })
	if !s.usable(t, s.clusterErr) {
		return nil
	}
	return s.cluster
}

func (s *sharedRedis) usable(t testing.TB, err error) bool {
	t.Helper()
	switch {
	case err == nil:
		return true
	case errors.Is(err, redistest.ErrNotInstalled) && os.Getenv("CI") == "":
		t.Logf("Redis stores not tested: %v", err)
		return false
	default:
		t.Fatalf("starting Redis: %v", err)
		return false
	}
}

// uniquePrefix returns a key prefix no other store of this test binary uses.
func (s *sharedRedis) uniquePrefix() string {
	return "t" + strconv.FormatInt(s.prefixes.Add(1), 10) + ":"
}

func (s *sharedRedis) stop() {
	if s.standalone != nil {
		s.standalone.Close()
	}
	if s.cluster != nil {
		s.cluster.Close()
	}
}
