package ingress

import (
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// hostileCase is an upstream that breaks HTTP/1.1 in one way, answering the request
// whose id is id (each request has its own; a response echoes it in X-Id and its
// body) as the n-th it read.
type hostileCase struct {
	name   string
	method string // of every request (GET when empty)
	// late: the hazard is bytes that come 5 to 50 ms after a complete response,
	// whatever the proxy checks; how many misdeliveries that makes depends on timing
	// (see the package documentation of ingress/proxy), so the counts are shown,
	// not asserted.
	late     bool
	requests int // per client (perClient when 0)
	answer   func(c *rawup.Conn, id string, n int64) bool
}

// echo is a well-framed response for the request id.
func echo(id string) string {
	return "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nContent-Length: " + strconv.Itoa(len(id)+3) + "\r\n\r\nid=" + id
}

// lateDelay is how long after a response its stray bytes come: 5 to 50 ms.
func lateDelay(n int64) time.Duration { return time.Duration(5+(n*7)%46) * time.Millisecond }

func write(c *rawup.Conn, s string) bool {
	_, err := io.WriteString(c, s)
	return err == nil
}

func chunk(s string) string { return strconv.FormatInt(int64(len(s)), 16) + "\r\n" + s + "\r\n" }

var hostileCases = []hostileCase{
	{name: "late stray response", late: true, answer: func(c *rawup.Conn, id string, n int64) bool {
		if !write(c, echo(id)) {
			return false
		}
		time.Sleep(lateDelay(n))
		return write(c, echo(id))
	}},
	{name: "HTTP/1.0 keep-alive, late stray", answer: func(c *rawup.Conn, id string, n int64) bool {
		if !write(c, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nX-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(id)+3)+"\r\n\r\nid="+id) {
			return false
		}
		time.Sleep(lateDelay(n))
		return write(c, echo(id))
	}},
	{name: "body after HEAD, late", method: "HEAD", answer: func(c *rawup.Conn, id string, n int64) bool {
		body := echo(id)
		if !write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n") {
			return false
		}
		time.Sleep(lateDelay(n))
		return write(c, body)
	}},
	{name: "body after HEAD", method: "HEAD", answer: func(c *rawup.Conn, id string, n int64) bool {
		body := echo(id)
		return write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}},
	{name: "CL+TE", answer: func(c *rawup.Conn, id string, n int64) bool {
		body := chunk("id="+id) + "0\r\n\r\n" + echo(id)
		return write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\nTransfer-Encoding: chunked\r\n\r\n"+body)
	}},
	{name: "two Content-Lengths", answer: func(c *rawup.Conn, id string, n int64) bool {
		body := "id=" + id + echo(id)
		return write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: "+strconv.Itoa(len(id)+3)+"\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
	}},
	{name: "bad chunk sizes", answer: func(c *rawup.Conn, id string, n int64) bool {
		head := "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nTransfer-Encoding: chunked\r\n\r\n"
		bodies := []string{
			"g\r\nid=" + id + "\r\n0\r\n\r\n",                                                 // not hex
			"3\r\nid=" + id + "\r\n0\r\n\r\n" + echo(id),                                      // shorter than its data
			"fffffffffffffffff\r\nid=" + id + "\r\n0\r\n\r\n",                                 // overflows
			"-5\r\nid=" + id + "\r\n0\r\n\r\n",                                                // negative
			chunk("id="+id) + "0\r\n\r\n" + echo(id),                                          // a response after the last chunk
			"0x" + strconv.FormatInt(int64(len(id)+3), 16) + "\r\nid=" + id + "\r\n0\r\n\r\n", // 0x prefix
		}
		return write(c, head+bodies[n%int64(len(bodies))])
	}},
	{name: "bad chunk extensions", answer: func(c *rawup.Conn, id string, n int64) bool {
		head := "HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\nTransfer-Encoding: chunked\r\n\r\n"
		size := strconv.FormatInt(int64(len(id)+3), 16)
		exts := []string{
			";name=\"unterminated",
			";" + strings.Repeat("a", 8000),
			" ;x=1",
			";x=1\r\n0\r\n\r\n" + echo(id) + "\r\n" + size, // an extension that hides a response
			";a\rb",
		}
		return write(c, head+size+exts[n%int64(len(exts))]+"\r\nid="+id+"\r\n0\r\n\r\n")
	}},
	{name: "1xx incl. 103", answer: func(c *rawup.Conn, id string, n int64) bool {
		infos := []string{
			"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n",
			"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n",
			"HTTP/1.1 102 Processing\r\nContent-Length: " + strconv.Itoa(len(echo(id))) + "\r\n\r\n",
		}
		return write(c, infos[n%int64(len(infos))]+echo(id))
	}},
	{name: "101 without Upgrade", answer: func(c *rawup.Conn, id string, n int64) bool {
		return write(c, "HTTP/1.1 101 Switching Protocols\r\nX-Id: "+id+"\r\n\r\n"+echo(id))
	}},
	{name: "header injection (bare CR/LF)", answer: func(c *rawup.Conn, id string, n int64) bool {
		heads := []string{
			"HTTP/1.1 200 OK\r\nX-Id: " + id + "\rContent-Length: 0\r\nContent-Length: " + strconv.Itoa(len(id)+3) + "\r\n\r\nid=" + id + echo(id),
			"HTTP/1.1 200 OK\r\nX-Id: " + id + "\nContent-Length: 0\r\n\r\n" + echo(id),
			"HTTP/1.1 200 OK\r\nX-Id: " + id + "\r\n\nContent-Length: " + strconv.Itoa(len(id)+3) + "\r\n\r\nid=" + id,
		}
		// The third ends its head at the bare LF: its body runs until the close.
		return write(c, heads[n%int64(len(heads))]) && n%int64(len(heads)) != 2
	}},
	{name: "close mid-body", answer: func(c *rawup.Conn, id string, n int64) bool {
		write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nContent-Length: 100\r\n\r\nid="+id)
		return false
	}},
	{name: "never-ending body", requests: 2, answer: func(c *rawup.Conn, id string, n int64) bool {
		if !write(c, "HTTP/1.1 200 OK\r\nX-Id: "+id+"\r\nTransfer-Encoding: chunked\r\n\r\n"+chunk("id="+id)) {
			return false
		}
		data := chunk(strings.Repeat("x", 4096))
		for {
			select {
			case <-c.Done():
				return false
			default:
			}
			if !write(c, data) {
				return false
			}
		}
	}},
}

const (
	diffClients = 8
	perClient   = 12
)

// idPattern finds the ids a response holds.
var idPattern = regexp.MustCompile(`req-[0-9]+-[0-9]+-`)

// deliveries are what the clients of one case got through one proxy.
type deliveries struct {
	own, failed, misdelivered int
}

// runHostile sends the case's requests through a front door built by front (for
// the upstream at u) from diffClients clients at once, and counts.
func runHostile(t *testing.T, tc hostileCase, front func(u *url.URL) http.Handler) deliveries {
	t.Helper()
	u := rawup.Start(t, func(c *rawup.Conn, req *http.Request, n int64) bool {
		return tc.answer(c, strings.TrimPrefix(req.URL.Path, "/id/"), n)
	})
	srv := httptest.NewUnstartedServer(front(u))
	srv.Config.ErrorLog = log.New(io.Discard, "", 0)
	srv.Start()
	t.Cleanup(srv.Close)
	tr := &http.Transport{MaxIdleConnsPerHost: diffClients}
	t.Cleanup(tr.CloseIdleConnections)
	client := &http.Client{Transport: tr, Timeout: 2 * time.Minute}
	method := tc.method
	if method == "" {
		method = "GET"
	}
	requests := tc.requests
	if requests == 0 {
		requests = perClient
	}
	var (
		mu  sync.Mutex
		got deliveries
		wg  sync.WaitGroup
	)
	for ci := range diffClients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ri := range requests {
				id := fmt.Sprintf("req-%d-%d-", ci, ri)
				outcome := deliver(client, method, srv.URL+"/id/"+id, id)
				mu.Lock()
				switch outcome {
				case 0:
					got.own++
				case 1:
					got.failed++
				default:
					got.misdelivered++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return got
}

// deliver sends one request and says what came back: 0 its own response, 1 an error
// (a 5xx from the proxy, a broken or aborted response), 2 a response that holds
// another request's id.
func deliver(client *http.Client, method, target, id string) int {
	req, _ := http.NewRequest(method, target, nil)
	resp, err := client.Do(req)
	if err != nil {
		return 1
	}
	defer resp.Body.Close()
	// A body that never ends is given up on after its first 64 KiB.
	body, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	seen := idPattern.FindAllString(resp.Header.Get("X-Id")+" "+string(body), -1)
	for _, s := range seen {
		if s != id {
			return 2
		}
	}
	if rerr != nil || resp.StatusCode >= 500 || len(seen) == 0 {
		return 1
	}
	return 0
}

// TestDifferentialHostileUpstreams runs each hostile upstream behind sluice's proxy
// and behind httputil.ReverseProxy (net/http's Transport) side by side, 8 clients on
// keep-alive connections each sending its own requests, and counts the responses
// that reached a client other than the one that asked. sluice's count is 0 in every
// case but the late stray response, which the table shows without a pass or fail:
// a response that comes 5 to 50 ms after a complete one, when the next request is
// already written on the connection, looks like its answer to any HTTP/1.1 client.
// sluice misdelivers those only until the first stray is seen (then it keeps no
// connection of that upstream, see ingress/proxy), about one per client at most in
// flight then (8 to 12 of 96 on 2026-12-01), where net/http goes on (53 to 59).
// With WithProxyReuseAfter longer than the strays' delay it misdelivers none, which
// is asserted.
func TestDifferentialHostileUpstreams(t *testing.T) {
	if testing.Short() {
		t.Skip("a few seconds of hostile upstreams")
	}
	sluiceWith := func(opts ...ProxyOption) func(u *url.URL) http.Handler {
		return func(u *url.URL) http.Handler {
			opts = append(opts, WithProxyLogger(slog.New(slog.DiscardHandler)), WithProxyTimeout(time.Minute))
			p, err := NewProxy(u, opts...)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.CloseIdleConnections)
			return p
		}
	}
	sluice := sluiceWith()
	// Strays come at most 50 ms late (a busy machine may stretch that): a second of
	// reuse delay leaves them none.
	guarded := sluiceWith(WithProxyReuseAfter(time.Second))
	stdlib := func(u *url.URL) http.Handler {
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		t.Cleanup(tr.CloseIdleConnections)
		return &httputil.ReverseProxy{
			Rewrite:   func(pr *httputil.ProxyRequest) { pr.SetURL(u) },
			Transport: tr,
			ErrorLog:  log.New(io.Discard, "", 0),
		}
	}
	var table strings.Builder
	fmt.Fprintf(&table, "\n%-34s %28s %28s\n", "case", "sluice own/failed/MISDELIV", "net/http own/failed/MISDELIV")
	for _, tc := range hostileCases {
		var s, n deliveries
		t.Run(tc.name, func(t *testing.T) {
			s = runHostile(t, tc, sluice)
			n = runHostile(t, tc, stdlib)
			if s.misdelivered > 0 && !tc.late {
				t.Errorf("sluice misdelivered %d responses (net/http %d)", s.misdelivered, n.misdelivered)
			}
			if s.own+s.failed+s.misdelivered == 0 {
				t.Error("no request went through sluice")
			}
			if tc.late {
				g := runHostile(t, tc, guarded)
				if g.misdelivered > 0 || g.own == 0 {
					t.Errorf("sluice with WithProxyReuseAfter(1s): %d own, %d misdelivered; want all own", g.own, g.misdelivered)
				}
				fmt.Fprintf(&table, "%-34s %10d/%d/%-12d\n", tc.name+", reuse after 1s", g.own, g.failed, g.misdelivered)
			}
		})
		fmt.Fprintf(&table, "%-34s %10d/%d/%-12d %10d/%d/%-12d\n", tc.name, s.own, s.failed, s.misdelivered, n.own, n.failed, n.misdelivered)
	}
	t.Log(table.String())
}
