// Command ratemw is the same handler as lightmw on golang.org/x/time/rate with
// client_golang: the yardstick TestLightMiddleware reports lightmw's size against.
package main

import (
	"log"
	"net"
	"net/http"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"
)

func main() {
	reg := prometheus.NewRegistry()
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "decisions_total"}, []string{"outcome"})
	reg.MustRegister(decisions)
	var (
		mu   sync.Mutex
		lims = map[string]*rate.Limiter{}
	)
	limited := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ip, _, _ := net.SplitHostPort(r.RemoteAddr)
			mu.Lock()
			l, ok := lims[ip]
			if !ok {
				l = rate.NewLimiter(2, 4)
				lims[ip] = l
			}
			mu.Unlock()
			if !l.Allow() {
				decisions.WithLabelValues("rejected").Inc()
				http.Error(w, "too many requests", http.StatusTooManyRequests)
				return
			}
			decisions.WithLabelValues("allowed").Inc()
			next.ServeHTTP(w, r)
		})
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", limited(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
