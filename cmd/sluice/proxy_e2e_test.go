package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// TestHostileUpstreamThroughTheBinary: behind `sluice serve`, an upstream that answers
// every request twice (a second response right after the first, as a broken handler
// or an echo of a client's bytes would) never has one client receive another's
// answer; and one that sends a 256 MiB response head gets each client a 502 problem
// while the process's peak memory stays within 64 MiB of what it was, once and four
// at once (--max-upstream-header at its default, 1 MiB).
func TestHostileUpstreamThroughTheBinary(t *testing.T) {
	t.Parallel()
	bin, err := plainBinary()
	if err != nil {
		t.Fatal(err)
	}
	const huge = 256 << 20
	u := rawup.Start(t, func(c *rawup.Conn, req *http.Request, _ int64) bool {
		if req.URL.Path == "/huge" {
			if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Huge: "); err != nil {
				return false
			}
			line := strings.Repeat("a", 64<<10)
			for sent := 0; sent < huge; sent += len(line) {
				if _, err := io.WriteString(c, line); err != nil {
					return false // the proxy gave up on the head, as it should
				}
			}
			_, _ = io.WriteString(c, "\r\nContent-Length: 0\r\n\r\n")
			return false
		}
		id := strings.TrimPrefix(req.URL.Path, "/id/")
		answer := "HTTP/1.1 200 OK\r\nContent-Length: " + strconv.Itoa(len(id)) + "\r\n\r\n" + id
		_, err := io.WriteString(c, answer+answer)
		return err == nil
	})
	p := startBinary(t, bin, "serve", "--rules", writeRules(t, t.TempDir(), e2eRules(100)), "--upstream", u.String(), "--log-level", "info")
	client := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	t.Cleanup(client.CloseIdleConnections)

	for i := range 20 {
		id := fmt.Sprintf("client-%02d", i)
		resp, err := client.Get(p.url + "/id/" + id)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != id {
			t.Errorf("request %s got %d %q, want its own answer", id, resp.StatusCode, body)
		}
	}

	before := peakRSS(t, p.cmd.Process.Pid)
	hugeHeads := func(n int) {
		t.Helper()
		var wg sync.WaitGroup
		for range n {
			wg.Go(func() {
				resp, err := client.Get(p.url + "/huge")
				if err != nil {
					t.Errorf("a 256 MiB head: %v", err)
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusBadGateway || resp.Header.Get("Content-Type") != "application/problem+json" ||
					!strings.Contains(string(body), "larger than 1048576 bytes") || resp.Header.Get("X-Huge") != "" {
					t.Errorf("a 256 MiB head: %d %s %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
				}
			})
		}
		wg.Wait()
	}
	hugeHeads(1)
	once := peakRSS(t, p.cmd.Process.Pid)
	hugeHeads(4)
	four := peakRSS(t, p.cmd.Process.Pid)
	t.Logf("VmHWM of sluice serve: %.1f MiB before, %.1f MiB after one 256 MiB upstream head, %.1f MiB after four at once",
		float64(before)/(1<<20), float64(once)/(1<<20), float64(four)/(1<<20))
	if four-before > 64<<20 {
		t.Errorf("peak memory grew by %.1f MiB, want under 64 MiB", float64(four-before)/(1<<20))
	}
}
