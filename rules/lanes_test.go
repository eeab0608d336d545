package rules

import (
	"maps"
	"net/http/httptest"
	"net/netip"
	"slices"
	"testing"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

const lanesYAML = `domain: d
descriptors:
  - key: route
    value: orders
    rate_limit: {unit: second, requests_per_unit: 1}
    on_limit: defer
    queue: orders
routes:
  - name: orders
    match: {path_prefix: /orders}
    descriptors: [[{key: route, value: orders}]]
    priority: {from: "header:X-Priority", default: low}
  - name: vip
    match: {path_prefix: /vip}
    descriptors: [[{key: route, value: orders}]]
    priority: {value: high}
queues:
  orders:
    outflow: 10/s
    downstream: http://orders:8080
    priorities: {levels: [high, normal, low], default: normal, mode: weighted, weights: {high: 8, normal: 2, low: 1}}
    fair_by: header:X-Tenant
    fair_lanes: 8
    tenant_max_depth: 500
`

func TestLanesParse(t *testing.T) {
	s := mustParse(t, lanesYAML)
	q := s.Queue("orders")
	want := queueconfig.Priorities{Levels: []string{"high", "normal", "low"}, Default: "normal", Mode: queueconfig.Weighted,
		Weights: map[string]int{"high": 8, "normal": 2, "low": 1}}
	p := q.Priorities
	if !slices.Equal(p.Levels, want.Levels) || p.Default != want.Default || p.Mode != want.Mode || !maps.Equal(p.Weights, want.Weights) ||
		q.FairBy != "Header:X-Tenant" && q.FairBy != "header:X-Tenant" || q.FairLanes != 8 || q.TenantMaxDepth != 500 {
		t.Errorf("queue = %+v", q.Config)
	}
	client := netip.MustParseAddr("192.0.2.1")
	for _, tc := range []struct {
		path, prio, tenant string
		wantPrio           string
	}{
		{"/orders", "normal", "acme", "normal"},
		{"/orders", "", "acme", "low"}, // the route's default
		{"/vip", "low", "", "high"},    // a constant
	} {
		r := httptest.NewRequest("POST", tc.path, nil)
		if tc.prio != "" {
			r.Header.Set("X-Priority", tc.prio)
		}
		if tc.tenant != "" {
			r.Header.Set("X-Tenant", tc.tenant)
		}
		rt, _ := s.Match(r, client, nil)
		if rt == nil {
			t.Fatalf("%s: no route", tc.path)
		}
		prio, tenant := rt.Lane(r, client, q)
		if prio != tc.wantPrio || tenant != tc.tenant {
			t.Errorf("%s: lane (%q, %q), want (%q, %q)", tc.path, prio, tenant, tc.wantPrio, tc.tenant)
		}
	}
}

func TestLanesProblems(t *testing.T) {
	for _, tc := range []struct {
		name, queue, route string
		want               string
	}{
		{"unknown mode", "    priorities: {levels: [a, b], mode: fifo}\n", "", `t.yaml:9:17: priorities: mode "fifo"`},
		{"default not a level", "    priorities: {levels: [a, b], default: c}\n", "", `t.yaml:9:17: priorities: default "c" is not one of the levels`},
		{"weight of no level", "    priorities: {levels: [a, b], weights: {c: 2}}\n", "", `t.yaml:9:17: priorities: weight of "c"`},
		{"weights map", "    priorities: {levels: [a], weights: [1]}\n", "", `t.yaml:9:40: priorities weights must map levels`},
		{"unknown priorities field", "    priorities: {levels: [a], mod: strict}\n", "", `t.yaml:9:31: unknown field "mod" in priorities`},
		{"bad fair_by", "    fair_by: path:{x}\n", "", `t.yaml:9:14: fair_by: "path:{x}" must be header:NAME`},
		{"fair_lanes without fair_by", "    fair_lanes: 4\n", "", `t.yaml:9:17: fair_lanes needs fair_by`},
		{"too many lanes", "    fair_by: client_ip\n    fair_lanes: 65\n", "", `t.yaml:10:17: fair_lanes must be between 1 and 64`},
		{"route priority source", "", "    priority: {from: \"cookie:x\"}\n", `t.yaml:10:22: from "cookie:x"`},
		{"route priority shape", "", "    priority: high\n", `t.yaml:10:15: priority must be like {value: high}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := "domain: d\nroutes:\n  - name: r\n    match: {path: /x}\n" + tc.route + "queues:\n  orders:\n    outflow: 1/s\n    downstream: http://o:1\n" + tc.queue
			if tc.route != "" {
				// The route's lines come before the queue's: keep the file's lines as counted in want.
				src = "domain: d\nqueues:\n  orders:\n    outflow: 1/s\n    downstream: http://o:1\nroutes:\n  - name: r\n    match: {path: /x}\n    descriptors: []\n" + tc.route
			}
			got := problems(t, src)
			if !containsPrefix(got, tc.want) {
				t.Errorf("problems %q lack %q", got, tc.want)
			}
		})
	}
}
