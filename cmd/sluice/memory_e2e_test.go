package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// plainBinary is a build of sluice without the race detector, whose memory is what a
// production process uses: the race detector multiplies it.
var plainBinary = sync.OnceValues(func() (string, error) {
	if !raceEnabled {
		return sluiceBinary, nil
	}
	dir, err := os.MkdirTemp("", "sluice-plain-")
	if err != nil {
		return "", err
	}
	return buildSluiceRace(dir, false)
})

// peakRSS is the process's peak resident set size (VmHWM), in bytes.
func peakRSS(t *testing.T, pid int) int64 { return procStatusBytes(t, pid, "VmHWM") }

// vmRSS is the process's resident set size now (VmRSS), in bytes.
func vmRSS(t *testing.T, pid int) int64 { return procStatusBytes(t, pid, "VmRSS") }

// procStatusBytes reads a size field (in kB) of /proc/PID/status, in bytes.
func procStatusBytes(t *testing.T, pid int, field string) int64 {
	t.Helper()
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		if runtime.GOOS == "linux" { // where CI runs: the measurement must happen
			t.Fatal(err)
		}
		t.Skipf("no /proc: %v", err)
	}
	for line := range strings.Lines(string(status)) {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("%s %q: %v", field, v, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// unsized hides a body's length, so that the client sends it chunked.
type unsized struct{ io.Reader }

// TestDeferredBodiesBoundedMemory sends bursts of 60 concurrent large bodies to a
// defer route, as an attacker would, and checks that each gets a clear answer and the
// process's peak memory stays far below what the bodies add up to (540 MiB a burst).
func TestDeferredBodiesBoundedMemory(t *testing.T) {
	t.Parallel()
	bin, err := plainBinary()
	if err != nil {
		t.Fatal(err)
	}
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 1/s}\nmax_in_flight: 1\nmax_body: 8MiB"))
	// --defer-memory and --max-body at their defaults: 64 MiB and 10 MiB.
	p := startBinary(t, bin, "serve", append([]string{"--rules", rulesPath, "--upstream", up.URL, "--log-level", "info"}, dispatchFlags...)...)
	warmUp(t, p.url, "/v1/orders")
	before := peakRSS(t, p.cmd.Process.Pid)

	const clients = 60
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxConnsPerHost: clients, DisableKeepAlives: true}}
	burst := func(name string, size int, chunked bool, allowed ...int) map[int]int {
		t.Helper()
		body := bytes.Repeat([]byte("x"), size)
		answers := make(chan string, clients)
		var wg sync.WaitGroup
		for i := range clients {
			wg.Go(func() {
				var r io.Reader = bytes.NewReader(body)
				if chunked {
					r = unsized{r}
				}
				req, _ := http.NewRequest("POST", p.url+"/v1/orders", r)
				req.Header.Set("Content-Type", "application/octet-stream")
				req.Header.Set("X-Order", fmt.Sprintf("%s-%d", name, i))
				resp, err := client.Do(req)
				if err != nil {
					answers <- "error: " + err.Error()
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "" {
					answers <- "503 without Retry-After"
					return
				}
				answers <- strconv.Itoa(resp.StatusCode)
			})
		}
		wg.Wait()
		close(answers)
		count := map[int]int{}
		for a := range answers {
			code, err := strconv.Atoi(a)
			if err != nil || !slices.Contains(allowed, code) {
				t.Errorf("%s: answer %q, want one of %v", name, a, allowed)
				continue
			}
			count[code]++
		}
		t.Logf("%s: %v; peak RSS so far %d MB", name, count, peakRSS(t, p.cmd.Process.Pid)/1e6)
		return count
	}
	// Over the queue's 8 MiB: refused before being read (Content-Length) or as soon as
	// the limit is passed (chunked); or 503 when other bodies hold the memory budget.
	burst("9MiB", 9<<20, false, http.StatusRequestEntityTooLarge)
	burst("9MiB-chunked", 9<<20, true, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable)
	// Under the limit: stored, or 503 while the budget is spent. Some get through.
	if got := burst("7MiB", 7<<20, false, http.StatusAccepted, http.StatusServiceUnavailable); got[http.StatusAccepted] == 0 {
		t.Errorf("no 7 MiB body was accepted")
	}
	peak := peakRSS(t, p.cmd.Process.Pid)
	t.Logf("peak RSS: %d MB before the bursts, %d MB after (3 bursts of 60 bodies of 7-9 MiB, --defer-memory 64MiB)", before/1e6, peak/1e6)
	// Measured 240-250 MB (225-239 MiB), also with both CPUs busy; 1.03 GB before the
	// bodies were bounded.
	const bound = 300e6
	if peak > bound {
		t.Errorf("peak RSS %d MB, want under %d MB", peak/1e6, int64(bound/1e6))
	}
	if _, r := getStatus(t, p.url, "aaaaaaaaaaaaaaaaaaaaaaaaaa"); r.status != http.StatusNotFound {
		t.Errorf("the front door after the bursts: %d %s", r.status, r.body)
	}
}

func TestSizeFlag(t *testing.T) {
	// 0 is taken: --idempotency-max-bytes 0 is "no cap", --max-body 0 "no limit";
	// --defer-memory refuses it itself (TestSizeFlags).
	for in, want := range map[string]string{"67108864": "64MiB", "64MiB": "64MiB", "1GB": "1000000000", "1536KiB": "1536KiB", "1000": "1000", "0": "0"} {
		var s sizeFlag
		if err := s.Set(in); err != nil || s.String() != want {
			t.Errorf("Set(%q): %q, %v; want %q", in, s.String(), err, want)
		}
	}
	for _, in := range []string{"", "-1", "64 parsecs", "1e9"} {
		var s sizeFlag
		if err := s.Set(in); err == nil {
			t.Errorf("Set(%q) accepted: %v", in, s.String())
		}
	}
	// The flag, the environment and a config file all take sizes with units.
	got := printedConfig(t, "serve", "--rules", "x.yaml", "--upstream", "http://u", "--defer-memory", "16MiB")
	if got["defer-memory"].value != "16MiB" {
		t.Errorf("--print-config shows defer-memory %+v", got["defer-memory"])
	}
}
