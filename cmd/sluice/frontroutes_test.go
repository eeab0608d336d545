package main

import (
	"bufio"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ingress/deferral"
)

// TestFrontRoutesAnswerAsTheMux checks that frontRoutes answers every request as
// the front door's mux alone does: the same handler, the same redirects and refusals.
func TestFrontRoutesAnswerAsTheMux(t *testing.T) {
	named := func(name string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(name)) })
	}
	mux := http.NewServeMux()
	mux.Handle("GET "+deferral.Path+"{ticket}", named("status"))
	mux.Handle("DELETE "+deferral.Path+"{ticket}", named("cancel"))
	rest := named("rest")
	mux.Handle("/", rest)
	front := frontRoutes{mux: mux, rest: rest}

	requests := []string{
		"GET / HTTP/1.1", "GET /a/b?q=1 HTTP/1.1", "POST /orders HTTP/1.1", "HEAD /x HTTP/1.1",
		"GET /sluice/v1/deferred/abc HTTP/1.1", "HEAD /sluice/v1/deferred/abc HTTP/1.1",
		"DELETE /sluice/v1/deferred/abc HTTP/1.1", "POST /sluice/v1/deferred/abc HTTP/1.1",
		"GET /sluice/v1/deferred/ HTTP/1.1", "GET /sluice/v1/deferred HTTP/1.1",
		"GET /%73luice/v1/deferred/abc HTTP/1.1", "GET /sluice%2Fv1%2Fdeferred%2Fabc HTTP/1.1",
		"GET /sluice/v1/deferred/a%2Fb HTTP/1.1", "GET /a//b HTTP/1.1", "GET /a/./b HTTP/1.1",
		"GET /a/../sluice/v1/deferred/abc HTTP/1.1", "GET /a/.. HTTP/1.1", "GET /a/. HTTP/1.1",
		"GET /.well-known/x HTTP/1.1", "GET /a/%2e%2e/b HTTP/1.1", "GET /a/b/ HTTP/1.1",
		"OPTIONS * HTTP/1.1", "CONNECT example.com:443 HTTP/1.1", "GET http://example.com HTTP/1.1",
		"GET http://example.com/a//b HTTP/1.1", "GET http://example.com/sluice/v1/deferred/abc HTTP/1.1",
	}
	for _, line := range requests {
		answer := func(h http.Handler) string {
			r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(line + "\r\nHost: example.com\r\n\r\n")))
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w.Result().Status + " " + w.Header().Get("Location") + " " + w.Header().Get("Allow") + " " + w.Body.String()
		}
		if got, want := answer(front), answer(mux); got != want {
			t.Errorf("%s: frontRoutes answered %q, the mux %q", line, got, want)
		}
	}
}

// BenchmarkFrontRoutes is what routing a proxied request costs, through the front
// door's mux alone and through frontRoutes.
func BenchmarkFrontRoutes(b *testing.B) {
	mux := http.NewServeMux()
	nothing := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	mux.Handle("GET "+deferral.Path+"{ticket}", nothing)
	mux.Handle("DELETE "+deferral.Path+"{ticket}", nothing)
	mux.Handle("/", nothing)
	r := httptest.NewRequest(http.MethodGet, "/api/orders/123?page=2", nil)
	for _, h := range []struct {
		name string
		h    http.Handler
	}{{"mux", mux}, {"frontRoutes", frontRoutes{mux: mux, rest: nothing}}} {
		b.Run(h.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				h.h.ServeHTTP(nil, r)
			}
		})
	}
}
