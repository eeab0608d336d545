package ingress

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

func TestParseOriginForm(t *testing.T) {
	for _, tc := range []struct {
		in, path, query string
		ok              bool
	}{
		{"/v1/orders?x=1", "/v1/orders", "x=1", true},
		{"//evil.example/v1/pay", "//evil.example/v1/pay", "", true}, // a path, not a host
		{"/a%2Fb", "/a/b", "", true},
		{"http://evil.example/v1/pay", "", "", false},
		{"v1/orders", "", "", false},
		{"/a b", "", "", false},
		{"/a#frag", "", "", false},
		{"", "", "", false},
	} {
		u, err := ParseOriginForm(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("%q: %v", tc.in, err)
			continue
		}
		if tc.ok && (u.Path != tc.path || u.RawQuery != tc.query || u.Host != "") {
			t.Errorf("%q: path %q query %q host %q", tc.in, u.Path, u.RawQuery, u.Host)
		}
	}
}

func TestCheckNormalPath(t *testing.T) {
	for p, bad := range map[string]string{
		"/":                       "",
		"/v1/orders":              "",
		"/v1/orders/":             "",
		"/v1/orders/7/lines":      "",
		"/a%2Eb":                  "", // an encoded dot inside a segment names no other path
		"/a..b/c.d":               "",
		"/%41":                    "",
		"/v1/orders/../../admin":  `".."`,
		"/v1/./orders":            `"."`,
		"/v1/orders/..":           `".."`,
		"/v1/orders/.":            `"."`,
		"/..":                     `".."`,
		"//admin":                 "//",
		"/v1//orders":             "//",
		"/v1/orders//":            "//",
		"/v1/%2e%2e/admin":        `".."`,
		"/v1/.%2E/admin":          `".."`,
		"/v1/%2E/admin":           `"."`,
		"/v1/orders%2F..%2Fadmin": "encoded slash",
		"/v1/orders%2f7":          "encoded slash",
		"/v1/orders%5c..":         "encoded backslash",
		"/v1/orders\\..\\admin":   "backslash",
	} {
		err := CheckNormalPath(p)
		switch {
		case bad == "" && err != nil:
			t.Errorf("%q: %v, want nil", p, err)
		case bad != "" && (!errors.Is(err, ErrPathNotNormal) || !strings.Contains(err.Error(), bad)):
			t.Errorf("%q: %v, want ErrPathNotNormal naming %s", p, err, bad)
		}
	}
}

// FuzzCheckNormalPath: a path CheckNormalPath accepts is one that cleaning leaves as
// it is (but for a trailing slash), so the route sluice matches is the one for the
// path the proxy forwards.
func FuzzCheckNormalPath(f *testing.F) {
	for _, p := range []string{"/", "/v1/orders", "/v1/orders/../../admin", "//x", "/a%2Fb", "/%2e%2E", "/a/./b/", "/a\\b"} {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, p string) {
		u, err := ParseOriginForm(p)
		if err != nil || CheckNormalPath(u.EscapedPath()) != nil {
			return
		}
		got := strings.TrimSuffix(u.Path, "/")
		if clean := path.Clean(u.Path); clean != got && !(clean == "/" && got == "") {
			t.Errorf("%q (path %q) passes, but cleans to %q", p, u.Path, clean)
		}
	})
}

// TestCheckRefusesPathsNotInNormalForm: the HTTP check decided on the cleaned path
// (/v1/orders/../../admin as /admin) while the proxy routes and forwards the path it
// holds; a path not in normal form is refused with a 400 problem saying why.
func TestCheckRefusesPathsNotInNormalForm(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	h := mustNew(t, StaticRules{set}, limiter.NewMemory()).CheckHandler()
	for uri, want := range map[string]int{
		"/v1/orders/../../admin": http.StatusBadRequest,
		"/v1//orders":            http.StatusBadRequest,
		"/v1/%2e%2e/admin":       http.StatusBadRequest,
		"/v1/orders%2F7":         http.StatusBadRequest,
		"/admin":                 http.StatusOK,
		"/v1/orders?a=../..":     http.StatusOK, // the query is no path
	} {
		r := httptest.NewRequest("GET", CheckPath, nil)
		r.Header.Set("X-Forwarded-Method", "POST")
		r.Header.Set("X-Forwarded-Uri", uri)
		r.Header.Set("X-User-ID", "alice")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want {
			t.Errorf("%s: %d %s, want %d", uri, w.Code, w.Body, want)
			continue
		}
		if want == http.StatusBadRequest && (w.Header().Get("Content-Type") != "application/problem+json" ||
			!strings.Contains(w.Body.String(), "not in normal form") || !strings.Contains(w.Body.String(), "normalize_path")) {
			t.Errorf("%s: %v %s, want a problem saying why", uri, w.Header(), w.Body)
		}
	}
}
