package ingress

import (
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAdminBearerScheme: the authentication scheme of Authorization is
// case-insensitive (RFC 9110 section 11.1) and RFC 6750 allows one or more spaces
// before the token, so "bearer TOKEN" is the token, not a wrong guess that counts
// towards the address's lockout. A wrong scheme or token is still refused.
func TestAdminBearerScheme(t *testing.T) {
	const token = "an-admin-token-of-32-characters!"
	a := &Admin{Gatherer: prometheus.NewRegistry(), Token: token}
	h := a.Handler()
	for _, tc := range []struct {
		authorization string
		want          int
	}{
		{"Bearer " + token, 200},
		{"bearer " + token, 200},
		{"BEARER " + token, 200},
		{"Bearer  " + token, 200},
		{"Basic " + token, 401},
		{"Bearer" + token, 401},
		{"bearer wrong", 401},
		{token, 401},
	} {
		r := httptest.NewRequest("GET", "/metrics", nil)
		r.RemoteAddr = "192.0.2.1:1000"
		r.Header.Set("Authorization", tc.authorization)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tc.want {
			t.Errorf("Authorization %q: %d, want %d", tc.authorization, w.Code, tc.want)
		}
	}
}
