package ingress

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// CheckPath is where proxies ask whether a request they hold may pass: nginx
// auth_request and Traefik ForwardAuth.
const CheckPath = "/sluice/v1/check"

// BodyNotForwarded is the reason, for a defer rule's 429, that the proxy sent no body.
const BodyNotForwarded = "the check did not carry the request's body, so the order could not be parked " +
	"(Envoy: with_request_body and allow_partial_message: false; Traefik: forwardBody: true; nginx auth_request never sends it)."

// CheckHandler answers authorization checks in the form of nginx auth_request and
// Traefik ForwardAuth: the request to decide is the one the proxy describes, its
// method from X-Forwarded-Method (else X-Original-Method), its path and query from
// X-Forwarded-Uri (else X-Original-URI), its host from X-Forwarded-Host (else Host),
// the other headers as sent, and its client from the peer address, or from
// X-Forwarded-For / Forwarded when the peer is a trusted proxy. It answers 200 with
// the rate-limit headers when the request may pass; otherwise 429 with the problem, or
// 202 with the ticket when a defer rule parked it, which needs the body: the check
// request's own (Traefik forwardBody), or an explicit Content-Length: 0.
//
// It is meant for the proxies only: serve it on a listener clients cannot reach.
func (m *Middleware) CheckHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		orig, err := originalRequest(r)
		if err != nil {
			writeProblem(w, simpleProblem(http.StatusBadRequest, err.Error()))
			return
		}
		if m.Authorize(w, orig, bodyMissing(orig)) {
			w.WriteHeader(http.StatusOK)
		}
	})
}

// checkHeaders carry the description of the original request, not part of it.
var checkHeaders = []string{"X-Forwarded-Method", "X-Original-Method", "X-Forwarded-Uri", "X-Original-Uri", "X-Forwarded-Host"}

type checkError string

func (e checkError) Error() string { return string(e) }

// originalRequest rebuilds the request a check describes.
func originalRequest(r *http.Request) (*http.Request, error) {
	method := firstHeader(r.Header, "X-Forwarded-Method", "X-Original-Method")
	if method == "" {
		method = r.Method
	}
	if !validMethod(method) {
		return nil, checkError("X-Forwarded-Method is not an HTTP method.")
	}
	uri := firstHeader(r.Header, "X-Forwarded-Uri", "X-Original-Uri")
	if uri == "" {
		return nil, checkError("The check names no request: send X-Forwarded-Uri or X-Original-URI.")
	}
	u, err := ParseOriginForm(uri)
	if err != nil {
		return nil, checkError("X-Forwarded-Uri / X-Original-URI: " + err.Error())
	}
	orig := r.Clone(r.Context())
	orig.Method, orig.URL, orig.RequestURI = method, u, uri
	if host := r.Header.Get("X-Forwarded-Host"); host != "" {
		orig.Host = host
	}
	for _, h := range checkHeaders {
		orig.Header.Del(h)
	}
	return orig, nil
}

// ErrNotOriginForm is returned by ParseOriginForm.
var ErrNotOriginForm = errors.New("want an origin-form path and query, like /v1/orders?x=1")

// ParseOriginForm parses the path and query of a request a proxy describes. A path
// that starts with // stays a path (url.ParseRequestURI would read a host there), so
// that the route matched is the one the proxy's request takes.
func ParseOriginForm(uri string) (*url.URL, error) {
	if !strings.HasPrefix(uri, "/") || strings.ContainsAny(uri, " \t\r\n#") {
		return nil, ErrNotOriginForm
	}
	u, err := url.Parse("http://sluice.invalid" + uri)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNotOriginForm, err)
	}
	u.Scheme, u.Host = "", ""
	return u, nil
}

func firstHeader(h http.Header, names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(h.Get(n)); v != "" {
			return v
		}
	}
	return ""
}

// validMethod reports whether m is an HTTP token (RFC 9110 section 9.1).
func validMethod(m string) bool {
	if m == "" || len(m) > 32 {
		return false
	}
	for i := 0; i < len(m); i++ {
		c := m[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// bodyMissing says why r (a check's description of a request) cannot be parked: ""
// when its body is there (not empty, or declared empty).
func bodyMissing(r *http.Request) string {
	if r.ContentLength > 0 || r.ContentLength < 0 && r.Body != nil && r.Body != http.NoBody {
		return ""
	}
	if v, ok := r.Header["Content-Length"]; ok && len(v) == 1 && strings.TrimSpace(v[0]) == "0" {
		return ""
	}
	return BodyNotForwarded
}
