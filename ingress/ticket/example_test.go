package ticket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ingress/ticket"
)

// A Go client that was answered 202 follows its order to the end: base is the front
// door, monitor the 202's monitor (or its Location).
func ExampleWait() {
	base, monitor := "http://127.0.0.1:8080", "/sluice/v1/deferred/prfpqtwsrw56ai3ce4tu7rwbv4"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	st, err := ticket.Wait(ctx, base+monitor)
	if err != nil {
		fmt.Println("still waiting or unknown:", err)
		return
	}
	if st.Status == ticket.Done && st.Result != nil {
		fmt.Println("delivered; the downstream answered", st.Result.Status, st.Result.Body)
	}
}
