package rules

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func TestFlowByParse(t *testing.T) {
	s := mustParse(t, `domain: d
queues:
  orders:
    outflow: 100/s
    max_in_flight: 8
    downstream: http://orders:8080
    flow_by: {from: "header:X-Merchant", rate: 5/s, max_in_flight: 2}
`)
	q := s.Queue("orders")
	want := queueconfig.FlowBy{From: "header:X-Merchant", Rate: limiter.PerSecond(5), MaxInFlight: 2}
	if q.FlowBy != want {
		t.Fatalf("flow_by = %+v, want %+v", q.FlowBy, want)
	}
	client := netip.MustParseAddr("192.0.2.1")
	r := httptest.NewRequest("POST", "/orders", nil)
	if k := q.FlowKey(r, client); k != "" {
		t.Errorf("flow key of a request without the header = %q", k)
	}
	r.Header.Set("X-Merchant", "m-42")
	if k := q.FlowKey(r, client); k != "m-42" {
		t.Errorf("flow key = %q, want m-42", k)
	}
	var none *Queue
	if k := none.FlowKey(r, client); k != "" {
		t.Errorf("flow key of no queue = %q", k)
	}
}

func TestFlowByProblems(t *testing.T) {
	for _, tc := range []struct{ name, queue, want string }{
		{"no from", "    flow_by: {rate: 5/s}\n", `t.yaml:6:14: flow_by needs from`},
		{"bad from", "    flow_by: {from: \"cookie:x\", rate: 5/s}\n", `t.yaml:6:14: flow_by from: "cookie:x" must be header:NAME`},
		{"nothing to limit", "    flow_by: {from: client_ip}\n", `t.yaml:6:14: flow_by needs a rate`},
		{"bad rate", "    flow_by: {from: client_ip, rate: fast}\n", `t.yaml:6:38: rate "fast" must look like`},
		{"zero in flight", "    flow_by: {from: client_ip, max_in_flight: 0}\n", `t.yaml:6:47: flow_by max_in_flight must be at least 1`},
		{"more in flight than the queue", "    flow_by: {from: client_ip, max_in_flight: 17}\n", `t.yaml:6:14: flow_by max_in_flight 17 is more than the queue's max_in_flight 16`},
		{"unknown field", "    flow_by: {from: client_ip, rate: 5/s, burst: 3}\n", `t.yaml:6:43: unknown field "burst" in flow_by`},
		{"not a mapping", "    flow_by: header:X-Merchant\n", `t.yaml:6:14: `},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "domain: d\nqueues:\n  orders:\n    outflow: 1/s\n    downstream: http://o:1\n" + tc.queue
			got := problems(t, src)
			if !containsPrefix(got, tc.want) || len(got) != 1 {
				t.Errorf("problems %q: want just %q", got, tc.want)
			}
		})
	}
}
