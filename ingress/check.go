package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// CheckPath is where proxies ask whether a request they hold may pass: nginx
// auth_request and Traefik ForwardAuth.
const CheckPath = "/sluice/v1/check"

// BodyNotForwarded is the reason, for a defer rule's 429 on Envoy's ext_authz, that
// the check carried no body.
const BodyNotForwarded = "the check did not carry the request's body, so the order could not be parked " +
	"(Envoy: with_request_body and allow_partial_message: false)."

// forwardAuthNoPark is the reason, for a defer rule's 429 on CheckHandler, that the
// order was not parked.
const forwardAuthNoPark = "this check came from a proxy's forward authentication (nginx auth_request, Traefik ForwardAuth), " +
	"which takes every 2xx answer for \"allowed\": a parked order would reach the upstream now and again from the queue. " +
	"Send deferrable requests through sluice's front door or Envoy's ext_authz (gRPC)."

// CheckHandler answers authorization checks in the form of nginx auth_request and
// Traefik ForwardAuth: the request to decide is the one the proxy describes, its
// method from X-Forwarded-Method (else X-Original-Method, else the check's own), its
// path and query from X-Forwarded-Uri (else X-Original-URI; a check naming neither is
// refused with 400), its host from X-Forwarded-Host (else Host), the other headers as
// sent, and its client from the peer address, or from the forwarding header of the
// middleware's client identity (X-Forwarded-For or Forwarded, see WithForwardedHeader)
// when the peer is a trusted proxy.
//
// It answers 200 with the rate-limit headers when the request may pass; otherwise
// 429 with Retry-After and the problem. It never parks an order and never answers
// another 2xx, whatever body the check carries: both proxies take every 2xx for
// "allowed" and would send the request upstream, so a parked order would be
// delivered twice. Over a defer rule it answers 429 as over a reject rule, the
// problem's detail saying why; a request asking for scheduled delivery
// (Sluice-Not-Before) is refused with 400. Parking through a proxy is for Envoy's
// ext_authz over gRPC, where a denied answer of 202 reaches the client as the
// response (package ingress/envoy). The check's body is never read: a check that
// declares one is answered with Connection: close, so that a body that never comes
// (nginx forwarding Content-Length without the body) delays nothing.
//
// Which fronts can defer: Envoy's ext_authz with the request's body (with_request_body,
// allow_partial_message: false) parks and answers 202 (ingress/envoy); nginx
// auth_request and Traefik ForwardAuth cannot (no body, and any 2xx passes), so their
// deferring routes get 429 here: route those through sluice's own front door. A
// refusal carries its problem again in HeaderProblem, for fronts that keep only the
// check's headers (deploy/nginx/auth_request.conf answers the client with it).
//
// It is meant for the proxies only: serve it on a listener clients cannot reach.
func (m *Middleware) CheckHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength != 0 {
			// Go's server would otherwise read the rest of the body before answering.
			w.Header().Set("Connection", "close")
		}
		pw := &problemHeaderWriter{w: w, status: http.StatusOK}
		defer pw.flush()
		orig, err := originalRequest(r)
		if err != nil {
			writeProblem(pw, simpleProblem(http.StatusBadRequest, err.Error()))
			return
		}
		if m.Authorize(pw, orig, forwardAuthNoPark) {
			pw.WriteHeader(http.StatusOK)
		}
	})
}

// HeaderProblem carries, on the check endpoint's refusals, the problem of the body
// (compact JSON, one line): nginx's auth_request keeps no body of the check but may
// keep its headers (auth_request_set), so the front can answer the client with
// sluice's own problem (see deploy/nginx/auth_request.conf).
const HeaderProblem = "Sluice-Problem"

// maxProblemHeader is the longest problem HeaderProblem carries (proxies keep a
// response's headers in a buffer of a few KiB: nginx's proxy_buffer_size is 4 or 8).
const maxProblemHeader = 2048

// problemHeaderWriter holds a check's answer until the handler is done, to copy a
// problem body into HeaderProblem before the headers go.
type problemHeaderWriter struct {
	w      http.ResponseWriter
	status int
	body   []byte
}

func (p *problemHeaderWriter) Header() http.Header    { return p.w.Header() }
func (p *problemHeaderWriter) WriteHeader(status int) { p.status = status }
func (p *problemHeaderWriter) Write(b []byte) (int, error) {
	p.body = append(p.body, b...)
	return len(b), nil
}

func (p *problemHeaderWriter) flush() {
	h := p.w.Header()
	if v := bytes.TrimSpace(p.body); p.status >= 400 && len(v) <= maxProblemHeader &&
		h.Get("Content-Type") == "application/problem+json" && httpguts.ValidHeaderFieldValue(string(v)) {
		h.Set(HeaderProblem, string(v))
	}
	p.w.WriteHeader(p.status)
	_, _ = p.w.Write(p.body)
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

// ErrPathNotNormal is returned by CheckNormalPath.
var ErrPathNotNormal = errors.New("the path is not in normal form")

// CheckNormalPath returns an error wrapping ErrPathNotNormal, which names what is
// wrong, when the escaped path p is not in the normal form RFC 3986 section 6.2.2
// gives it, slashes merged: an empty segment (`//`), a `.` or `..` segment, also
// written with encoded dots (%2E), a percent-encoded slash or backslash (%2F, %5C,
// either case), or a backslash. A proxy that checks such a path and then routes or
// forwards it as sent would disagree with sluice, which matches the cleaned path:
// `/v1/orders/../../admin` would be counted as /admin while the proxy's routes and the
// upstream see the original. A trailing slash is normal; so is an encoded dot within
// a segment (`/a%2Eb`).
func CheckNormalPath(p string) error {
	for i := 0; i < len(p); i++ {
		if p[i] == '\\' {
			return fmt.Errorf("%w: a backslash", ErrPathNotNormal)
		}
		if p[i] == '%' && i+2 < len(p) {
			switch code := p[i+1 : i+3]; {
			case strings.EqualFold(code, "2F"):
				return fmt.Errorf("%w: %s, an encoded slash", ErrPathNotNormal, p[i:i+3])
			case strings.EqualFold(code, "5C"):
				return fmt.Errorf("%w: %s, an encoded backslash", ErrPathNotNormal, p[i:i+3])
			}
		}
	}
	rest := strings.TrimPrefix(p, "/")
	for rest != "" {
		seg, tail, more := strings.Cut(rest, "/")
		if strings.IndexByte(seg, '%') >= 0 {
			seg = strings.ReplaceAll(strings.ToLower(seg), "%2e", ".")
		}
		switch {
		case seg == "" && more:
			return fmt.Errorf("%w: an empty segment (//)", ErrPathNotNormal)
		case seg == "." || seg == "..":
			return fmt.Errorf("%w: a %q segment", ErrPathNotNormal, seg)
		}
		rest = tail
	}
	return nil
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
