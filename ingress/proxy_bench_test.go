package ingress

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/internal/decisiontest"
	"github.com/sluicehq/sluice/limiter"
)

// BenchmarkProxy measures one small GET through the proxy over loopback, client and
// upstream included: compare with -run x -bench Proxy -cpuprofile.
func BenchmarkProxy(b *testing.B) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	p, err := NewProxy(must(url.Parse(up.URL)))
	if err != nil {
		b.Fatal(err)
	}
	defer p.CloseIdleConnections()
	front := httptest.NewServer(p)
	defer front.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	defer client.CloseIdleConnections()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Get(front.URL + "/")
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

// BenchmarkFrontDoorHandler is the front door's handler alone, as sluice serve runs
// it (a per-client-IP token bucket that never runs out, then the proxy), called
// directly: no client and no listening front server in the figures, only the
// upstream's share.
func BenchmarkFrontDoorHandler(b *testing.B) {
	set := decisiontest.ServeBenchSet(b)
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"ok":true}`)
	}))
	defer up.Close()
	p, err := NewProxy(must(url.Parse(up.URL)), WithProxyRegisterer(prometheus.NewRegistry()))
	if err != nil {
		b.Fatal(err)
	}
	defer p.CloseIdleConnections()
	h := mustNew(b, StaticRules{set}, limiter.NewMemory(), WithRegisterer(prometheus.NewRegistry())).Wrap(p)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			r := httptest.NewRequest("GET", "/", nil)
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK {
				b.Errorf("status %d", w.Code)
				return
			}
		}
	})
}
