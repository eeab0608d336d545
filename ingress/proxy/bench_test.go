package proxy

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"testing"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// discardWriter is a ResponseWriter (and Flusher) that keeps nothing but a header map
// it reuses.
type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *discardWriter) WriteHeader(int)             {}
func (w *discardWriter) Flush()                      {}

// BenchmarkExchangeRelay is one small GET through the pool, Exchange and Relay, over
// loopback to an upstream that allocates nothing: -benchmem counts the pool's own
// allocations per request.
func BenchmarkExchangeRelay(b *testing.B) {
	u := rawup.Fixed(b, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\nConnection: keep-alive\r\nDate: Tue, 01 Dec 2026 12:00:00 GMT\r\n\r\n{\"ok\":true}")
	p, err := New(u.Host)
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

// repeatReader reads s over and over.
type repeatReader struct {
	s   string
	off int
}

func (r *repeatReader) Read(p []byte) (int, error) {
	n := copy(p, r.s[r.off:])
	r.off = (r.off + n) % len(r.s)
	return n, nil
}

// BenchmarkReadHead is the response-head parser alone, on heads of the size a web
// server sends (nginx's eight fields), from memory: its CPU and allocations without
// the network's.
func BenchmarkReadHead(b *testing.B) {
	const head = "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Tue, 01 Dec 2026 12:00:00 GMT\r\n" +
		"Content-Type: text/html\r\nContent-Length: 0\r\nLast-Modified: Tue, 01 Dec 2026 11:00:00 GMT\r\n" +
		"Connection: keep-alive\r\nETag: \"692d8a30-0\"\r\nAccept-Ranges: bytes\r\n\r\n"
	c := &conn{pool: &Pool{maxHeader: DefaultMaxHeaderBytes}}
	c.lr = budget{r: &repeatReader{s: head}, n: -1}
	c.br = bufio.NewReaderSize(&c.lr, 4096)
	c.tp = textproto.NewReader(c.br)
	b.ReportAllocs()
	for b.Loop() {
		resp, _, err := readHead(c, http.MethodGet)
		if err != nil || len(resp.Header) != 8 {
			b.Fatal(resp, err)
		}
	}
}
