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

// checkedSluice is `sluice serve` on e2eRules(2) (orders: 2 an hour per X-User-ID) with
// its front door, ext_authz and the HTTP check.
type checkedSluice struct {
	p     *sluiceProcess
	up    *upstream
	authz authv3.AuthorizationClient
	check string // the HTTP check's URL
}

func startChecked(t *testing.T) *checkedSluice {
	t.Helper()
	up := newUpstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), e2eRules(2))
	grpcAddr, checkAddr := freeAddr(t), freeAddr(t)
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--grpc-listen", grpcAddr, "--check-listen", checkAddr)
	return &checkedSluice{p: p, up: up, authz: authv3.NewAuthorizationClient(grpcConn(t, grpcAddr)),
		check: "http://" + checkAddr + "/sluice/v1/check"}
}

// do sends POST url with header and returns the status and the Content-Type and body.
func (c *checkedSluice) do(t *testing.T, url string, header http.Header) (int, string) {
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

// httpCheck asks the HTTP check about POST path with the client's header.
func (c *checkedSluice) httpCheck(t *testing.T, path string, header http.Header) (int, string) {
	t.Helper()
	h := header.Clone()
	h.Set("X-Forwarded-Method", "POST")
	h.Set("X-Forwarded-Uri", path)
	return c.do(t, c.check, h)
}

// extAuthz asks ext_authz about POST path with headers: 200 when allowed, else the
// denied status and body.
func (c *checkedSluice) extAuthz(t *testing.T, path string, headers map[string]string) (int, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := c.authz.Check(ctx, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Request: &authv3.AttributeContext_Request{Http: &authv3.AttributeContext_HttpRequest{
			Method: "POST", Path: path, Host: "shop.example", Headers: headers}}}})
	if err != nil {
		t.Fatal(err)
	}
	if d := resp.GetDeniedResponse(); d != nil {
		return int(d.Status.GetCode()), d.Body
	}
	return http.StatusOK, ""
}

// A client sends a random X-User-ID and then the victim's: the front door, the HTTP
// check and ext_authz refuse it with a 400 problem naming the header, and the upstream
// never sees it, while the victim's own requests are still counted as before.
func TestRepeatedLimitKeyIsRefused(t *testing.T) {
	c := startChecked(t)
	twice := http.Header{"X-User-Id": {"r4nd0m", "alice"}}
	if code, body := c.do(t, c.p.url+"/v1/orders", twice); code != 400 ||
		!strings.Contains(body, "application/problem+json") || !strings.Contains(body, "X-User-Id is sent more than once") {
		t.Errorf("front door, two lines: %d %s", code, body)
	}
	if code, body := c.do(t, c.p.url+"/v1/orders", http.Header{"X-User-Id": {"r4nd0m, alice"}}); code != 400 ||
		!strings.Contains(body, "X-User-Id holds a comma-separated list") {
		t.Errorf("front door, a list: %d %s", code, body)
	}
	if code, body := c.httpCheck(t, "/v1/orders", twice); code != 400 || !strings.Contains(body, "X-User-Id") {
		t.Errorf("HTTP check: %d %s", code, body)
	}
	if code, body := c.extAuthz(t, "/v1/orders", map[string]string{"x-user-id": "r4nd0m,alice"}); code != 400 || !strings.Contains(body, "X-User-Id") {
		t.Errorf("ext_authz: %d %s", code, body)
	}
	if n := c.up.hits.Load(); n != 0 {
		t.Errorf("the upstream saw %d refused requests", n)
	}
	// One value is decided as ever: alice has 2 an hour.
	for i, want := range []int{200, 200, 429} {
		if code, body := c.do(t, c.p.url+"/v1/orders", http.Header{"X-User-Id": {"alice"}}); code != want {
			t.Errorf("alice's request %d: %d %s, want %d", i+1, code, body, want)
		}
	}
}

// The check endpoints decided on the cleaned path (/v1/orders/../../admin as /admin)
// while the proxy routes and forwards the one it holds: ext_authz and the HTTP check
// refuse a path not in normal form with 400 and a problem saying why.
func TestChecksRefusePathsNotInNormalForm(t *testing.T) {
	c := startChecked(t)
	alice := http.Header{"X-User-Id": {"alice"}}
	ask := map[string]func(string) (int, string){
		"ext_authz":  func(p string) (int, string) { return c.extAuthz(t, p, map[string]string{"x-user-id": "alice"}) },
		"HTTP check": func(p string) (int, string) { return c.httpCheck(t, p, alice) },
	}
	for name, ask := range ask {
		for _, p := range []string{"/v1/orders/../../admin", "/v1//orders", "/v1/%2e%2e/v1/orders", "/v1/orders%2F7"} {
			if code, body := ask(p); code != http.StatusBadRequest || !strings.Contains(body, "not in normal form") {
				t.Errorf("%s %s: %d %s, want 400 saying the path is not in normal form", name, p, code, body)
			}
		}
	}
	// The normal form is decided as ever: alice has 2 an hour, counted on both.
	for i, via := range []string{"ext_authz", "HTTP check", "ext_authz"} {
		want := []int{200, 200, 429}[i]
		if code, body := ask[via]("/v1/orders"); code != want {
			t.Errorf("order %d (%s): %d %s, want %d", i+1, via, code, body, want)
		}
	}
}
