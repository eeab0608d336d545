package h1

import (
	"testing"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/proxy/rawup"
)

// upstreamAnswer is what the benchmark's upstream sends to every request: net/http's
// answer of sluice-bench's upstream, byte for byte but the date.
const upstreamAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nContent-Type: application/json\r\n" +
	"Date: Tue, 01 Dec 2026 12:00:00 GMT\r\n\r\n{\"ok\":true}"

// BenchmarkServeProxied is one request through the fast path and the front door's
// proxy (ingress.Proxy on its pool, as sluice serve and sluice-bench's "sluice's
// proxy alone" run it) to an upstream on loopback that allocates nothing: the
// client's connection is from memory (memConn), the upstream's a real socket, so
// -benchmem counts the fast path's and the proxy's allocations per request, and the
// time includes the two system calls to the upstream and its answer.
func BenchmarkServeProxied(b *testing.B) {
	p, err := ingress.NewProxy(rawup.Fixed(b, upstreamAnswer))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(p.CloseIdleConnections)
	mc := benchServe(b, p)
	if mc.ok != b.N {
		b.Fatalf("%d of %d requests answered 200 with the upstream's body", mc.ok, b.N)
	}
}
