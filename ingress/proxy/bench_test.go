package proxy

import (
	"bufio"
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
)

// discardWriter is a ResponseWriter (and Flusher) that keeps nothing but a header map
// it reuses.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

// fixedUpstream answers every request on every connection with resp, allocating
// nothing per request, so that a benchmark's allocations are the pool's own. It reads
// heads only (requests without bodies).
func fixedUpstream(b *testing.B, resp string) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	out := []byte(resp)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						return
					}
					if len(bytes.TrimRight(line, "\r\n")) == 0 {
						if _, err := c.Write(out); err != nil {
							return
						}
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// BenchmarkExchangeRelay is one small GET through the pool, Exchange and Relay, over
// loopback to an upstream that allocates nothing: -benchmem counts the pool's own
// allocations per request.
func BenchmarkExchangeRelay(b *testing.B) {
	addr := fixedUpstream(b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nDate: Tue, 01 Dec 2026 12:00:00 GMT\r\n\r\n{\"ok\":true}")
	p, err := New(addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.CloseIdleConnections)
	r := httptest.NewRequest(http.MethodGet, "http://front/", nil)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for b.Loop() {
		res, err := p.Exchange(r, writeGet)
		if err != nil {
			b.Fatal(err)
		}
		res.Relay(w, r)
		clear(w.h)
	}
}
