package ingress

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/rules"
)

func TestAdmin(t *testing.T) {
	set, err := rules.Parse(rules.File{Name: "shop.yaml", Data: []byte(testRules)})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := decide.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	redisUp := true
	a := &Admin{Gatherer: reg, Rules: StaticRules{set}, Token: "s3cret",
		Ready: map[string]func(context.Context) error{"redis": func(context.Context) error {
			if redisUp {
				return nil
			}
			return errors.New("connection refused")
		}}}
	h := a.Handler()
	get := func(path, token string) *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", path, nil)
		if token != "" {
			r.Header.Set("Authorization", "Bearer "+token)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	cases := []struct {
		path, token string
		want        int
		contains    string
	}{
		{"/healthz", "", 200, "ok"},
		{"/metrics", "", 401, ""},
		{"/metrics", "wrong", 401, ""},
		{"/readyz", "", 401, ""},
		{"/sluice/v1/rules", "", 401, ""},
		{"/metrics", "s3cret", 200, "sluice_decision_duration_seconds"},
		{"/readyz", "s3cret", 200, `"ready":true`},
		{"/sluice/v1/rules", "s3cret", 200, `"orders_per_user"`},
	}
	for _, tc := range cases {
		w := get(tc.path, tc.token)
		if w.Code != tc.want || !strings.Contains(w.Body.String(), tc.contains) {
			t.Errorf("GET %s (token %q): %d %q, want %d containing %q", tc.path, tc.token, w.Code, w.Body, tc.want, tc.contains)
		}
	}
	var view rulesView
	if err := json.Unmarshal(get("/sluice/v1/rules", "s3cret").Body.Bytes(), &view); err != nil {
		t.Fatal(err)
	}
	if len(view.Routes) != 3 || len(view.Rules) != 4 || view.Version != set.Version() {
		t.Errorf("rules view: %d routes, %d rules, version %q", len(view.Routes), len(view.Rules), view.Version)
	}
	redisUp = false
	if w := get("/readyz", "s3cret"); w.Code != 503 || !strings.Contains(w.Body.String(), "connection refused") {
		t.Errorf("readyz with Redis down: %d %s", w.Code, w.Body)
	}
}
