package main

import (
	"context"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"time"
)

// closedLoopResult is what one closed-loop measurement counted.
type closedLoopResult struct {
	Requests  int64   // answered, whatever the status
	PerSecond float64 // Requests over the measured time
	Failed    int64   // answered with a status other than 2xx or 3xx, or lost to a socket error
}

// wrkClosedLoop runs wrk (a C load generator, at path) against u with conns
// connections on `threads` threads for d, which wrk wants in whole seconds.
func wrkClosedLoop(ctx context.Context, path, u string, threads, conns int, d time.Duration) (closedLoopResult, error) {
	cmd := exec.CommandContext(ctx, path, "-t", strconv.Itoa(threads), "-c", strconv.Itoa(conns),
		"-d", strconv.Itoa(int(d/time.Second))+"s", "--timeout", "10s", u)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return closedLoopResult{}, fmt.Errorf("wrk: %w\n%s", err, out)
	}
	return parseWrk(string(out))
}

var (
	wrkTotal     = regexp.MustCompile(`(?m)^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m)\b`)
	wrkNon2xx    = regexp.MustCompile(`(?m)^\s*Non-2xx or 3xx responses: (\d+)`)
	wrkSocketErr = regexp.MustCompile(`(?m)^\s*Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// parseWrk reads wrk's report: the requests answered and the time they took, the
// answers with a status other than 2xx and 3xx, and the socket errors.
func parseWrk(out string) (closedLoopResult, error) {
	m := wrkTotal.FindStringSubmatch(out)
	if m == nil {
		return closedLoopResult{}, fmt.Errorf("wrk: no %q line in its report:\n%s", "N requests in T", out)
	}
	var r closedLoopResult
	r.Requests, _ = strconv.ParseInt(m[1], 10, 64)
	secs, _ := strconv.ParseFloat(m[2], 64)
	secs *= map[string]float64{"us": 1e-6, "ms": 1e-3, "s": 1, "m": 60}[m[3]]
	if secs > 0 {
		r.PerSecond = float64(r.Requests) / secs
	}
	if m := wrkNon2xx.FindStringSubmatch(out); m != nil {
		n, _ := strconv.ParseInt(m[1], 10, 64)
		r.Failed += n
	}
	if m := wrkSocketErr.FindStringSubmatch(out); m != nil {
		for _, f := range m[1:] {
			n, _ := strconv.ParseInt(f, 10, 64)
			r.Failed += n
		}
	}
	return r, nil
}
