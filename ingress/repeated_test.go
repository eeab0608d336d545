package ingress

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/rules"
)

// TestRepeatedLimitKeyIs400 sends a random X-User-ID and then the victim's: counted on
// the first one, the client would never be limited while the upstream may serve the
// victim. Wrap and CheckHandler refuse it, naming the header, and the upstream never
// sees it.
func TestRepeatedLimitKeyIs400(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	m := mustNew(t, StaticRules{set}, limiter.NewMemory())
	reached := 0
	front := m.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { reached++ }))
	check := m.CheckHandler()
	tests := []struct {
		name    string
		values  []string
		wantDet string // "" for allowed
	}{
		{"one value", []string{"alice"}, ""},
		{"random then victim", []string{"r4nd0m", "alice"}, "header X-User-Id is sent more than once"},
		{"empty then victim", []string{"", "alice"}, "header X-User-Id is sent more than once"},
		{"a list", []string{"r4nd0m, alice"}, "header X-User-Id holds a comma-separated list"},
	}
	for _, tc := range tests {
		for _, via := range []string{"front door", "check"} {
			t.Run(tc.name+"/"+via, func(t *testing.T) {
				var r *http.Request
				h := front
				if via == "check" {
					h = check
					r = httptest.NewRequest("GET", CheckPath, nil)
					r.Header.Set("X-Forwarded-Method", "POST")
					r.Header.Set("X-Forwarded-Uri", "/v1/orders")
				} else {
					r = httptest.NewRequest("POST", "/v1/orders", strings.NewReader("{}"))
				}
				for _, v := range tc.values {
					r.Header.Add("X-User-ID", v)
				}
				before := reached
				w := httptest.NewRecorder()
				h.ServeHTTP(w, r)
				if tc.wantDet == "" {
					if w.Code != http.StatusOK {
						t.Fatalf("status %d, want 200: %s", w.Code, w.Body)
					}
					return
				}
				if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" {
					t.Fatalf("status %d %q, want a 400 problem", w.Code, w.Header().Get("Content-Type"))
				}
				var p problem
				if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(p.Detail, tc.wantDet) {
					t.Errorf("detail %q, want it to say %q", p.Detail, tc.wantDet)
				}
				if reached != before {
					t.Error("the refused request reached the upstream")
				}
			})
		}
	}
}
