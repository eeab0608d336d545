package main

import (
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluicehq/sluice/queue/natstest"
)

// An order whose headers its parked message cannot hold (~3,500 headers, 42 kB: inside
// the front door's limits, but each stored under a prefix, past JetStream's 64 KiB
// header block, or past a smaller max payload of an external NATS) is refused with 431
// naming the limit, on the front door and on ext_authz, and nothing is parked; it was
// 503 "retry later", forever.
func TestOrdersTheQueueCannotStoreAreRefused(t *testing.T) {
	small := filepath.Join(t.TempDir(), "small.conf")
	if err := os.WriteFile(small, []byte("max_payload: 32768\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		headers int
		by      string
		nats    func(t *testing.T) []string
	}{
		{"embedded NATS", 3500, "JetStream's 64 KiB header limit", func(*testing.T) []string { return nil }},
		{"NATS with a 32 KiB max payload", 2000, "the NATS server's max payload", func(t *testing.T) []string {
			return []string{"--nats", natstest.StartConfig(t, small).URL, "--queue-key", testQueueKey}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			down := newDownstream(t, 0)
			rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
			grpcAddr := freeAddr(t)
			p := startSluice(t, append([]string{"--rules", rulesPath, "--upstream", down.URL, "--grpc-listen", grpcAddr}, tc.nats(t)...)...)
			if r := send(t, "POST", p.url+"/v1/orders", strings.NewReader("{}")); r.status/100 != 2 {
				t.Fatalf("first order (within the limit): %d %s", r.status, r.body)
			}
			many := make([]string, 0, 2*tc.headers)
			for i := range tc.headers {
				many = append(many, "X-H"+strconv.Itoa(i), "v")
			}
			r := send(t, "POST", p.url+"/v1/orders", strings.NewReader("{}"), many...)
			if r.status != http.StatusRequestHeaderFieldsTooLarge || r.header.Get("Content-Type") != "application/problem+json" ||
				!strings.Contains(r.body, tc.by) || r.header.Get("Retry-After") != "" {
				t.Errorf("front door: %d %v %s, want a 431 problem naming %s", r.status, r.header, r.body, tc.by)
			}
			headers := map[string]string{"content-length": "2"}
			for i := 0; i < len(many); i += 2 {
				headers[strings.ToLower(many[i])] = many[i+1]
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			resp, err := authv3.NewAuthorizationClient(grpcConn(t, grpcAddr)).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
				Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
					Method: "POST", Path: "/v1/orders", Host: "shop.example", RawBody: []byte("{}"), Headers: headers}}}})
			if err != nil {
				t.Fatal(err)
			}
			if d := resp.GetDeniedResponse(); d == nil || d.Status.GetCode() != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(d.Body, tc.by) {
				t.Errorf("ext_authz: %v, want 431 naming %s", resp, tc.by)
			}
			m := send(t, "GET", p.admin+"/metrics", nil)
			if strings.Contains(m.body, `sluice_queue_parked_total{queue="orders"}`) && !strings.Contains(m.body, `sluice_queue_parked_total{queue="orders"} 0`) {
				t.Errorf("an order was parked:\n%s", grepLines(m.body, "parked"))
			}
		})
	}
}
