package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/redistest"
)

func TestRLSTable(t *testing.T) {
	redistest.Require(t)
	// A generous Redis timeout: no decision is made without Redis, even on a loaded
	// machine, so the run must not report any (the calls under way at the end of a
	// measurement are not cancelled either).
	out, errOut, code := benchRun(t, "rls", "--duration", "100ms", "--warmup", "20ms", "--callers", "1,4", "--keys", "10", "--conns", "2", "--redis-timeout", "30s")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if h := strings.Fields(lines[0]); len(h) != 18 || h[0] != "STORE" || h[3] != "HEADERS" || h[4] != "DECISIONS/S" || h[6] != "P99" || h[12] != "CPU/DEC" || h[14] != "LOAD/DEC" || h[17] != "PEER" {
		t.Fatalf("header %q", lines[0])
	}
	rows := lines[1:]
	for _, want := range []struct {
		store, service string
		ratio          bool
	}{
		{"memory", "sluice", false},
		{"redis", "sluice", true},
		{"redis", "envoyproxy/ratelimit", false},
	} {
		for _, callers := range []string{"1", "4"} {
			for _, headers := range []string{"on", "off"} { // --headers both, the default
				var found []string
				for _, r := range rows {
					if f := strings.Fields(r); len(f) >= 7 && f[0] == want.store && f[1] == callers && f[2] == want.service && f[3] == headers {
						found = append(found, r)
					}
				}
				if len(found) != 1 {
					t.Errorf("%d rows for %s / %s callers / %s / headers %s in\n%s", len(found), want.store, callers, want.service, headers, out)
					continue
				}
				f := strings.Fields(found[0])
				if want.ratio != (len(f) >= 9 && strings.HasSuffix(f[7], "x") && strings.HasSuffix(f[8], "x")) {
					t.Errorf("row %q: ratios to the peer wanted: %v", found[0], want.ratio)
				}
			}
		}
	}
	if strings.Contains(errOut, "OVER_LIMIT") {
		t.Errorf("a service limited the benchmark's calls: %s", errOut)
	}
	if strings.Contains(errOut, "without Redis") {
		t.Errorf("decisions without Redis reported: %s", errOut)
	}
	if !strings.Contains(errOut, "[12/12]") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}

func TestRLSJSON(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "rls.svg")
	out, errOut, code := benchRun(t, "rls", "--duration", "50ms", "--warmup", "0s", "--callers", "2", "--keys", "5", "--redis=false", "--headers", "on", "--client", "grpc", "--json", "--svg", svg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Mode           string      `json:"mode"`
		EnvoyRatelimit string      `json:"envoyproxy_ratelimit"`
		Callers        []int       `json:"callers"`
		Keys           int         `json:"keys"`
		Redis          *bool       `json:"redis"`
		Headers        string      `json:"headers"`
		Results        []rlsResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "rls" || len(doc.Callers) != 1 || doc.Callers[0] != 2 || doc.Keys != 5 || doc.Redis == nil || *doc.Redis || doc.Headers != "on" {
		t.Errorf("parameters: %s", out)
	}
	readSVG(t, svg, len(doc.Results))
	if !strings.HasPrefix(doc.EnvoyRatelimit, "v") {
		t.Errorf("envoyproxy/ratelimit version %q", doc.EnvoyRatelimit)
	}
	if len(doc.Results) != 1 {
		t.Fatalf("%d results, want 1 (memory, 2 callers): %s", len(doc.Results), out)
	}
	r := doc.Results[0]
	if r.Store != "memory" || !r.Sluice || !r.Headers || r.Callers != 2 || r.Decisions <= 0 || r.DecisionsPerSec <= 0 ||
		r.P50Ns <= 0 || r.P99Ns < r.P50Ns || r.OverLimit != 0 || r.RatioVsPeer != 0 {
		t.Errorf("result %+v", r)
	}
}

// TestRLSProfileNoHeaders runs the memory service without response headers and with
// a CPU profile: the child writes the profile when the run ends it.
func TestRLSProfileNoHeaders(t *testing.T) {
	dir := t.TempDir()
	out, errOut, code := benchRun(t, "rls", "--duration", "100ms", "--warmup", "0s", "--callers", "2", "--keys", "5",
		"--redis=false", "--headers=off", "--cpuprofile", dir, "--json")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, `"decisions_per_second"`) {
		t.Errorf("no results: %s", out)
	}
	fi, err := os.Stat(filepath.Join(dir, "sluice-memory.pprof"))
	if err != nil || fi.Size() == 0 {
		t.Fatalf("no CPU profile of the service: %v", err)
	}
}

func TestRLSUsage(t *testing.T) {
	for _, args := range [][]string{
		{"rls", "--duration", "0s"},
		{"rls", "--callers", "1,x"},
		{"rls", "--callers", "0"},
		{"rls", "--keys", "0"},
		{"rls", "--client", "h3"},
		{"rls", "--headers", "true"},
		{"rls", "--envoy-env", "NOEQUALS"},
		{"rls", "extra"},
		{"rls-server"},
		{"rls-server", "--headers=maybe", "127.0.0.1:0", "rules.yaml"},
		{"rls-server", "127.0.0.1:0", "/nonexistent/rules.yaml"},
		{"envoy-ratelimit", "extra"},
	} {
		if _, _, code := benchRun(t, args...); code != exitUsage {
			t.Errorf("%q: exit %d, want %d", args, code, exitUsage)
		}
	}
}

func TestQuantile(t *testing.T) {
	s := make([]time.Duration, 100)
	for i := range s {
		s[i] = time.Duration(i + 1)
	}
	for q, want := range map[float64]time.Duration{0.5: 50, 0.99: 99, 1: 100, 0: 1} {
		if got := quantile(s, q); got != want {
			t.Errorf("quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if got := quantile([]time.Duration{7}, 0.99); got != 7 {
		t.Errorf("one sample: %v", got)
	}
}

func TestFallbacksIn(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		log  string
		want int64
	}{
		{"", 0},
		{"level=WARN msg=\"redis is down\"\n" + fallbacksLine + " 17\n", 17},
		{fallbacksLine + " 0\n", 0},
		{fallbacksLine + " x\n", 0},
	} {
		path := filepath.Join(dir, "sluice-redis.log")
		if err := os.WriteFile(path, []byte(tc.log), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := fallbacksIn(path); got != tc.want {
			t.Errorf("%q: %d, want %d", tc.log, got, tc.want)
		}
	}
	if got := fallbacksIn(filepath.Join(dir, "missing.log")); got != 0 {
		t.Errorf("missing log: %d", got)
	}
}

func TestChildCPU(t *testing.T) {
	if _, known := childCPU(os.Getpid()); !known {
		if runtime.GOOS == "linux" {
			t.Fatal("no CPU times from /proc on Linux")
		}
		t.Skip("no per-process CPU times on this platform")
	}
	// Burn CPU until getrusage sees 100ms: /proc must then tell about as much.
	start, _ := processCPU()
	for x := 0; ; x++ {
		if now, _ := processCPU(); now-start >= 100*time.Millisecond {
			break
		}
	}
	self, _ := processCPU()
	got, _ := childCPU(os.Getpid())
	if got < 100*time.Millisecond || got > self+clockTick {
		t.Errorf("childCPU(self) = %v, getrusage %v", got, self)
	}
	if _, known := childCPU(-1); known {
		t.Error("childCPU(-1) known")
	}
}
