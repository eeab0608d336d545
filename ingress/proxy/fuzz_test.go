package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// Bytes of a fuzzed upstream script (see FuzzRelay).
const (
	scriptNext  = 0x00 // ends one answer's template, the next begins
	scriptPause = 0x01 // what came before goes out, then a pause
	scriptClose = 0x02 // the upstream closes the connection after this answer
	scriptID    = '$'  // the id of the request being answered
)

// FuzzRelay drives the parser and the relay with upstream byte streams of any shape:
// the script is a list of answer templates (separated by 0x00) used in turn, in
// which $ stands for the id of the request being answered (the upstream echoes it),
// 0x01 splits the bytes into writes with a pause between them, and 0x02 closes the
// connection after the answer. Six requests, each with its own id that no input can
// guess, go through one pool in turn. The oracle: every client gets what the
// upstream sent for its own request, an error, or an aborted response, never
// anything that holds another request's id.
//
// Each request is sent once the upstream has written all of its answer to the one
// before: bytes that arrive after that, while a request is already on its way (the
// hazard no check can close, see the package documentation), are the differential
// test's matter (TestDifferentialHostileUpstreams in package ingress).
func FuzzRelay(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$\x01HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\n$\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 60\r\n\r\n0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\nContent-Length: 16\r\nContent-Length: 60\r\n\r\n$HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 103 Early Hints\r\nLink: </$>\r\n\r\n\x01HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 101 Switching Protocols\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 16\r\n\r\n$\x01HTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\n\r\n$\x02",
		"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n$\x02",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=\"\r\n$\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX-A: a\rContent-Length: 0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
		"HTTP/1.1 200 OK\r\nX-Id: $\nContent-Length: 16\r\n\r\n$\x00HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 16\r\n\r\n$",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, script []byte) {
		if len(script) > 16<<10 || bytes.Count(script, []byte{scriptPause}) > 16 {
			return // pauses cost time, not coverage
		}
		templates := bytes.Split(script, []byte{scriptNext})
		var started, finished atomic.Int64
		var ids atomic.Pointer[map[string]string] // path -> id
		u := rawup.Start(t, func(c *rawup.Conn, req *http.Request, n int64) bool {
			started.Add(1)
			defer finished.Add(1)
			id := (*ids.Load())[req.URL.Path]
			tpl := templates[(n-1)%int64(len(templates))]
			for i, part := range bytes.Split(tpl, []byte{scriptPause}) {
				if i > 0 {
					time.Sleep(time.Millisecond)
				}
				part = bytes.ReplaceAll(bytes.ReplaceAll(part, []byte{scriptClose}, nil), []byte{scriptID}, []byte(id))
				if _, err := c.Write(part); err != nil {
					return false
				}
			}
			return !bytes.Contains(tpl, []byte{scriptClose})
		})
		all := map[string]string{}
		for i := range 6 {
			var b [8]byte
			_, _ = rand.Read(b[:])
			all["/"+string(rune('a'+i))] = hex.EncodeToString(b[:])
		}
		ids.Store(&all)
		p := newPool(t, u, WithMaxHeaderBytes(4096), WithResponseTimeout(time.Second))
		for i := range 6 {
			path := "/" + string(rune('a'+i))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan outcome, 1)
			before := started.Load()
			go func() { done <- doCtx(ctx, p, "GET", path) }()
			var o outcome
			select {
			case o = <-done:
			case <-upstreamAnswered(&started, &finished, before):
				// All the upstream wrote is in; a body that never ends is given
				// up on (an abort, which the oracle allows).
				select {
				case o = <-done:
				case <-time.After(10 * time.Millisecond):
					cancel()
					o = <-done
				}
			}
			cancel()
			if o.err == nil {
				got := o.body + strings.Join(flatten(o.header), "\n")
				for other, id := range all {
					if other != path && strings.Contains(got, id) {
						t.Fatalf("request %s got the response of request %s: %d %q %v", path, other, o.status, got, o.header)
					}
				}
			}
			waitUpstreamIdle(t, &started, &finished)
		}
	})
}

// upstreamAnswered is closed once the upstream has begun an answer after the first
// before and finished every answer it began.
func upstreamAnswered(started, finished *atomic.Int64, before int64) <-chan struct{} {
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		for deadline := time.Now().Add(time.Minute); started.Load() == before || started.Load() != finished.Load(); time.Sleep(100 * time.Microsecond) {
			if time.Now().After(deadline) {
				return
			}
		}
	}()
	return ch
}

func waitUpstreamIdle(t *testing.T, started, finished *atomic.Int64) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); started.Load() != finished.Load(); time.Sleep(100 * time.Microsecond) {
		if time.Now().After(deadline) {
			t.Fatal("the upstream did not finish its answer")
		}
	}
}

func flatten(h http.Header) []string {
	var out []string
	for k, vv := range h {
		for _, v := range vv {
			out = append(out, k+": "+v)
		}
	}
	return out
}
