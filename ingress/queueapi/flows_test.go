package queueapi

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// The flow endpoints pause, resume and pin the rate of one flow key, named by its
// value and answered by its hash only; bad input gets a 4xx and changes nothing.
func TestQueueAPIFlows(t *testing.T) {
	f := newQueueAPIFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	q, err := f.store.Declare(ctx, queueconfig.Config{Name: "flows", Outflow: limiter.PerSecond(10), Downstream: "http://127.0.0.1:1",
		FlowBy: queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5)}})
	if err != nil {
		t.Fatal(err)
	}
	hash := f.store.FlowKeyFor(q.Config(), "merchant-42")
	const (
		pFlows  = "/sluice/v1/queues/{queue}/flows"
		pPause  = "/sluice/v1/queues/{queue}/flows/{key}/pause"
		pResume = "/sluice/v1/queues/{queue}/flows/{key}/resume"
		pRate   = "/sluice/v1/queues/{queue}/flows/{key}/rate"
	)
	cases := []struct {
		name, method, doc, target, body string
		want                            int
		contains                        string
	}{
		{"none yet", "GET", pFlows, "/sluice/v1/queues/flows/flows", "", 200, `"flows": []`},
		{"pause", "POST", pPause, "/sluice/v1/queues/flows/flows/merchant-42/pause", `{"for":"15m"}`, 200, `"paused_until"`},
		{"pause bad", "POST", pPause, "/sluice/v1/queues/flows/flows/merchant-42/pause", `{"for":"-1m"}`, 400, "positive duration"},
		{"pause no flow_by", "POST", pPause, "/sluice/v1/queues/orders/flows/merchant-42/pause", `{"for":"1m"}`, 400, "no flow_by"},
		{"pause unknown queue", "POST", pPause, "/sluice/v1/queues/nosuch/flows/m/pause", `{"for":"1m"}`, 404, ""},
		{"rate", "PUT", pRate, "/sluice/v1/queues/flows/flows/merchant-42/rate", `{"rate":"2/s"}`, 200, `"rate": "2/s"`},
		{"rate bad", "PUT", pRate, "/sluice/v1/queues/flows/flows/merchant-42/rate", `{"rate":"fast"}`, 400, "rate"},
		{"rate zero", "PUT", pRate, "/sluice/v1/queues/flows/flows/merchant-42/rate", `{"rate":"0/s"}`, 400, "rate"},
		{"rate unknown field", "PUT", pRate, "/sluice/v1/queues/flows/flows/merchant-42/rate", `{"rate":"2/s","x":1}`, 400, "unknown field"},
		{"list", "GET", pFlows, "/sluice/v1/queues/flows/flows", "", 200, hash},
		{"resume", "POST", pResume, "/sluice/v1/queues/flows/flows/merchant-42/resume", "", 200, `"rate": "2/s"`},
		{"unpin", "DELETE", pRate, "/sluice/v1/queues/flows/flows/merchant-42/rate", "", 200, hash},
		{"none left", "GET", pFlows, "/sluice/v1/queues/flows/flows", "", 200, `"flows": []`},
		{"page limit zero", "GET", pFlows, "/sluice/v1/queues/flows/flows?limit=0", "", 400, "limit must be"},
		{"page limit negative", "GET", pFlows, "/sluice/v1/queues/flows/flows?limit=-1", "", 400, "limit must be"},
		{"page limit past the cap", "GET", pFlows, "/sluice/v1/queues/flows/flows?limit=1001", "", 400, "limit must be"},
		{"page limit huge", "GET", pFlows, "/sluice/v1/queues/flows/flows?limit=99999999999999999999", "", 400, "limit must be"},
		{"page after not a key", "GET", pFlows, "/sluice/v1/queues/flows/flows?after=../../x", "", 400, "after must be"},
		{"page after oversize", "GET", pFlows, "/sluice/v1/queues/flows/flows?after=" + strings.Repeat("a", 4096), "", 400, "after must be"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := f.do(tc.method, tc.target, tc.body, "tok")
			if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.contains) {
				t.Fatalf("%s %s: %d %.300s, want %d containing %q", tc.method, tc.target, w.Code, w.Body, tc.want, tc.contains)
			}
			if strings.Contains(w.Body.String(), "merchant-42") {
				t.Errorf("the answer holds the flow value: %s", w.Body)
			}
			f.doc.Conforms(t, tc.doc, tc.method, w)
		})
	}
}
