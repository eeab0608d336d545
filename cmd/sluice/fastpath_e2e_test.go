package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// dumpUpstream answers with what it saw of each request (method, target, Host,
// the header but for the fields that name a connection, the body), so that a
// request's bytes that reach it can be compared; a few paths answer as odd
// upstreams do.
func dumpUpstream(t *testing.T) *httptest.Server {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(http.StatusNoContent)
			return
		case "/304":
			w.Header().Set("Etag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
			return
		case "/103":
			w.Header().Set("Link", "</a.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
		case "/stream":
			io.WriteString(w, "first ")
			w.(http.Flusher).Flush()
			io.WriteString(w, strings.Repeat("z", 10000))
			return
		}
		keys := make([]string, 0, len(r.Header))
		for k := range r.Header {
			switch k {
			case "X-Forwarded-Host", "Traceparent", "X-Request-Id":
				continue
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		fmt.Fprintf(w, "%s %q host=%q cl=%d te=%q\n", r.Method, r.RequestURI, r.Host, r.ContentLength, r.TransferEncoding)
		for _, k := range keys {
			fmt.Fprintf(w, "%s=%q\n", k, r.Header[k])
		}
		fmt.Fprintf(w, "body=%q err=%v\n", body, err)
	}))
	t.Cleanup(up.Close)
	return up
}

// last ends every conversation: the server closes after it. The client does not
// half-close instead: net/http's server cancels a request whose client has sent
// EOF, and sluice then answers nothing, an empty 200, as soon as it sees it.
const last = "GET /last HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n"

// rawConversation sends raw and then last to addr in one write and returns every
// response read until the server closes, each normalized: status, Connection
// close, the header but Date and the fields that differ per request, the body.
func rawConversation(t *testing.T, addr, raw string) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(30 * time.Second)) // against a hang, not an assertion
	go io.WriteString(c, raw+last)
	all, _ := io.ReadAll(c)
	var out []string
	br := bufio.NewReader(bytes.NewReader(all))
	for {
		if _, err := br.Peek(1); err != nil {
			return out
		}
		method := "GET"
		if strings.HasPrefix(raw, "HEAD ") && len(out) == 0 {
			method = "HEAD"
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			rest, _ := io.ReadAll(br)
			return append(out, fmt.Sprintf("unparsed %q", rest))
		}
		body, err := io.ReadAll(resp.Body)
		var b strings.Builder
		fmt.Fprintf(&b, "%s close=%v\n", resp.Status, resp.Close)
		keys := make([]string, 0, len(resp.Header))
		for k := range resp.Header {
			switch k {
			case "Date", "Content-Length", "X-Request-Id", "Traceparent":
				continue
			}
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %q\n", k, resp.Header[k])
		}
		fmt.Fprintf(&b, "\n%s (%v)", body, err)
		out = append(out, b.String())
		if err != nil {
			return out
		}
	}
}

// TestFastPathAgainstNetHTTP runs sluice serve twice, on the fast path and with
// --fast-path=false, and sends both the same conversations (smuggling and framing
// tricks, pipelining, bodies over --max-body, odd upstream answers): the answers and
// what reached the upstream must be the same.
func TestFastPathAgainstNetHTTP(t *testing.T) {
	t.Parallel()
	rulesPath := writeRules(t, t.TempDir(), e2eRules(1000))
	fast := startSluice(t, "--rules", rulesPath, "--upstream", dumpUpstream(t).URL, "--max-body", "1000")
	plain := startSluice(t, "--rules", rulesPath, "--upstream", dumpUpstream(t).URL, "--max-body", "1000", "--fast-path=false")
	const next = "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, raw := range []string{
		"GET /a?b=c HTTP/1.1\r\nHost: a\r\nUser-Agent: x\r\nX-Forwarded-For: 10.0.0.1\r\nCookie: a=b\r\ncookie: c=d\r\n\r\n" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n" + next,
		"GET /p HTTP/1.1\nHost: a\n\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nX : b\r\n\r\n" + next,
		"GET http://evil/p HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n" + next,
		"GET /p HTTP/1.0\r\nHost: a\r\n\r\n" + next,
		"GET /p HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n" + next,
		"HEAD /p HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n" + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 1001\r\n\r\n" + strings.Repeat("x", 1001) + next,
		"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 300000\r\n\r\n" + strings.Repeat("x", 300000) + next,
		"GET /p HTTP/1.1\r\nHost: a\r\nX-Long: " + strings.Repeat("x", 1<<20) + "\r\n\r\n",
		"GET /p HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: y\r\n", 10000) + "\r\n",
		"GET /204 HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"GET /304 HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"GET /103 HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"GET /stream HTTP/1.1\r\nHost: a\r\n\r\n" + next,
		"GET /p HTTP/1.1\r\nHost: a\r\n\r\n" + "GET /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next,
	} {
		got := rawConversation(t, strings.TrimPrefix(fast.url, "http://"), raw)
		want := rawConversation(t, strings.TrimPrefix(plain.url, "http://"), raw)
		if !slices.Equal(got, want) {
			t.Errorf("%.100q:\nfast path: %.3000q\nnet/http:  %.3000q", raw, got, want)
		}
	}
}

// goneRules pace an account to one request every 20 s, held for its slot, one held
// at a time.
const goneRules = `
domain: gone
descriptors:
  - key: account
    rate_limit: {unit: minute, requests_per_unit: 3}
    name: paced
    on_limit: wait
    max_wait: 30s
    max_waiting: 1
routes:
  - name: pay
    match: {method: [POST], path: /pay}
    descriptors:
      - [{key: account, from: "header:X-Account"}]
`

// payOn sends a POST /pay of account a on a connection of its own and returns it.
func payOn(t *testing.T, addr string) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "POST /pay HTTP/1.1\r\nHost: a\r\nX-Account: a\r\nContent-Length: 0\r\n\r\n")
	return c, bufio.NewReader(c)
}

// held reports whether the request on c is held: no answer within a moment. A
// refusal past max_waiting is at once; one slower than the moment reads as held,
// which can only make the test pass wrongly, never fail wrongly.
func held(t *testing.T, c net.Conn, br *bufio.Reader) bool {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return true
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("a request over the pace: %d, want held or 429 past max_waiting", resp.StatusCode)
	}
	return false
}

// A request held for a wait rule's slot whose client leaves frees its place among
// max_waiting and its slot at once, on the fast path as on net/http: the next
// request is held in its place instead of refused, and the upstream never sees the
// request that left.
func TestFastPathClientGoneFreesAWait(t *testing.T) {
	t.Parallel()
	for _, fastPath := range []string{"--fast-path=true", "--fast-path=false"} {
		up := newUpstream(t, 0)
		p := startSluice(t, "--rules", writeRules(t, t.TempDir(), goneRules), "--upstream", up.URL, fastPath)
		addr := strings.TrimPrefix(p.url, "http://")
		if r := send(t, "POST", p.url+"/pay", nil, "X-Account", "a"); r.status != http.StatusOK {
			t.Fatalf("%s: first request %d", fastPath, r.status)
		}
		leaving, _ := payOn(t, addr)
		// The leaving request is held once a second one is refused past max_waiting.
		deadline := time.Now().Add(10 * time.Second)
		for probe, br := payOn(t, addr); held(t, probe, br); probe, br = payOn(t, addr) {
			probe.Close()
			if time.Now().After(deadline) {
				t.Fatalf("%s: the second request is not held", fastPath)
			}
		}
		leaving.Close()
		// Its place is free well before its slot, 20 s on.
		deadline = time.Now().Add(10 * time.Second)
		var next net.Conn
		for probe, br := payOn(t, addr); ; probe, br = payOn(t, addr) {
			if held(t, probe, br) {
				next = probe
				break
			}
			probe.Close()
			if time.Now().After(deadline) {
				t.Fatalf("%s: the place of the request whose client left is still taken", fastPath)
			}
			time.Sleep(50 * time.Millisecond)
		}
		next.Close()
		if n := up.hits.Load(); n != 1 {
			t.Errorf("%s: the upstream saw %d requests, want the first alone", fastPath, n)
		}
	}
}
