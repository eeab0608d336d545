package rules

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// ErrExplainRequest is wrapped by NewExplainRequest's errors.
var ErrExplainRequest = errors.New("bad request to explain")

// NewExplainRequest builds the request that Set.Explain is asked about, from what an
// operator typed: a method, a target (path and query, starting with /), headers as
// "Name: value" (Host sets the host) and the client's IP address ("" for none, then
// addr is the zero Addr). Bad input returns an error wrapping ErrExplainRequest.
func NewExplainRequest(ctx context.Context, method, target string, headers []string, ip string) (r *http.Request, addr netip.Addr, err error) {
	m := strings.ToUpper(method)
	if m == "" || strings.ContainsAny(m, " \t/:") {
		return nil, addr, fmt.Errorf("%w: %q is not an HTTP method", ErrExplainRequest, method)
	}
	if !strings.HasPrefix(target, "/") {
		return nil, addr, fmt.Errorf("%w: PATH must start with /, got %q", ErrExplainRequest, target)
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, addr, fmt.Errorf("%w: invalid PATH %q", ErrExplainRequest, target)
	}
	if r, err = http.NewRequestWithContext(ctx, m, "http://localhost", nil); err != nil {
		return nil, addr, fmt.Errorf("%w: %w", ErrExplainRequest, err)
	}
	r.URL = u
	r.RequestURI = target
	r.Host = ""
	for _, h := range headers {
		name, value, ok := strings.Cut(h, ":")
		name, value = strings.TrimSpace(name), strings.TrimSpace(value)
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, addr, fmt.Errorf("%w: header %q: want 'Name: value'", ErrExplainRequest, h)
		}
		if strings.EqualFold(name, "Host") {
			r.Host = value
			continue
		}
		r.Header.Add(name, value)
	}
	if ip != "" {
		if addr, err = netip.ParseAddr(ip); err != nil {
			return nil, addr, fmt.Errorf("%w: %q is not an IP address", ErrExplainRequest, ip)
		}
	}
	return r, addr, nil
}
