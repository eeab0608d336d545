package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// kernelCounts are what perf stat counted for a set of processes: system calls
// entered and context switches.
type kernelCounts struct{ Syscalls, Switches int64 }

// perfEvents are the events startPerfStat counts, in the order of kernelCounts.
const perfEvents = "raw_syscalls:sys_enter,context-switches"

// startPerfStat counts the system calls and context switches of process pid and its
// children (nginx's workers) with perf stat until stop is called, which returns the
// counts. It fails when perf is not on PATH or cannot attach (a kernel without
// tracepoints, too little privilege: perf_event_paranoid).
func startPerfStat(ctx context.Context, dir string, pid int) (stop func() (kernelCounts, error), err error) {
	perf, err := exec.LookPath("perf")
	if err != nil {
		return nil, err
	}
	pids := []string{strconv.Itoa(pid)}
	children, _ := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	pids = append(pids, strings.Fields(string(children))...)
	out := filepath.Join(dir, "perf-stat.csv")
	cmd := exec.CommandContext(ctx, perf, "stat", "-x,", "-e", perfEvents, "-p", strings.Join(pids, ","), "-o", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// perf counts from when it has attached, which it does not tell: give it a
	// moment, and end it if it failed meanwhile. The targets idle around the load,
	// doing next to nothing, so a longer window adds little to the counts.
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		return nil, fmt.Errorf("perf stat: %w: %s", err, strings.TrimSpace(stderr.String()))
	case <-time.After(300 * time.Millisecond):
	}
	return func() (kernelCounts, error) {
		// perf writes its counts when SIGINT ends it (and exits as the signal
		// says): what it wrote is the verdict.
		_ = cmd.Process.Signal(syscall.SIGINT)
		werr := <-exited
		data, _ := os.ReadFile(out)
		c, err := parsePerfStat(string(data))
		if err != nil {
			return kernelCounts{}, fmt.Errorf("%w (perf: %w: %s)", err, werr, strings.TrimSpace(stderr.String()))
		}
		return c, nil
	}, nil
}

// parsePerfStat reads perf stat -x, output: a line per event, its count first and its
// name third ("<not counted>" or "<not supported>" for a count perf could not take).
func parsePerfStat(out string) (kernelCounts, error) {
	var c kernelCounts
	found := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 3 || strings.HasPrefix(line, "#") {
			continue
		}
		var dst *int64
		switch f[2] {
		case "raw_syscalls:sys_enter":
			dst = &c.Syscalls
		case "context-switches":
			dst = &c.Switches
		default:
			continue
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return kernelCounts{}, fmt.Errorf("perf stat: %s: %q is not a count", f[2], f[0])
		}
		*dst = n
		found++
	}
	if found != 2 {
		return kernelCounts{}, errors.New("perf stat: no counts for " + perfEvents + " in its output")
	}
	return c, nil
}
