package h1

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"
)

// dump answers with everything a handler (the upstream, behind the proxy) sees of a
// request that decides how it is framed and routed; a request to /noread leaves its
// body unread.
var dump = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	var body []byte
	var err error
	if r.URL.Path != "/noread" {
		body, err = io.ReadAll(r.Body)
	}
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(w, "%s %q %q %s host=%q cl=%d te=%q close=%v\n", r.Method, r.RequestURI, r.URL.String(), r.Proto,
		r.Host, r.ContentLength, r.TransferEncoding, r.Close)
	for _, k := range keys {
		fmt.Fprintf(w, "%s=%q\n", k, r.Header[k])
	}
	fmt.Fprintf(w, "body=%q err=%v\n", body, err)
})

// differential is the fast path and net/http's server alone, both serving handler.
type differential struct {
	fast  *served
	plain string // net/http alone
}

func newDifferential(t *testing.T, handler http.Handler) *differential {
	t.Helper()
	sv := serveH1(t, handler)
	plain := &http.Server{
		Handler: handler, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		WriteTimeout: 90 * time.Second, IdleTimeout: 120 * time.Second, MaxHeaderBytes: 64 << 10,
		ErrorLog: log.New(io.Discard, "", 0),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go plain.Serve(ln)
	t.Cleanup(func() { plain.Close() })
	return &differential{fast: sv, plain: ln.Addr().String()}
}

// conversation sends raw on a connection of its own (in one write, or byte by byte
// when split), half-closes it, reads everything the server sends until it closes,
// and returns it as a list of responses with the Date field left out (and the raw
// bytes that follow the last response that parses).
func conversation(t *testing.T, addr, raw string, split bool) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A safety net against a hang, not a timed assertion.
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		if split {
			for i := 0; i < len(raw); i++ {
				if _, err := c.Write([]byte{raw[i]}); err != nil {
					return
				}
			}
		} else if _, err := io.WriteString(c, raw); err != nil {
			return
		}
		c.(*net.TCPConn).CloseWrite()
	}()
	all, _ := io.ReadAll(c)
	<-wrote
	return responses(all, strings.HasPrefix(raw, "HEAD "))
}

// responses splits what a server sent into its responses, each normalized: status
// line, the header sorted without Date, the body.
func responses(all []byte, head bool) []string {
	var out []string
	br := bufio.NewReader(bytes.NewReader(all))
	for {
		if _, err := br.Peek(1); err != nil {
			return out
		}
		method := "GET"
		if head && len(out) == 0 {
			method = "HEAD"
		}
		rest, _ := br.Peek(br.Buffered())
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			return append(out, fmt.Sprintf("unparsed %q", rest))
		}
		body, err := io.ReadAll(resp.Body)
		resp.Header.Del("Date")
		resp.Header.Del("Content-Length")
		var b strings.Builder
		// Not the framing: the fast path holds back 4 KiB of a body to send it with
		// a Content-Length, net/http 2 KiB, so a body between them is chunked by
		// net/http alone.
		fmt.Fprintf(&b, "%s close=%v\n", resp.Status, resp.Close)
		keys := make([]string, 0, len(resp.Header))
		for k := range resp.Header {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "%s: %q\n", k, resp.Header[k])
		}
		if len(body) > 200 {
			body = fmt.Appendf(body[:100:100], "...(%d bytes, %x)", len(body), sha256.Sum256(body))
		}
		fmt.Fprintf(&b, "\n%s (%v)", body, err)
		out = append(out, b.String())
		if err != nil {
			return out
		}
	}
}

// attacks are whole conversations: smuggling, desync and framing tricks, each alone
// and behind a request the fast path serves, so that it meets the fast path with a
// connection under way.
var attacks = []string{
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 0\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:  5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\t5\t\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5,5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 05\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5 \r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 999999999999999999\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTRANSFER-ENCODING: CHUNKED\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \tchunked\t\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n\tContent-Length: 5\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n Content-Length: 0\r\n\r\nhello",
	"GET / HTTP/1.1\nHost: a\n\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\r\n\r\nhello",
	"POST / HTTP/1.1\r\nHost: a\rContent-Length: 5\r\n\r\nhello",
	"GET / HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX\x00Y: b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\x1fc\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX\x7f: b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX : b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX b: c\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n",
	"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\tX: b\r\n\r\n",
	"GET http://evil/x HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET http://a/x HTTP/1.1\r\n\r\n",
	"GET HTTP://A:80/x?y HTTP/1.1\r\nHost: b\r\n\r\n",
	"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n",
	"GET a:443 HTTP/1.1\r\nHost: a\r\n\r\n",
	"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET //evil/x HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /x?a=b#frag HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /%2e%2e/x HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a, b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a@b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\\b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost:  \r\n\r\n",
	"GET / HTTP/1.0\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.0\r\n\r\n",
	"POST / HTTP/1.0\r\nHost: a\r\n\r\nhello",
	"GET /\r\n",
	"GET /\r\n\r\n",
	"GET / HTTP/0.9\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\nGET /after-close HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, close\r\n\r\nGET /after-close HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nConnection: close-not\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nConnection: keep-alive\r\nConnection: CLOSE\r\n\r\nGET /after-close HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\n\r\n",
	"HEAD / HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nTrailer: X\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n",
	"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
	"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 42\r\n\r\nGET /inside-the-body HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\n\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nG",
	"PUT / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET",
	"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET ",
	"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 38\r\n\r\nGET /inside-the-body HTTP/1.1\r\nHost: a\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 300000\r\n\r\n" + strings.Repeat("x", 300000) + "GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 200000\r\n\r\n" + strings.Repeat("x", 200000) + "GET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello",
	"POST /noread HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nhello",
	"GET / HTTP/1.1\r\nHost: a\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\r",
	"GET / HT",
	"G",
	"",
	"\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03",
	"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X-Long: "+strings.Repeat("x", 1000)+"\r\n", 80) + "\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX-Line: " + strings.Repeat("x", 1<<20) + "\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: y\r\n", 10000) + "\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n" + strings.Repeat("X: y\r\n", 600) + "\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX-Almost: " + strings.Repeat("x", 4096-len("GET / HTTP/1.1\r\nHost: a\r\nX-Almost: \r\n\r\n")) + "\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX-Over: " + strings.Repeat("x", 4097-len("GET / HTTP/1.1\r\nHost: a\r\nX-Over: \r\n\r\n")) + "\r\n\r\nGET /next HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET / HTTP/1.1\r\nHost: b\r\n\r\nPOST / HTTP/1.1\r\nHost: c\r\nContent-Length: 3\r\n\r\nabcGET /last HTTP/1.1\r\nHost: d\r\n\r\n",
	"GET /a HTTP/1.1\r\nHost: a\r\nCookie: a=b\r\ncookie: c=d\r\nCOOKIE: e=f\r\nx-forwarded-for: 1.2.3.4\r\nX-Forwarded-For: 5.6.7.8\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX-\xc3\xa9: b\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nX: caf\xc3\xa9\r\n\r\n",
	"get / HTTP/1.1\r\nHost: a\r\n\r\n",
	"G\x00T / HTTP/1.1\r\nHost: a\r\n\r\n",
	"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
}

// TestAttacksAgainstNetHTTP sends every attack to the fast path and to net/http's
// server alone, alone and behind a request the fast path serves, in one write and
// byte by byte: every answer, and what the handler (the upstream) saw, must be the
// same.
func TestAttacksAgainstNetHTTP(t *testing.T) {
	d := newDifferential(t, dump)
	const lead = "GET /lead HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, attack := range attacks {
		for _, raw := range []string{attack, lead + attack} {
			for _, split := range []bool{false, true} {
				if split && len(raw) > 8<<10 {
					continue // a million one-byte writes prove nothing more
				}
				got := conversation(t, d.fast.addr, raw, split)
				want := conversation(t, d.plain, raw, split)
				if !slices.Equal(got, want) {
					t.Errorf("%.120q (byte by byte: %v):\nfast path: %q\nnet/http:  %q", raw, split, got, want)
				}
			}
		}
	}
	if d.fast.fast.Load() == 0 || d.fast.slow.Load() == 0 {
		t.Errorf("fast %d, net/http %d: both should have served some", d.fast.fast.Load(), d.fast.slow.Load())
	}
}

// answers is a handler that answers as upstreams do, oddly too: informational
// answers, bodiless statuses with a body or a length, a length it does not keep,
// fields that try to end the head early.
var answers = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	switch r.URL.Path {
	case "/103":
		h.Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		io.WriteString(w, "after hints")
	case "/100":
		w.WriteHeader(http.StatusContinue)
		w.WriteHeader(http.StatusCreated)
	case "/204":
		h.Set("Content-Length", "5")
		w.WriteHeader(http.StatusNoContent)
		io.WriteString(w, "hello")
	case "/304":
		h.Set("Etag", `"x"`)
		h.Set("Content-Length", "5")
		w.WriteHeader(http.StatusNotModified)
		io.WriteString(w, "hello")
	case "/304-bare":
		w.WriteHeader(http.StatusNotModified)
	case "/long-length":
		h.Set("Content-Length", "10")
		io.WriteString(w, "short")
	case "/over-length":
		h.Set("Content-Length", "2")
		_, err := io.WriteString(w, "longer")
		fmt.Fprintf(w, "%v", err)
	case "/inject":
		h.Set("X-Evil", "a\r\nSet-Cookie: evil=1\r\n\r\nHTTP/1.1 200 OK")
		h["Bad Name"] = []string{"x"}
		h["X-Nl\r\nSet-Cookie"] = []string{"y"}
		io.WriteString(w, "body")
	case "/flush":
		io.WriteString(w, "a")
		w.(http.Flusher).Flush()
		io.WriteString(w, "b")
	case "/trailer":
		h.Set("Trailer", "X-Sum")
		io.WriteString(w, strings.Repeat("x", 5000))
		h.Set("X-Sum", "1")
		h.Set(http.TrailerPrefix+"X-Late", "2")
	case "/close":
		h.Set("Connection", "close")
		io.WriteString(w, "bye")
	case "/status":
		w.WriteHeader(599)
	case "/big":
		io.WriteString(w, strings.Repeat("y", 100<<10))
	}
})

// TestAnswersAgainstNetHTTP: what a client reads of each answer, and whether the
// connection carries the next request, are net/http's.
func TestAnswersAgainstNetHTTP(t *testing.T) {
	d := newDifferential(t, answers)
	for _, path := range []string{"/103", "/100", "/204", "/304", "/304-bare", "/long-length", "/over-length",
		"/inject", "/flush", "/trailer", "/close", "/status", "/big", "/none"} {
		raw := "GET " + path + " HTTP/1.1\r\nHost: a\r\n\r\nGET /after HTTP/1.1\r\nHost: a\r\n\r\n"
		got := conversation(t, d.fast.addr, raw, false)
		want := conversation(t, d.plain, raw, false)
		if !slices.Equal(got, want) {
			t.Errorf("%s:\nfast path: %q\nnet/http:  %q", path, got, want)
		}
	}
	if d.fast.slow.Load() != 0 {
		t.Errorf("net/http served %d of them", d.fast.slow.Load())
	}
}
