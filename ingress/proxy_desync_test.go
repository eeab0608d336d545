package ingress

import (
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// TestProxyDropsConnectionWithUnsolicitedBytes: bytes an upstream sent past the end of
// a response (a body longer than its Content-Length, a second response nobody asked
// for) must not be read as the response to the next request on the connection, which
// may be another client's: the connection is closed rather than pooled, as
// net/http's Transport does ("unsolicited response"). Otherwise one client that gets
// an upstream to write past a response decides what the next client receives.
func TestProxyDropsConnectionWithUnsolicitedBytes(t *testing.T) {
	const forged = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
	for _, tc := range []struct {
		name   string
		method string // of the first request
		first  string // the upstream's answer to it
	}{
		{"a second response", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" + forged},
		{"a body past its length", "GET", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokay, and more"},
		// An upstream that answers HEAD as GET, with a body a client chose (an echo).
		{"an answer to HEAD with a body", "HEAD", "HTTP/1.1 200 OK\r\nContent-Length: 39\r\n\r\n" + forged},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := rawup.Start(t, rawup.Text(func(n int64) string {
				if n == 1 {
					return tc.first
				}
				return "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nreal"
			}))
			p, err := NewProxy(u, WithProxyTimeout(20*time.Second), WithProxyLogger(slog.New(slog.DiscardHandler)))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.CloseIdleConnections)
			get := func(method, path string) string {
				t.Helper()
				r, _ := http.NewRequest(method, "http://shop.example"+path, nil)
				r.RemoteAddr = "192.0.2.1:1000"
				w := &bodyRecorder{header: http.Header{}}
				p.ServeHTTP(w, r)
				return w.body
			}
			if got := get(tc.method, "/first"); got != "ok" && got != "" {
				t.Fatalf("first response %q", got)
			}
			if got := get("GET", "/second"); got != "real" {
				t.Errorf("second client got %q, want the upstream's answer to it, %q", got, "real")
			}
		})
	}
}

// bodyRecorder is a ResponseWriter that keeps the body (httptest.ResponseRecorder
// would do, but Flush must be supported and the status is not looked at).
type bodyRecorder struct {
	header http.Header
	body   string
}

func (w *bodyRecorder) Header() http.Header { return w.header }
func (w *bodyRecorder) WriteHeader(int)     {}
func (w *bodyRecorder) Write(b []byte) (int, error) {
	w.body += string(b)
	return len(b), nil
}
func (w *bodyRecorder) Flush() {}
