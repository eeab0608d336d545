// Command rateclient is pacedclient on golang.org/x/time/rate (burst 1): the yardstick
// TestLightPacer compares pacedclient's size with.
package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"golang.org/x/time/rate"
)

func main() {
	lim := rate.NewLimiter(5, 1)
	client := &http.Client{Timeout: 10 * time.Second}
	ctx := context.Background()
	for _, u := range os.Args[1:] {
		if err := lim.Wait(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
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
