// Command pacedclient fetches the URLs it is given at 5 per second through
// pace.Transport: the program TestLightPacer builds to check what a paced client links
// and how large it is next to the same client on x/time/rate (testdata/rateclient).
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/limiter"
)

func main() {
	tr, err := pace.NewTransport(nil, limiter.PerSecond(5))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	ctx := context.Background()
	for _, u := range os.Args[1:] {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		resp, err := client.Do(req)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_, _ = io.Copy(os.Stdout, resp.Body)
		_ = resp.Body.Close()
	}
}
