package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluicehq/sluice/limiter/redistest"
)

// The shaping test's load: waitClients clients, each with its own account, send
// waitPerClient requests each at 4× the rule's rate of waitRate per second per
// account, alternating between two replicas.
const (
	waitRate      = 10
	waitMaxWait   = time.Second
	waitClients   = 8
	waitPerClient = 25
)

func waitE2ERules() string {
	return fmt.Sprintf(`
domain: shape
descriptors:
  - key: account
    rate_limit: {unit: second, requests_per_unit: %d}
    name: paced
    on_limit: wait
    max_wait: %s
    max_waiting: 1000
routes:
  - name: pay
    match: {method: [POST], path: /pay}
    descriptors:
      - [{key: account, from: "header:X-Account"}]
`, waitRate, waitMaxWait)
}

// waitArrival is one request as the upstream saw it.
type waitArrival struct {
	account string
	seq     int
	at      time.Time
}

// waitSent is one request as its client saw it.
type waitSent struct {
	account string
	seq     int
	sent    time.Time
	status  int
	waited  float64 // Sluice-Waited, s; -1 when absent
}

// Two sluice serve replicas on one real Redis shape one account's requests into one
// outflow: 200 requests at 4× the rate from 8 clients (each request to the replicas
// in turn) are each forwarded or rejected (then: reject) past max_wait; the upstream
// sees at most ceil(rate × Δt) + 1 of an account's requests in any window Δt (plus
// the arrival jitter of the cluster tests), in the order of their slots, and every
// Sluice-Waited is at most max_wait.
func TestWaitShapesAcrossReplicas(t *testing.T) {
	redistest.Require(t)
	redisServer := redistest.Start(t)
	var mu sync.Mutex
	var arrivals []waitArrival
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		at := time.Now()
		io.Copy(io.Discard, r.Body)
		seq, _ := strconv.Atoi(r.Header.Get("X-Seq"))
		mu.Lock()
		arrivals = append(arrivals, waitArrival{r.Header.Get("X-Account"), seq, at})
		mu.Unlock()
	}))
	t.Cleanup(up.Close)
	rulesPath := writeRules(t, t.TempDir(), waitE2ERules())
	redisURL := "redis://" + redisServer.Addr() + "/0"
	// The shaping is shared through Redis only while Redis answers: at the default
	// 50ms timeout a loaded machine's Redis can be late, and a replica then decides
	// alone (failure_mode local) and lets extra requests through. That is the
	// product's choice, not what this test measures.
	replicas := []*sluiceProcess{
		startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s"),
		startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--redis", redisURL, "--redis-timeout", "5s"),
	}

	client := &http.Client{Timeout: 60 * time.Second}
	sent := make([]waitSent, waitClients*waitPerClient)
	var wg sync.WaitGroup
	gap := time.Second / (4 * waitRate)
	for c := range waitClients {
		wg.Go(func() {
			account := "acct-" + strconv.Itoa(c)
			tick := time.NewTicker(gap)
			defer tick.Stop()
			for i := range waitPerClient {
				s := &sent[c*waitPerClient+i]
				*s = waitSent{account: account, seq: i, waited: -1}
				wg.Go(func() {
					req, _ := http.NewRequest(http.MethodPost, replicas[i%2].url+"/pay", nil)
					req.Header.Set("X-Account", account)
					req.Header.Set("X-Seq", strconv.Itoa(i))
					s.sent = time.Now()
					resp, err := client.Do(req)
					if err != nil {
						t.Errorf("%s #%d: %v", account, i, err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					s.status = resp.StatusCode
					if v := resp.Header.Get("Sluice-Waited"); v != "" {
						s.waited, _ = strconv.ParseFloat(v, 64)
					}
				})
				<-tick.C
			}
		})
	}
	wg.Wait()

	// Every request forwarded (200, with Sluice-Waited) or fallen back (429).
	var waits []float64
	forwarded, fallbacks := 0, 0
	byKey := map[string]*waitSent{}
	for i := range sent {
		s := &sent[i]
		switch s.status {
		case http.StatusOK:
			if s.waited < 0 {
				t.Errorf("%s #%d: forwarded without Sluice-Waited", s.account, s.seq)
			}
			forwarded++
			waits = append(waits, s.waited)
			byKey[s.account+"#"+strconv.Itoa(s.seq)] = s
		case http.StatusTooManyRequests:
			fallbacks++
		default:
			t.Errorf("%s #%d: status %d, want 200 (forwarded) or 429 (fallen back)", s.account, s.seq, s.status)
		}
	}
	mu.Lock()
	got := slices.Clone(arrivals)
	mu.Unlock()
	if len(got) != forwarded {
		t.Errorf("the upstream saw %d requests, %d were answered 200", len(got), forwarded)
	}

	// Pacing per account over the upstream's arrival times.
	slack := int(math.Ceil(waitRate * clArrivalJitter.Seconds()))
	windows := []time.Duration{100 * time.Millisecond, 250 * time.Millisecond, 500 * time.Millisecond, time.Second, 2 * time.Second}
	most := make([]int, len(windows))
	perKey := map[string][]waitArrival{}
	for _, a := range got {
		perKey[a.account] = append(perKey[a.account], a)
	}
	for account, as := range perKey {
		times := make([]time.Time, len(as))
		for i, a := range as {
			times[i] = a.at
		}
		for i, w := range windows {
			n := clMaxInWindow(times, w)
			most[i] = max(most[i], n)
			if bound := int(math.Ceil(waitRate*w.Seconds())) + 1; n > bound+slack {
				t.Errorf("%s: %d requests reached the upstream within %s: over the bound %d (+%d for arrival jitter)", account, n, w, bound, slack)
			}
		}
		// Order: the upstream gets an account's requests in the order of their slots.
		// A slot is estimated on the client's clock as the send time plus the wait the
		// store computed; slots are an interval apart, so an estimate off by less than
		// half of one cannot swap two of them.
		slices.SortFunc(as, func(a, b waitArrival) int { return a.at.Compare(b.at) })
		interval := time.Second / waitRate
		for i := 1; i < len(as); i++ {
			prev, cur := byKey[account+"#"+strconv.Itoa(as[i-1].seq)], byKey[account+"#"+strconv.Itoa(as[i].seq)]
			if prev == nil || cur == nil {
				t.Fatalf("%s: an arrival (#%d or #%d) that no 200 answered", account, as[i-1].seq, as[i].seq)
			}
			slot := func(s *waitSent) time.Time { return s.sent.Add(time.Duration(s.waited * float64(time.Second))) }
			if slot(prev).Sub(slot(cur)) > interval/2 {
				t.Errorf("%s: #%d (slot ~%s) reached the upstream after #%d (slot ~%s)", account, as[i].seq,
					slot(cur).Format("15:04:05.000"), as[i-1].seq, slot(prev).Format("15:04:05.000"))
			}
		}
	}

	slices.Sort(waits)
	p99 := 0.0
	if len(waits) > 0 {
		p99 = waits[min(len(waits)-1, int(math.Ceil(0.99*float64(len(waits))))-1)]
	}
	if p99 > waitMaxWait.Seconds() {
		t.Errorf("p99 Sluice-Waited %.3fs, over max_wait %s", p99, waitMaxWait)
	}
	if forwarded == 0 || fallbacks == 0 {
		t.Errorf("forwarded %d, fell back %d: the load should do both", forwarded, fallbacks)
	}
	for i, w := range windows {
		t.Logf("window %-6s most of one account at the upstream %d (bound %d)", w, most[i], int(math.Ceil(waitRate*w.Seconds()))+1)
	}
	t.Logf("%d requests from %d clients at %d/s each (rule %d/s per account, max_wait %s) over 2 replicas: forwarded %d, fell back %d; Sluice-Waited p50 %.3fs p99 %.3fs max %.3fs",
		len(sent), waitClients, 4*waitRate, waitRate, waitMaxWait, forwarded, fallbacks, waits[len(waits)/2], p99, waits[len(waits)-1])
}

// The check endpoints cannot hold the request they are asked about: through the
// binary, the HTTP check and ext_authz pass a request whose slot is free and answer
// one that would wait with 429 and Retry-After for the wait (a problem whose
// retry-after says the same), giving its slot back, so that the next one is told the
// same wait rather than a longer one; the front door holds nothing for another key.
func TestWaitChecksAnswerTheWait(t *testing.T) {
	up := newUpstream(t, 0)
	rules := strings.Replace(strings.Replace(waitE2ERules(), "unit: second, requests_per_unit: 10", "unit: minute, requests_per_unit: 10", 1),
		"max_wait: 1s", "max_wait: 30s", 1)
	rulesPath := writeRules(t, t.TempDir(), rules)
	grpcAddr, checkAddr := freeAddr(t), freeAddr(t)
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--grpc-listen", grpcAddr, "--check-listen", checkAddr)
	c := &checkedSluice{p: p, up: up, authz: authv3.NewAuthorizationClient(grpcConn(t, grpcAddr)), check: "http://" + checkAddr + "/sluice/v1/check"}
	header := http.Header{"X-Account": {"a"}}
	if code, body := c.httpCheck(t, "/pay", header); code != http.StatusOK {
		t.Fatalf("first HTTP check: %d %s", code, body)
	}
	// The next slot is 6s ahead (10 a minute): told to retry in at most 6s, twice.
	retry := func(what, body string) {
		var p struct {
			RetryAfter int64 `json:"retry-after"`
		}
		if err := json.Unmarshal([]byte(body[strings.IndexByte(body, '{'):]), &p); err != nil || p.RetryAfter < 1 || p.RetryAfter > 6 {
			t.Fatalf("%s: retry-after %d (%v) in %s; want 1 to 6 s", what, p.RetryAfter, err, body)
		}
	}
	code, body := c.httpCheck(t, "/pay", header)
	if code != http.StatusTooManyRequests {
		t.Fatalf("second HTTP check: %d %s, want 429", code, body)
	}
	retry("HTTP check", body)
	code, body = c.extAuthz(t, "/pay", map[string]string{"x-account": "a"})
	if code != http.StatusTooManyRequests {
		t.Fatalf("ext_authz: %d %s, want 429", code, body)
	}
	retry("ext_authz", body)
	r := send(t, "POST", p.url+"/pay", nil, "X-Account", "b")
	if r.status != http.StatusOK || r.header.Get("Sluice-Waited") != "0" {
		t.Fatalf("front door, another account: %d, Sluice-Waited %q", r.status, r.header.Get("Sluice-Waited"))
	}
}

// then: defer through the binary: a request whose slot is past max_wait is parked
// (202 with a ticket) and reaches the downstream through the queue.
func TestWaitFallsBackToDeferThroughTheBinary(t *testing.T) {
	up := newUpstream(t, 0)
	rules := strings.Replace(strings.Replace(waitE2ERules(), "unit: second, requests_per_unit: 10", "unit: minute, requests_per_unit: 1", 1),
		"max_waiting: 1000", "max_waiting: 1000\n    then: defer\n    queue: pay", 1) + `
queues:
  pay:
    outflow: {rate: 10/s}
    downstream: ` + up.URL + "\n"
	p := startSluice(t, "--rules", writeRules(t, t.TempDir(), rules), "--upstream", up.URL)
	if r := send(t, "POST", p.url+"/pay", strings.NewReader(`{"n":1}`), "X-Account", "a"); r.status != http.StatusOK {
		t.Fatalf("first: %d %s", r.status, r.body)
	}
	r := send(t, "POST", p.url+"/pay", strings.NewReader(`{"n":2}`), "X-Account", "a")
	if r.status != http.StatusAccepted || !strings.Contains(r.body, `"ticket"`) || r.header.Get("Sluice-Waited") != "" {
		t.Fatalf("past max_wait: %d %s (Sluice-Waited %q); want 202 with a ticket", r.status, r.body, r.header.Get("Sluice-Waited"))
	}
	for deadline := time.Now().Add(30 * time.Second); up.hits.Load() < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the parked request did not reach the downstream (%d hits)", up.hits.Load())
		}
	}
}
