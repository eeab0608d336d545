package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// TestOpenLoopSendsEverySlot: every slot of the schedule is sent and answered, one
// latency per answer, in order.
func TestOpenLoopSendsEverySlot(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	defer srv.Close()
	res, err := openLoop(context.Background(), srv.URL+"/", 400, 4, 250*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 100 || res.Failed != 0 || len(res.Latencies) != 100 {
		t.Fatalf("sent %d, failed %d, %d latencies; want 100, 0, 100", res.Sent, res.Failed, len(res.Latencies))
	}
	for i := 1; i < len(res.Latencies); i++ {
		if res.Latencies[i] < res.Latencies[i-1] || res.Latencies[0] <= 0 {
			t.Fatalf("latencies not sorted or not positive: %v", res.Latencies)
		}
	}
	if q := res.quantile(0.5); q != res.Latencies[50] {
		t.Errorf("p50 %v, want %v", q, res.Latencies[50])
	}
}

// TestOpenLoopCountsFailures: answers other than 2xx are failures, not latencies.
func TestOpenLoopCountsFailures(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	}))
	defer srv.Close()
	res, err := openLoop(context.Background(), srv.URL+"/", 200, 2, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if res.Sent != 20 || res.Failed != 20 || len(res.Latencies) != 0 {
		t.Fatalf("sent %d, failed %d, %d latencies; want 20, 20, 0", res.Sent, res.Failed, len(res.Latencies))
	}
}

func TestParseWrk(t *testing.T) {
	const report = `Running 3s test @ http://127.0.0.1:8080/
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.61ms    5.12ms  69.31ms   90.01%
    Req/Sec    10.97k     1.39k   14.71k    68.33%
  65504 requests in 3.01s, 7.44MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:  21762.13
Transfer/sec:      2.47MB
`
	r, err := parseWrk(report)
	if err != nil {
		t.Fatal(err)
	}
	if r.Requests != 65504 || r.Failed != 7 || int(r.PerSecond) != 21762 {
		t.Errorf("got %+v; want 65504 requests, 7 failed, 21762/s", r)
	}
	if _, err := parseWrk("wrk: unknown option\n"); err == nil {
		t.Error("a report without its total parsed")
	}
}

func TestClosedLoopGenerator(t *testing.T) {
	if _, gen, err := closedLoopGenerator("go", 3*time.Second); gen != genGo || err != nil {
		t.Errorf("go: %v, %v", gen, err)
	}
	if _, gen, err := closedLoopGenerator("auto", 1500*time.Millisecond); gen != genGo || err != nil {
		t.Errorf("auto with a duration wrk cannot take: %v, %v", gen, err)
	}
	if _, _, err := closedLoopGenerator("wrk", 1500*time.Millisecond); err == nil {
		t.Error("wrk with a duration of 1.5s accepted")
	}
	if _, _, err := closedLoopGenerator("ab", 3*time.Second); err == nil {
		t.Error("an unknown generator accepted")
	}
}
