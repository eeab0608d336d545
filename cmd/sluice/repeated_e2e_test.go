package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
)

// A client sends a random X-User-ID and then the victim's: the front door, the HTTP
// check and ext_authz refuse it with a 400 problem naming the header, and the upstream
// never sees it, while the victim's own requests are still counted as before.
func TestRepeatedLimitKeyIsRefused(t *testing.T) {
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	grpcAddr, checkAddr := freeAddr(t), freeAddr(t)
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--grpc-listen", grpcAddr, "--check-listen", checkAddr)
	do := func(url string, header http.Header) (int, string) {
		t.Helper()
		req, err := http.NewRequest("POST", url, strings.NewReader("{}"))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = header
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type") + " " + string(b)
	}
	twice := http.Header{"X-User-Id": {"r4nd0m", "alice"}}
	if code, body := do(p.url+"/v1/orders", twice); code != 400 ||
		!strings.Contains(body, "application/problem+json") || !strings.Contains(body, "X-User-Id is sent more than once") {
		t.Errorf("front door, two lines: %d %s", code, body)
	}
	if code, body := do(p.url+"/v1/orders", http.Header{"X-User-Id": {"r4nd0m, alice"}}); code != 400 ||
		!strings.Contains(body, "X-User-Id holds a comma-separated list") {
		t.Errorf("front door, a list: %d %s", code, body)
	}
	check := http.Header{"X-User-Id": {"r4nd0m", "alice"}, "X-Forwarded-Method": {"POST"}, "X-Forwarded-Uri": {"/v1/orders"}}
	if code, body := do("http://"+checkAddr+"/sluice/v1/check", check); code != 400 || !strings.Contains(body, "X-User-Id") {
		t.Errorf("HTTP check: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := authv3.NewAuthorizationClient(grpcConn(t, grpcAddr)).Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: "/v1/orders", Host: "shop.example", Headers: map[string]string{"x-user-id": "r4nd0m,alice"}}}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.GetDeniedResponse(); d == nil || d.Status.GetCode() != 400 || !strings.Contains(d.Body, "X-User-Id") {
		t.Errorf("ext_authz: %v", resp)
	}
	if n := up.hits.Load(); n != 0 {
		t.Errorf("the upstream saw %d refused requests", n)
	}
	// One value is decided as ever: alice has 2 an hour.
	for i, want := range []int{200, 200, 429} {
		if code, body := do(p.url+"/v1/orders", http.Header{"X-User-Id": {"alice"}}); code != want {
			t.Errorf("alice's request %d: %d %s, want %d", i+1, code, body, want)
		}
	}
}
