// Command lightmw is the middleware alone: rules loaded once, the memory store, the
// metrics on /metrics. TestLightMiddleware builds it and reads which modules it links.
package main

import (
	"log"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func main() {
	set, err := rules.Load(os.Args[1:]...)
	if err != nil {
		log.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	mw, err := ingress.New(ingress.StaticRules{S: set}, limiter.NewMemory(), ingress.WithRegisterer(reg))
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", mw.Wrap(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}
