package main

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDemoUpstream: demo-upstream says where it listens once it does, answers
// {"ok":true}, prints each request in one quoted line, and exits 1 on an address in
// use.
func TestDemoUpstream(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out, errOut := &syncBuffer{}, &syncBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, []string{"demo-upstream", "127.0.0.1:0"}, out, errOut) }()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != exitOK {
			t.Errorf("demo-upstream stopped with exit %d: %s", code, errOut)
		}
	})
	var url string
	for deadline := time.Now().Add(30 * time.Second); url == ""; time.Sleep(10 * time.Millisecond) {
		if first, _, ok := strings.Cut(out.String(), "\n"); ok {
			var found bool
			if url, found = strings.CutPrefix(first, "listening on "); !found {
				t.Fatalf("first line %q", first)
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no listening line; stderr %q", errOut)
		}
	}
	// A raw request, so that the header holds an 8-bit CSI (a terminal escape) as sent.
	addr := strings.TrimPrefix(url, "http://")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "POST /v1/orders?x=1 HTTP/1.1\r\nHost: x\r\nIdempotency-Key: \"order-1\"\x9b2J\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{\"item\":1}"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || string(body) != "{\"ok\":true}\n" || resp.Header.Get("Content-Type") != "application/json" {
		t.Errorf("answer %d %q %q", resp.StatusCode, resp.Header.Get("Content-Type"), body)
	}
	// The escape is quoted, never written to the terminal as it came.
	want := `POST "/v1/orders?x=1" Idempotency-Key="\"order-1\"\x9b2J"` + "\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Errorf("stdout %q lacks the request line %q", out, want)
	}

	// The same address again: exit 1 with the listener's error.
	code, _, stderr := runIn(t, "demo-upstream", addr)
	if code != exitFailure || !strings.Contains(stderr, "address already in use") {
		t.Errorf("second demo-upstream on %s: exit %d, stderr %q", addr, code, stderr)
	}
	if code, _, stderr := runIn(t, "demo-upstream", "a", "b"); code != exitUsage || !strings.Contains(stderr, `unexpected argument "b"`) {
		t.Errorf("two addresses: exit %d, stderr %q", code, stderr)
	}
}
