package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/limiter/redistest"
)

var update = flag.Bool("update", false, "rewrite the golden files of simulate's tests")

// simulate runs `sluice simulate args...` in-process.
func simulate(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), append([]string{"simulate"}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

const smallTrace = "testdata/simulate/small.trace"

func TestSimulateGolden(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"token_bucket", []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "2/s"}},
		{"leaky_bucket", []string{"--algorithm", "leaky_bucket", "--bucket-size", "3", "--outflow-rate", "2/s"}},
		{"fixed_window", []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1s"}},
		{"sliding_window_log", []string{"--algorithm", "sliding_window_log", "--limit", "3", "--window", "1s"}},
		{"sliding_window_log_forgive", []string{"--algorithm", "sliding_window_log", "--limit", "3", "--window", "1s", "--forgive-rejected"}},
		{"sliding_window_counter", []string{"--algorithm", "sliding_window_counter", "--limit", "3", "--window", "1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := simulate(t, append(tc.args, "--trace", smallTrace)...)
			if code != exitOK || errOut != "" {
				t.Fatalf("exit %d, stderr %q", code, errOut)
			}
			golden := filepath.Join("testdata", "simulate", tc.name+".golden")
			if *update {
				if err := os.WriteFile(golden, []byte(out), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -run TestSimulateGolden -update to create it)", err)
			}
			if out != string(want) {
				t.Errorf("output differs from %s:\ngot:\n%s\nwant:\n%s", golden, out, want)
			}
		})
	}
}

// TestSimulateHandChecked pins a few decisions worked out by hand, so the golden files
// cannot silently absorb a wrong answer.
func TestSimulateHandChecked(t *testing.T) {
	trace := writeTrace(t, "0s\n0s\n0s\n250ms\n1s\n1.5s\n")
	out, _, code := simulate(t, "--algorithm", "token_bucket", "--bucket-size", "2", "--refill-rate", "2/s", "--trace", trace)
	// A bucket of 2 that gets a token back every 500ms: two at 0s, the third must wait
	// 500ms; at 250ms half a token is back, so 250ms more; by 1s the bucket is full
	// again (1.5 tokens back, capped at 2).
	want := `0s - allow remaining=1 retry_after=0s
0s - allow remaining=0 retry_after=0s
0s - deny remaining=0 retry_after=500ms
250ms - deny remaining=0 retry_after=250ms
1s - allow remaining=1 retry_after=0s
1.5s - allow remaining=1 retry_after=0s
allowed=4 denied=2
`
	if code != exitOK || out != want {
		t.Errorf("token bucket: exit %d, got:\n%s\nwant:\n%s", code, out, want)
	}

	out, _, _ = simulate(t, "--algorithm", "fixed_window", "--limit", "2", "--window", "1m", "--trace", trace)
	want = `0s - allow remaining=1 retry_after=0s
0s - allow remaining=0 retry_after=0s
0s - deny remaining=0 retry_after=1m0s
250ms - deny remaining=0 retry_after=59.75s
1s - deny remaining=0 retry_after=59s
1.5s - deny remaining=0 retry_after=58.5s
allowed=2 denied=4
`
	if out != want {
		t.Errorf("fixed window, got:\n%s\nwant:\n%s", out, want)
	}
}

func TestSimulateShippedTrace(t *testing.T) {
	// The documented command (go doc ./limiter, sluice simulate) must keep working on the shipped trace.
	out, errOut, code := simulate(t, "--algorithm", "token_bucket", "--bucket-size", "5", "--refill-rate", "2/s",
		"--trace", "../../deploy/traces/burst.trace")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if last := lines[len(lines)-1]; last != "allowed=29 denied=10" {
		t.Errorf("summary %q, want allowed=29 denied=10", last)
	}
	for _, l := range lines[:len(lines)-1] {
		if strings.HasPrefix(l, "0s ") || strings.Contains(l, " alice ") {
			if !strings.Contains(l, " allow ") {
				t.Errorf("the steady client was limited: %q", l)
			}
		}
	}
}

func writeTrace(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "t.trace")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSimulateErrors(t *testing.T) {
	tb := []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "2/s"}
	fw := []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1s"}
	good := "0s\n1s\n"
	for _, tc := range []struct {
		name  string
		args  []string
		trace string // written to a file passed as --trace unless args has one
		want  string // in the message on stderr
	}{
		{"no algorithm", []string{"--limit", "3", "--window", "1s"}, good, "--algorithm is required"},
		{"unknown algorithm", []string{"--algorithm", "gcra", "--limit", "3", "--window", "1s"}, good, `--algorithm: unknown algorithm "gcra"`},
		{"unknown flag", append([]string{"--burst", "3"}, tb...), good, "unknown flag --burst"},
		{"argument", append(append([]string{}, tb...), "trace.txt"), good, `unexpected argument "trace.txt"`},
		{"missing bucket size", []string{"--algorithm", "token_bucket", "--refill-rate", "2/s"}, good, "token_bucket needs --bucket-size"},
		{"missing refill rate", []string{"--algorithm", "token_bucket", "--bucket-size", "3"}, good, "token_bucket needs --refill-rate"},
		{"missing outflow rate", []string{"--algorithm", "leaky_bucket", "--bucket-size", "3"}, good, "leaky_bucket needs --outflow-rate"},
		{"outflow on token bucket", append(append([]string{}, tb...), "--outflow-rate", "2/s"), good, "--outflow-rate does not apply to token_bucket"},
		{"refill on leaky bucket", []string{"--algorithm", "leaky_bucket", "--bucket-size", "3", "--outflow-rate", "2/s", "--refill-rate", "2/s"}, good, "--refill-rate does not apply to leaky_bucket"},
		{"limit on token bucket", append(append([]string{}, tb...), "--limit", "3"), good, "--limit does not apply to token_bucket"},
		{"missing window", []string{"--algorithm", "fixed_window", "--limit", "3"}, good, "fixed_window needs --window"},
		{"missing limit", []string{"--algorithm", "sliding_window_counter", "--window", "1s"}, good, "sliding_window_counter needs --limit"},
		{"bucket on window", append(append([]string{}, fw...), "--bucket-size", "3"), good, "--bucket-size does not apply to fixed_window"},
		{"forgive on fixed window", append(append([]string{}, fw...), "--forgive-rejected"), good, "--forgive-rejected does not apply to fixed_window"},
		{"zero limit", []string{"--algorithm", "fixed_window", "--limit", "0", "--window", "1s"}, good, "--limit must be positive"},
		{"negative bucket", []string{"--algorithm", "token_bucket", "--bucket-size", "-1", "--refill-rate", "2/s"}, good, "--bucket-size must be positive"},
		{"zero window", []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "0s"}, good, "--window: duration must be positive"},
		{"sub-µs window", []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1500ns"}, good, "--window: duration 1.5µs is not a whole number of microseconds"},
		{"bad window", []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1x"}, good, `invalid value "1x" for --window`},
		{"rate without unit", []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "2"}, good, `--refill-rate: rate "2" must look like`},
		{"rate bad unit", []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "2/fortnight"}, good, `--refill-rate: rate "2/fortnight": unknown unit "fortnight"`},
		{"rate zero", []string{"--algorithm", "leaky_bucket", "--bucket-size", "3", "--outflow-rate", "0/s"}, good, `--outflow-rate: rate "0/s": the count must be a whole number of at least 1`},
		{"rate too large", []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "9999999999999999/s"}, good, "the rule is not valid"},
		{"malformed offset", tb, "0s\nsoon\n", "t.trace:2: offset \"soon\" is not a Go duration"},
		{"offset without unit", tb, "0s\n5\n", "t.trace:2: offset \"5\""},
		{"negative offset", tb, "-1s\n", "t.trace:1: offset \"-1s\" is negative"},
		{"sub-µs offset", tb, "1ns\n", "t.trace:1: offset \"1ns\" is finer than"},
		{"backwards", tb, "# header\n\n1s\n2s a\n1.5s\n", "t.trace:5: offset 1.5s goes back before 2s"},
		{"too many fields", tb, "0s a 1 extra\n", "t.trace:1: 4 fields, want OFFSET [KEY [N]]"},
		{"zero n", tb, "0s\n0s a 0\n", "t.trace:2: N \"0\" is not a positive whole number"},
		{"bad n", tb, "0s a two\n", "t.trace:1: N \"two\""},
		{"line too long", tb, "0s\n0s " + strings.Repeat("k", maxTraceLine) + "\n", "t.trace:2: line longer than"},
		{"missing trace", append(append([]string{}, tb...), "--trace", "/nonexistent/t.trace"), "", "--trace: open /nonexistent/t.trace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := tc.args
			if !strings.Contains(strings.Join(args, " "), "--trace") {
				args = append(append([]string{}, args...), "--trace", writeTrace(t, tc.trace))
			}
			out, errOut, code := simulate(t, args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d", code, exitUsage)
			}
			if out != "" {
				t.Errorf("stdout not empty:\n%s", out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q does not contain %q", errOut, tc.want)
			}
			if n := strings.Count(strings.TrimSpace(errOut), "\n"); n > 1 {
				t.Errorf("want one message, got %d lines:\n%s", n+1, errOut)
			}
		})
	}
}

func TestSimulateJSON(t *testing.T) {
	trace := writeTrace(t, "0s\n0s k 2\n250ms k 5\n")
	out, errOut, code := simulate(t, "--algorithm", "token_bucket", "--bucket-size", "2", "--refill-rate", "4/s", "--json", "--trace", trace)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	sc := bufio.NewScanner(strings.NewReader(out))
	var got []jsonOutcome
	var sum jsonSummary
	for sc.Scan() {
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(sc.Bytes(), &raw); err != nil {
			t.Fatalf("line %q is not a JSON object: %v", sc.Text(), err)
		}
		if _, ok := raw["summary"]; ok {
			if err := json.Unmarshal(sc.Bytes(), &sum); err != nil {
				t.Fatal(err)
			}
			continue
		}
		var o jsonOutcome
		if err := json.Unmarshal(sc.Bytes(), &o); err != nil {
			t.Fatal(err)
		}
		got = append(got, o)
	}
	want := []jsonOutcome{
		{Line: 1, Offset: "0s", Key: "-", N: 1, Decision: "allow", Allowed: true, Limit: 2, Remaining: 1, RetryAfter: "0s", ResetAfter: "250ms"},
		{Line: 2, Offset: "0s", Key: "k", N: 2, Decision: "allow", Allowed: true, Limit: 2, Remaining: 0, RetryAfter: "0s", ResetAfter: "500ms"},
		{Line: 3, Offset: "250ms", Key: "k", N: 5, Decision: "deny", Allowed: false, Limit: 2, Remaining: 1, RetryAfter: "never", ResetAfter: "250ms"},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d request objects, want %d:\n%s", len(got), len(want), out)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("object %d:\n got %+v\nwant %+v", i, got[i], want[i])
		}
	}
	if sum.Summary.Allowed != 2 || sum.Summary.Denied != 1 {
		t.Errorf("summary %+v, want allowed 2 denied 1", sum.Summary)
	}
	if !strings.HasSuffix(out, `{"summary":{"allowed":2,"denied":1}}`+"\n") {
		t.Errorf("the summary is not the last line:\n%s", out)
	}
}

func TestSimulateEnv(t *testing.T) {
	trace := writeTrace(t, "0s\n0s\n0s\n")
	t.Setenv("SLUICE_ALGORITHM", "fixed_window")
	t.Setenv("SLUICE_LIMIT", "2")
	t.Setenv("SLUICE_WINDOW", "1s")
	t.Setenv("SLUICE_TRACE", trace)
	out, errOut, code := simulate(t)
	if code != exitOK || !strings.HasSuffix(out, "allowed=2 denied=1\n") {
		t.Fatalf("from the environment: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	// A flag wins over its variable.
	out, _, _ = simulate(t, "--limit", "3")
	if !strings.HasSuffix(out, "allowed=3 denied=0\n") {
		t.Errorf("--limit 3 over SLUICE_LIMIT=2: %q", out)
	}

	// A bad value names the variable; a contradiction from the environment says so.
	t.Setenv("SLUICE_LIMIT", "many")
	if out, errOut, code := simulate(t); code != exitUsage || out != "" || !strings.Contains(errOut, "SLUICE_LIMIT (for --limit)") {
		t.Errorf("SLUICE_LIMIT=many: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	t.Setenv("SLUICE_LIMIT", "2")
	t.Setenv("SLUICE_BUCKET_SIZE", "5")
	if _, errOut, code := simulate(t); code != exitUsage || !strings.Contains(errOut, "--bucket-size (from SLUICE_BUCKET_SIZE) does not apply") {
		t.Errorf("SLUICE_BUCKET_SIZE with fixed_window: exit %d, stderr %q", code, errOut)
	}
}

func TestSimulateStdin(t *testing.T) {
	f, err := os.Open(smallTrace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	old := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = old }()
	fromStdin, _, code := simulate(t, "--algorithm", "fixed_window", "--limit", "3", "--window", "1s")
	fromFile, _, _ := simulate(t, "--algorithm", "fixed_window", "--limit", "3", "--window", "1s", "--trace", smallTrace)
	if code != exitOK || fromStdin != fromFile {
		t.Errorf("stdin gave exit %d and\n%s\nthe file gave\n%s", code, fromStdin, fromFile)
	}
}

// TestSimulateRedis replays the golden traces on a real Redis: the Redis store must
// reach the memory store's decisions, and the run must leave no key behind.
func TestSimulateRedis(t *testing.T) {
	srv := redistest.Start(t)
	url := "redis://" + srv.Addr() + "/0"
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"token_bucket", []string{"--algorithm", "token_bucket", "--bucket-size", "3", "--refill-rate", "2/s"}},
		{"leaky_bucket", []string{"--algorithm", "leaky_bucket", "--bucket-size", "3", "--outflow-rate", "2/s"}},
		{"fixed_window", []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1s"}},
		{"sliding_window_log", []string{"--algorithm", "sliding_window_log", "--limit", "3", "--window", "1s"}},
		{"sliding_window_log_forgive", []string{"--algorithm", "sliding_window_log", "--limit", "3", "--window", "1s", "--forgive-rejected"}},
		{"sliding_window_counter", []string{"--algorithm", "sliding_window_counter", "--limit", "3", "--window", "1s"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want, err := os.ReadFile(filepath.Join("testdata", "simulate", tc.name+".golden"))
			if err != nil {
				t.Fatal(err)
			}
			out, errOut, code := simulate(t, append(tc.args, "--trace", smallTrace, "--redis", url)...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, errOut)
			}
			if out != string(want) {
				t.Errorf("Redis differs from the memory store:\ngot:\n%s\nwant:\n%s", out, want)
			}
		})
	}
	if keys, err := srv.Client().Keys(context.Background(), "*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("keys left in Redis: %q, %v", keys, err)
	}

	// The same trace twice at once on one Redis: unique prefixes keep the runs apart.
	args := []string{"--algorithm", "fixed_window", "--limit", "3", "--window", "1s", "--trace", smallTrace, "--redis", url}
	outs := make(chan string, 2)
	for range 2 {
		go func() { out, _, _ := simulate(t, args...); outs <- out }()
	}
	if a, b := <-outs, <-outs; a != b {
		t.Errorf("concurrent runs disagree:\n%s\n%s", a, b)
	}
}

func TestSimulateRedisUnreachable(t *testing.T) {
	// A port nothing listens on: the run fails with status 1 and prints no table.
	trace := writeTrace(t, "0s\n")
	out, errOut, code := simulate(t, "--algorithm", "fixed_window", "--limit", "3", "--window", "1s",
		"--trace", trace, "--redis", "redis://127.0.0.1:1/0")
	if code != exitFailure || out != "" || !strings.Contains(errOut, "--redis: connecting to 127.0.0.1:1") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	out, errOut, code = simulate(t, "--algorithm", "fixed_window", "--limit", "3", "--window", "1s",
		"--trace", trace, "--redis", "http://x")
	if code != exitFailure || out != "" || !strings.Contains(errOut, "--redis: parsing the URL") {
		t.Errorf("bad URL: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
}

// TestSimulateHelpNamesEveryAlgorithm: the rule flags table of the help has a line
// for each of limiter.Algorithms.
func TestSimulateHelpNamesEveryAlgorithm(t *testing.T) {
	for _, a := range limiter.AlgorithmNames() {
		if !strings.Contains(simulateHelp, "\n  "+a+" ") {
			t.Errorf("sluice simulate's help has no line for %s", a)
		}
	}
}
