package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// TestProxyDropsConnectionWithLateUnsolicitedBytes: an upstream that writes a second
// response a moment after the first (not in the same segment, so relay sees nothing
// buffered) must not have it read as the next request's response: the idle
// connection's watch (or the look at it when it is taken) finds the bytes and closes
// it.
func TestProxyDropsConnectionWithLateUnsolicitedBytes(t *testing.T) {
	const forged = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged"
	var once sync.Once
	wrote := make(chan struct{})
	u := rawup.Start(t, func(c *rawup.Conn, _ *http.Request, n int64) bool {
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		if n == 1 {
			time.Sleep(50 * time.Millisecond) // after the proxy read the response
			_, _ = io.WriteString(c, forged)
			once.Do(func() { close(wrote) })
		}
		return true
	})
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
	// The forged bytes are on their way: the watch closes the connection once they
	// arrive, and until then a look before use would find them.
	for deadline := time.Now().Add(time.Minute); p.pool.Idle() > 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the connection that received bytes nobody asked for is still in the pool")
		}
	}
	if got := get("/second"); got != "ok" {
		t.Errorf("second client got %q, want the upstream's answer to it, %q", got, "ok")
	}
}
