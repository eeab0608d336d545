package ingress

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"testing"
	"time"
)

// TestProxyDropsConnectionWithLateUnsolicitedBytes: an upstream that writes a second
// response a moment after the first (not in the same segment, so relay sees nothing
// buffered) must not have it read as the next request's response. The pool only looks
// at a connection idle for a second or more (connAlive), so a request that reuses it
// sooner takes the forged bytes: the fix of relay (c.br.Buffered) covers only bytes that
// arrived with the response.
func TestProxyDropsConnectionWithLateUnsolicitedBytes(t *testing.T) {
	const forged = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	wrote := make(chan struct{})
	go func() {
		n := 0
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n++
			go func(first bool) {
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
					if first && i == 0 {
						time.Sleep(50 * time.Millisecond) // after the proxy read the response
						_, _ = io.WriteString(c, forged)
						close(wrote)
					}
				}
			}(n == 1)
		}
	}()
	u := &url.URL{Scheme: "http", Host: ln.Addr().String()}
	p, err := NewProxy(u, WithProxyTimeout(20*time.Second), WithProxyLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.CloseIdleConnections)
	get := func(path string) string {
		t.Helper()
		r, _ := http.NewRequest("GET", "http://shop.example"+path, nil)
		r.RemoteAddr = "192.0.2.1:1000"
		w := &bodyRecorder{header: http.Header{}}
		p.ServeHTTP(w, r)
		return w.body
	}
	if got := get("/first"); got != "ok" {
		t.Fatalf("first response %q", got)
	}
	<-wrote
	time.Sleep(50 * time.Millisecond) // the forged bytes are in the socket
	if got := get("/second"); got != "ok" {
		t.Errorf("second client got %q, want the upstream's answer to it, %q", got, "ok")
	}
}
