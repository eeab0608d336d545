package dispatcher

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// The delivery URL keeps the downstream's scheme and host whatever the parked path and
// query hold, and sends the parked path as it was escaped.
func TestDeliveryURL(t *testing.T) {
	cases := []struct {
		base, path, query string
		want              string // u.String(); "" means invalid
		wantPath          string // decoded path, when want is set
	}{
		{"http://api:8080", "/v1/orders", "n=1", "http://api:8080/v1/orders?n=1", "/v1/orders"},
		{"http://api:8080/", "/v1/orders", "", "http://api:8080/v1/orders", "/v1/orders"},
		{"https://api/base/", "/v1/orders", "a=b&c=%20", "https://api/base/v1/orders?a=b&c=%20", "/base/v1/orders"},
		{"https://api/base", "/", "", "https://api/base/", "/base/"},
		{"http://api", "/a%2Fb", "", "http://api/a%2Fb", "/a/b"},
		{"http://api/p%2Fq/", "/a%2Fb", "", "http://api/p%2Fq/a%2Fb", "/p/q/a/b"},
		{"http://api", "/x?y", "z=1", "http://api/x%3Fy?z=1", "/x?y"}, // a '?' in the path stays in the path
		{"http://api", "/x#frag", "", "http://api/x%23frag", "/x#frag"},
		{"http://api", "/caf%C3%A9/%E2%82%AC", "", "http://api/caf%C3%A9/%E2%82%AC", "/café/€"},
		{"http://api", "/café", "", "http://api/caf%C3%A9", "/café"},
		{"http://api", "/a/../../etc/passwd", "", "http://api/a/../../etc/passwd", "/a/../../etc/passwd"}, // as sent; not cleaned
		{"http://api", "/@evil/x", "", "http://api/@evil/x", "/@evil/x"},
		// Attacks on the host: refused.
		{"http://api", "@otherhost/x", "", "", ""},
		{"http://api", "//evil/x", "", "", ""},
		{"http://api", "http://evil/x", "", "", ""},
		{"http://api", "", "", "", ""},
		{"http://api", "x", "", "", ""},
		{"http://api", `\\evil\x`, "", "", ""},
		{"http://api", "/a%zz", "", "", ""},
		{"http://api", "/x", "a=1#frag", "", ""},
		{"http://api", "/x", "a=1 HTTP/1.1\r\nHost: evil", "", ""},
		{"http://api", "/x", "a=\x00", "", ""},
	}
	if u, err := deliveryURL(&url.URL{Scheme: "http", Host: "api"}, &queue.Message{Request: queue.Request{Path: "/x"}}); err == nil {
		t.Errorf("an order without a method: %s, want an error", u)
	}
	for _, c := range cases {
		t.Run(c.path+"?"+c.query, func(t *testing.T) {
			base, err := url.Parse(c.base)
			if err != nil {
				t.Fatal(err)
			}
			m := &queue.Message{Request: queue.Request{Method: "POST", Path: c.path, RawQuery: c.query}}
			u, err := deliveryURL(base, m)
			if c.want == "" {
				if err == nil {
					t.Fatalf("deliveryURL = %s, want an error", u)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := u.String(); got != c.want {
				t.Errorf("URL %s, want %s", got, c.want)
			}
			if u.Host != base.Host || u.Scheme != base.Scheme || u.Path != c.wantPath || u.RawQuery != c.query || u.User != nil {
				t.Errorf("fields %#v", u)
			}
			// What the downstream's server parses from the request line.
			back, err := url.ParseRequestURI(u.RequestURI())
			if err != nil || back.Path != c.wantPath || back.RawQuery != c.query {
				t.Errorf("request URI %q parses to %q ? %q (%v)", u.RequestURI(), back.Path, back.RawQuery, err)
			}
		})
	}
}

// TestTransportCauseNamesNoAddress: what the ticket's record says of a request that got
// no answer (shown to whoever holds the ticket) names the kind of failure, never the
// downstream's URL or address; the log keeps the whole error.
func TestTransportCauseNamesNoAddress(t *testing.T) {
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAt := closed.Addr().String()
	closed.Close()
	hangUp := listenAndServe(t, func(c net.Conn) { // reads the request, answers nothing
		defer c.Close()
		if req, err := http.ReadRequest(bufio.NewReader(c)); err == nil {
			_, _ = io.Copy(io.Discard, req.Body) // left unread, the close would be a reset
		}
	})
	silent := listenAndServe(t, func(c net.Conn) { <-t.Context().Done(); c.Close() })
	client := &http.Client{Timeout: 200 * time.Millisecond}
	cases := []struct {
		name, url, want string
	}{
		{"refused", "http://" + refusedAt + "/v1/orders", "connection refused"},
		{"closed without an answer", "http://" + hangUp + "/v1/orders", "closed the connection"},
		{"timeout", "http://" + silent + "/v1/orders", "timed out"},
		{"no such host", "http://no-such-host.invalid/v1/orders", "did not resolve"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := client.Post(tc.url, "application/json", strings.NewReader("{}"))
			if err == nil {
				resp.Body.Close()
				t.Fatal("the request got an answer")
			}
			cause := transportCause(err)
			u, _ := url.Parse(tc.url)
			if !strings.Contains(cause, tc.want) || strings.Contains(cause, u.Host) || strings.Contains(cause, u.Hostname()) {
				t.Errorf("cause %q of %v: want %q in it and no address", cause, err, tc.want)
			}
		})
	}
}

// listenAndServe accepts connections on a loopback port until the test ends, each
// handed to serve, and returns the address.
func listenAndServe(t *testing.T, serve func(net.Conn)) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go serve(c)
		}
	}()
	return ln.Addr().String()
}
