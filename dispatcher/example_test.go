package dispatcher_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice/dispatcher"
	"github.com/sluicehq/sluice/limiter"
)

// A client for a paid API that allows 5 calls per second: the transport spaces the
// calls evenly and, when the API answers 429 with Retry-After, waits and retries.
// WithRedisPacing(redisClient, "pace:{partner-api}") would share the 5/s between every
// replica of the program.
func ExampleNewPacingTransport() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "quote for", r.URL.Query().Get("sku"))
	}))
	defer api.Close()

	client := &http.Client{
		Transport: dispatcher.NewPacingTransport(http.DefaultTransport, limiter.PerSecond(5)),
	}
	for _, sku := range []string{"a-1", "b-2", "c-3"} {
		resp, err := client.Get(api.URL + "/quote?sku=" + sku)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(resp.Status)
		resp.Body.Close()
	}
	http.DefaultTransport.(*http.Transport).CloseIdleConnections()
	// Output:
	// 200 OK
	// 200 OK
	// 200 OK
}
