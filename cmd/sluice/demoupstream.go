package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/spf13/cobra"
)

const demoUpstreamHelp = `Usage: sluice demo-upstream [ADDR]

Runs a tiny HTTP server on ADDR (default 127.0.0.1:9000) that answers every request
200 {"ok":true}: the upstream and downstream of the quick start, so that it needs
nothing but this binary. Once it listens it prints "listening on http://ADDR"; then one
line per request it answers, with the method, the path and the Idempotency-Key and
Sluice-Ticket headers when present, so that a deferred order can be watched arriving.
It reads no request body. It stops on SIGINT or SIGTERM.

Exit status: 0 stopped by a signal, 1 ADDR cannot be listened on, 2 bad usage.
`

// demoUpstreamAddr is where demo-upstream listens without ADDR: the downstream of
// deploy/rules/quickstart.yaml.
const demoUpstreamAddr = "127.0.0.1:9000"

func demoUpstreamCommand(stdout, stderr io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "demo-upstream",
		Short: `run a tiny upstream answering {"ok":true}, for the quick start`,
		Long:  demoUpstreamHelp,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) > 1 {
				return usageErrorf("unexpected argument %q: demo-upstream takes one ADDR", args[1])
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			addr := demoUpstreamAddr
			if len(args) == 1 {
				addr = args[0]
			}
			return status(runDemoUpstream(c.Context(), addr, stdout, stderr))
		},
	}
}

// demoBody is the answer to every request.
var demoBody = []byte(`{"ok":true}` + "\n")

// runDemoUpstream serves the demo upstream on addr until ctx ends.
func runDemoUpstream(ctx context.Context, addr string, stdout, stderr io.Writer) int {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintf(stderr, "sluice demo-upstream: %v\n", err)
		return exitFailure
	}
	// The request lines come from the server's goroutines: one writer at a time.
	var mu sync.Mutex
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		line := fmt.Sprintf("%s %q", r.Method, r.URL.RequestURI())
		for _, name := range []string{"Idempotency-Key", "Sluice-Ticket"} {
			if v := r.Header.Get(name); v != "" {
				// %q: a hostile header cannot write terminal escapes; 200 bytes at most.
				line += fmt.Sprintf(" %s=%q", name, shorten(v, 200))
			}
		}
		mu.Lock()
		fmt.Fprintln(stdout, line)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(demoBody)))
		_, _ = w.Write(demoBody)
	})
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second, MaxHeaderBytes: 64 << 10}
	fmt.Fprintf(stdout, "listening on http://%s\n", ln.Addr())
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		fmt.Fprintf(stderr, "sluice demo-upstream: %v\n", err)
		return exitFailure
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		_ = srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "sluice demo-upstream: %v\n", err)
	}
	return exitOK
}
