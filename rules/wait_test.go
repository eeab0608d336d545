package rules

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

const waitHead = "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 4}\n"

func TestWaitRuleLoads(t *testing.T) {
	s := mustParse(t, waitHead+"    on_limit: wait\n    max_wait: 2s\n    max_waiting: 50\n    then: defer\n    queue: orders\n"+queueYAML)
	r := s.Rules()[0]
	if r.OnLimit != Wait || r.MaxWait != 2*time.Second || r.MaxWaiting != 50 || r.Then != Defer || r.Queue == nil {
		t.Fatalf("rule %+v", r)
	}
	if p := r.Pace(); p != (limiter.Pace{Interval: 250 * time.Millisecond, MaxWait: 2 * time.Second, FailureMode: limiter.FailLocal}) {
		t.Fatalf("pace %+v", p)
	}
	r = mustParse(t, waitHead+"    on_limit: wait\n    max_wait: 500ms\n").Rules()[0]
	if r.Then != Reject || r.MaxWaiting != DefaultMaxWaiting || r.Queue != nil {
		t.Fatalf("defaults: %+v", r)
	}
}

func TestWaitRuleProblems(t *testing.T) {
	tests := []struct {
		name, src string
		want      []string
	}{
		{"no max_wait", waitHead + "    on_limit: wait\n", []string{"t.yaml:5:15: on_limit: wait needs max_wait"}},
		{"zero max_wait", waitHead + "    on_limit: wait\n    max_wait: 0s\n", []string{"t.yaml:6:15: max_wait must be positive"}},
		{"negative max_wait", waitHead + "    on_limit: wait\n    max_wait: -1s\n", []string{"t.yaml:6:15: max_wait must be positive"}},
		{"bad then", waitHead + "    on_limit: wait\n    max_wait: 1s\n    then: wait\n", []string{`t.yaml:7:11: then must be defer or reject, got "wait"`}},
		{"then defer without queue", waitHead + "    on_limit: wait\n    max_wait: 1s\n    then: defer\n", []string{"t.yaml:7:11: then: defer needs a queue"}},
		{"max_waiting zero", waitHead + "    on_limit: wait\n    max_wait: 1s\n    max_waiting: 0\n", []string{"t.yaml:7:18: max_waiting must be at least 1"}},
		{"max_wait without wait", waitHead + "    max_wait: 1s\n", []string{"t.yaml:5:5: max_wait is used only with on_limit: wait"}},
		{"then without wait", waitHead + "    on_limit: reject\n    then: reject\n", []string{"t.yaml:6:5: then is used only with on_limit: wait"}},
		{"burst", waitHead + "    on_limit: wait\n    max_wait: 1s\n    algorithm: token_bucket\n    burst: 3\n", []string{"t.yaml:5:15: burst has no effect with on_limit: wait"}},
		{"two limits", "domain: d\ndescriptors:\n  - key: a\n    rate_limits:\n      - {unit: second, requests_per_unit: 4}\n      - {unit: minute, requests_per_unit: 100}\n    on_limit: wait\n    max_wait: 1s\n",
			[]string{"t.yaml:7:15: on_limit: wait paces at one rate: give one limit, not 2"}},
		{"max_wait too long", waitHead + "    on_limit: wait\n    max_wait: 1m\n", []string{"t.yaml:6:15: max_wait must be at most 30s"}},
		{"quota mode", waitHead + "    on_limit: wait\n    max_wait: 1s\n    quota_mode: true\n", []string{"t.yaml:5:15: on_limit: wait with quota_mode"}},
		{"unknown on_limit", waitHead + "    on_limit: hold\n", []string{`t.yaml:5:15: on_limit must be reject, defer or wait, got "hold"`}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := problems(t, tc.src)
			for _, w := range tc.want {
				found := false
				for _, g := range got {
					found = found || strings.HasPrefix(g, w[:strings.Index(w, ": ")+2]) && strings.Contains(g, w[strings.Index(w, ": ")+2:])
				}
				if !found {
					t.Errorf("want %q among\n%s", w, strings.Join(got, "\n"))
				}
			}
		})
	}
}
