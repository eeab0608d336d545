package envoy

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	rpcstatus "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/ingress"
)

// AuthService implements envoy.service.auth.v3.Authorization with the front door's
// middleware: the request Envoy describes is matched to a route and decided as if it
// had come through the front door. Create it with NewAuthService.
type AuthService struct {
	authv3.UnimplementedAuthorizationServer
	mw *ingress.Middleware
}

// NewAuthService returns an authorization service deciding with mw. mw's client
// identity applies: the client is Envoy's source address, or the address that the
// identity's forwarding header (X-Forwarded-For, or Forwarded: see
// ingress.WithForwardedHeader) names when the source is a trusted proxy. mw's deferrer
// parks orders of defer rules when the check carries the body.
func NewAuthService(mw *ingress.Middleware) *AuthService { return &AuthService{mw: mw} }

// maxResponseBody caps what a denied response may carry back (a problem or a ticket).
const maxResponseBody = 64 << 10

// Check implements the authorization service: OK with the rate-limit headers to add
// to the response; otherwise denied with the front door's response: 429 with the
// problem, or 202 with the ticket of the order a defer rule parked.
func (a *AuthService) Check(ctx context.Context, req *authv3.CheckRequest) (*authv3.CheckResponse, error) {
	r, missing, err := httpRequest(ctx, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	w := &recorder{header: http.Header{}}
	if a.mw.Authorize(w, r, missing) {
		return &authv3.CheckResponse{
			Status: &rpcstatus.Status{Code: int32(codes.OK)},
			HttpResponse: &authv3.CheckResponse_OkResponse{OkResponse: &authv3.OkHttpResponse{
				ResponseHeadersToAdd: headerOptions(w.header)}},
		}, nil
	}
	code := w.code
	if code == 0 {
		code = http.StatusOK
	}
	return &authv3.CheckResponse{
		Status: &rpcstatus.Status{Code: int32(codes.PermissionDenied)},
		HttpResponse: &authv3.CheckResponse_DeniedResponse{DeniedResponse: &authv3.DeniedHttpResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(code)},
			Headers: headerOptions(w.header),
			Body:    w.body.String(),
		}},
	}, nil
}

type checkError string

func (e checkError) Error() string { return string(e) }

// httpRequest rebuilds the request of an ext_authz check, and says why its body is
// missing ("" when it is there: not empty and whole, or declared empty).
func httpRequest(ctx context.Context, req *authv3.CheckRequest) (*http.Request, string, error) {
	h := req.GetAttributes().GetRequest().GetHttp()
	if h == nil {
		return nil, "", checkError("the check has no attributes.request.http")
	}
	u, err := ingress.ParseOriginForm(h.Path)
	if err != nil {
		return nil, "", checkError("attributes.request.http.path: " + err.Error())
	}
	body := h.RawBody
	if len(body) == 0 {
		body = []byte(h.Body)
	}
	r, err := http.NewRequestWithContext(ctx, h.Method, "/", bytes.NewReader(body))
	if err != nil {
		return nil, "", checkError("attributes.request.http.method: not an HTTP method")
	}
	r.URL, r.RequestURI = u, h.Path
	r.Host = h.Host
	switch {
	case len(h.Headers) > 0:
		for k, v := range h.Headers {
			addHeader(r.Header, k, v)
		}
	case h.GetHeaderMap() != nil:
		for _, hv := range h.GetHeaderMap().GetHeaders() {
			v := hv.Value
			if v == "" {
				v = string(hv.RawValue)
			}
			addHeader(r.Header, hv.Key, v)
		}
	}
	if r.Host == "" {
		r.Host = r.Header.Get("Host")
	}
	if sa := req.GetAttributes().GetSource().GetAddress().GetSocketAddress(); sa != nil {
		r.RemoteAddr = net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
	}
	r.ContentLength = int64(len(body))
	return r, bodyMissing(r.Header, len(body)), nil
}

// addHeader adds one header of Envoy's list; pseudo-headers (:path…) are not headers.
func addHeader(h http.Header, k, v string) {
	if k == "" || k[0] == ':' {
		return
	}
	h.Add(k, v)
}

// bodyMissing says why a check's body of n bytes is not the request's whole body.
func bodyMissing(h http.Header, n int) string {
	if strings.EqualFold(h.Get("X-Envoy-Auth-Partial-Body"), "true") {
		return "the check carried only the start of the request's body (Envoy's max_request_bytes), so the order could not be parked."
	}
	declared := int64(-1)
	if v := h.Get("Content-Length"); v != "" {
		d, err := strconv.ParseInt(v, 10, 64)
		if err != nil || d < 0 {
			return "the request's Content-Length is not a number, so the order could not be parked."
		}
		declared = d
	}
	switch {
	case declared >= 0 && declared != int64(n):
		if n == 0 {
			return ingress.BodyNotForwarded
		}
		return "the check's body is not as long as the request's Content-Length, so the order could not be parked."
	case n == 0 && declared != 0:
		return ingress.BodyNotForwarded
	}
	return ""
}

// headerOptions turns h into Envoy's header options, each replacing the header of the
// same name.
func headerOptions(h http.Header) []*corev3.HeaderValueOption {
	var out []*corev3.HeaderValueOption
	for _, hv := range headerValues(h) {
		out = append(out, &corev3.HeaderValueOption{Header: hv,
			AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD})
	}
	return out
}

// recorder keeps what the middleware answers a check.
type recorder struct {
	header http.Header
	code   int
	body   bytes.Buffer
}

func (w *recorder) Header() http.Header { return w.header }

func (w *recorder) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
}

func (w *recorder) Write(b []byte) (int, error) {
	w.WriteHeader(http.StatusOK)
	room := maxResponseBody - w.body.Len()
	if room > 0 {
		w.body.Write(b[:min(len(b), room)])
	}
	return len(b), nil
}
