package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/limiter/redistest"
)

// The tests check the shape of the output only: timings on a shared CI machine mean
// nothing, so no figure is asserted.

func benchRun(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return out.String(), errb.String(), code
}

func TestLimiterTable(t *testing.T) {
	out, errOut, code := benchRun(t, "limiter", "--duration", "20ms", "--warmup", "5ms", "--keys", "1000", "--redis", "")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	if !strings.HasPrefix(lines[0], "SCENARIO") || !strings.Contains(lines[0], "DECISIONS/S") || !strings.Contains(lines[0], "VS PEER") {
		t.Errorf("header %q", lines[0])
	}
	rows := lines[1:]
	for _, want := range []struct{ scenario, store string }{
		{"memory, 1 key", "sluice memory"},
		{"memory, 1 key", "x/time/rate"},
		{"memory, 1,000 keys", "sluice memory"},
		{"memory, 1,000 keys", "x/time/rate mutex map"},
	} {
		found := 0
		for _, r := range rows {
			if strings.HasPrefix(r, want.scenario+" ") && strings.Contains(r, " "+want.store+" ") {
				found++
				if want.store == "sluice memory" && !strings.HasSuffix(r, "x") {
					t.Errorf("sluice row without a ratio: %q", r)
				}
			}
		}
		// One row with 1 caller, one with GOMAXPROCS callers when that is more.
		if found < 1 || found > 2 {
			t.Errorf("%d rows for %s / %s in\n%s", found, want.scenario, want.store, out)
		}
	}
	if strings.Contains(out, "redis") {
		t.Errorf("--redis '' still ran Redis scenarios:\n%s", out)
	}
	for _, goal := range []string{"GOAL memory, 1 key, ", "GOAL memory, 1,000 keys, 1 caller: >= 3x the peer: wall "} {
		if !strings.Contains(out, goal) {
			t.Errorf("no line %q in\n%s", goal, out)
		}
	}
	if !strings.Contains(errOut, "[1/") {
		t.Errorf("no progress on stderr: %q", errOut)
	}
}

func TestLimiterJSON(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "limiter.svg")
	out, errOut, code := benchRun(t, "limiter", "--duration", "10ms", "--warmup", "0s", "--keys", "100", "--redis", "", "--rounds", "3", "--json", "--svg", svg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Mode       string   `json:"mode"`
		GOMAXPROCS int      `json:"gomaxprocs"`
		Duration   string   `json:"duration"`
		Rounds     int      `json:"rounds"`
		Keys       int      `json:"keys"`
		Redis      *bool    `json:"redis"`
		Results    []result `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "limiter" || doc.GOMAXPROCS < 1 || doc.Duration != "10ms" || doc.Rounds != 3 || doc.Keys != 100 || doc.Redis == nil || *doc.Redis {
		t.Errorf("parameters: %+v", doc)
	}
	if len(doc.Results) == 0 || len(doc.Results)%2 != 0 {
		t.Fatalf("%d results, want pairs", len(doc.Results))
	}
	readSVG(t, svg, len(doc.Results))
	for i, r := range doc.Results {
		if r.Decisions <= 0 || r.DecisionsPerSec <= 0 || r.Callers < 1 {
			t.Errorf("result %d: %+v", i, r)
		}
		if r.Sluice != (i%2 == 0) || (r.Sluice && r.RatioVsPeer <= 0) {
			t.Errorf("result %d: sluice %v, ratio %v", i, r.Sluice, r.RatioVsPeer)
		}
		// The reported round is the median of three.
		if r.Sluice && !(r.RatioMin <= r.RatioVsPeer && r.RatioVsPeer <= r.RatioMax) {
			t.Errorf("result %d: ratio %v outside its rounds' range %v-%v", i, r.RatioVsPeer, r.RatioMin, r.RatioMax)
		}
		if _, known := processCPU(); known && (r.CPUNsPerDecision <= 0 || (r.Sluice && r.CPURatioVsPeer <= 0)) {
			t.Errorf("result %d: CPU ns per decision %v, CPU ratio %v", i, r.CPUNsPerDecision, r.CPURatioVsPeer)
		}
	}
}

func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{nil, exitUsage},
		{[]string{"nope"}, exitUsage},
		{[]string{"help"}, exitOK},
		{[]string{"limiter", "-h"}, exitOK},
		{[]string{"limiter", "--duration", "0s"}, exitUsage},
		{[]string{"limiter", "--redis-callers", "1,x"}, exitUsage},
		{[]string{"limiter", "extra"}, exitUsage},
		{[]string{"limiter", "--rounds", "0"}, exitUsage},
	} {
		if _, _, code := benchRun(t, tc.args...); code != tc.code {
			t.Errorf("%q: exit %d, want %d", tc.args, code, tc.code)
		}
	}
}

func TestLatency(t *testing.T) {
	for ns, want := range map[float64]string{74.4: "74ns", 999: "999ns", 57658.6: "57.7µs", 564750: "565µs", 1234567: "1.23ms", 0: "0s"} {
		if got := latency(ns); got != want {
			t.Errorf("latency(%v) = %q, want %q", ns, got, want)
		}
	}
}

func TestLimiterRedis(t *testing.T) {
	srv := redistest.Start(t)
	out, errOut, code := benchRun(t, "limiter", "--duration", "20ms", "--warmup", "5ms", "--keys", "100",
		"--redis", "redis://"+srv.Addr()+"/0", "--redis-callers", "1,4", "--redis-keys", "10")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, want := range []string{"sluice redis", "redis_rate"} {
		if n := strings.Count(out, " "+want+" "); n != 2 {
			t.Errorf("%d rows of %s, want 2 (1 and 4 callers):\n%s", n, want, out)
		}
	}
	// The 1-caller goal ran; the 64-caller one did not.
	if !strings.Contains(out, "GOAL redis, 10 keys/caller, 1 caller: >= 1.1x the peer: wall ") || strings.Contains(out, "64 callers") {
		t.Errorf("the Redis goals in\n%s", out)
	}
	if keys, err := srv.Client().Keys(context.Background(), "*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("keys left in Redis: %d, %v", len(keys), err)
	}
}

// TestKeyPicker checks the memory scenarios' keys: shaped like the ingress's, drawn
// among n, and copied by the mutex map before its buffer is written again (a map that
// kept the buffer itself would hold keys that change under it, and grow past n).
func TestKeyPicker(t *testing.T) {
	const n = 1000
	p := newKeyPicker(n, 0)
	rm := &rateMap{m: make(map[string]*rate.Limiter)}
	for range 20 * n {
		k := p.next()
		if len(k) != len(keyPrefix)+keyDigits || !strings.HasPrefix(k, keyPrefix) {
			t.Fatalf("key %q: want %q and %d digits", k, keyPrefix, keyDigits)
		}
		rm.allow(k)
	}
	if len(rm.m) != n {
		t.Fatalf("%d keys in the map after 20 draws per key, want %d", len(rm.m), n)
	}
	for k := range rm.m {
		i, err := strconv.Atoi(k[len(keyPrefix):])
		if err != nil || i < 0 || i >= n {
			t.Fatalf("map key %q: not one of the %d keys", k, n)
		}
	}
	one := newKeyPicker(1, 3)
	if a, b := strings.Clone(one.next()), one.next(); a != b {
		t.Fatalf("one key gave %q, then %q", a, b)
	}
}
