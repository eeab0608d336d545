package deploy_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

const dashboardPath = "grafana/sluice-dashboard.json"

// grafanaVarRE finds $name, ${name} and ${name:format} in a query.
var grafanaVarRE = regexp.MustCompile(`\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(?::[^}]*)?\}|([A-Za-z_][A-Za-z0-9_]*))`)

func loadDashboard(t *testing.T) map[string]any {
	t.Helper()
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d map[string]any
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	return d
}

type dashQuery struct {
	where, expr string
	labels      []string // labels the legend refers to
}

// dashboardQueries returns every PromQL expression of the dashboard: the expr of
// every target of every panel (rows included) and the query of every query variable.
func dashboardQueries(t *testing.T, d map[string]any) []dashQuery {
	t.Helper()
	var out []dashQuery
	var walkPanels func(ps []any)
	walkPanels = func(ps []any) {
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			title, _ := pm["title"].(string)
			if sub, ok := pm["panels"].([]any); ok {
				walkPanels(sub)
			}
			targets, _ := pm["targets"].([]any)
			for i, tg := range targets {
				tm, _ := tg.(map[string]any)
				expr, _ := tm["expr"].(string)
				if expr == "" {
					t.Errorf("panel %q target %d: no expr", title, i)
					continue
				}
				legend, _ := tm["legendFormat"].(string)
				var labels []string
				for _, m := range legendLabelRE.FindAllStringSubmatch(legend, -1) {
					labels = append(labels, m[1])
				}
				out = append(out, dashQuery{where: fmt.Sprintf("panel %q", title), expr: expr, labels: labels})
			}
		}
	}
	panels, _ := d["panels"].([]any)
	walkPanels(panels)
	templating, _ := d["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		vm, _ := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		q := vm["query"]
		if qm, ok := q.(map[string]any); ok {
			q = qm["query"]
		}
		qs, _ := q.(string)
		if qs == "" {
			t.Errorf("variable %v: no query", vm["name"])
			continue
		}
		out = append(out, dashQuery{where: fmt.Sprintf("variable %v", vm["name"]), expr: qs})
	}
	return out
}

// TestDashboard checks the dashboard's structure: a uid and title, unique panel
// ids, a position for every panel, every Prometheus panel and target on the
// datasource variable (so it imports into any Grafana), and every $variable used
// defined. The provisioning of compose loads it from where compose mounts it.
func TestDashboard(t *testing.T) {
	d := loadDashboard(t)
	if d["uid"] == "" || d["title"] == "" {
		t.Errorf("no uid or title")
	}
	defined := map[string]bool{"__rate_interval": true, "__interval": true, "__range": true}
	dsVar := ""
	templating, _ := d["templating"].(map[string]any)
	vars, _ := templating["list"].([]any)
	for _, v := range vars {
		vm, _ := v.(map[string]any)
		name, _ := vm["name"].(string)
		defined[name] = true
		if vm["type"] == "datasource" && vm["query"] == "prometheus" {
			dsVar = name
		}
	}
	if dsVar == "" {
		t.Fatalf("no datasource variable of type prometheus")
	}
	for _, v := range vars {
		vm, _ := v.(map[string]any)
		if vm["type"] != "query" {
			continue
		}
		if dm, _ := vm["datasource"].(map[string]any); dm["uid"] != "${"+dsVar+"}" {
			t.Errorf("variable %v: datasource %v, want uid ${%s}", vm["name"], vm["datasource"], dsVar)
		}
	}
	ids := map[float64]bool{}
	var walk func(ps []any)
	walk = func(ps []any) {
		for _, p := range ps {
			pm, _ := p.(map[string]any)
			title, _ := pm["title"].(string)
			id, _ := pm["id"].(float64)
			if ids[id] {
				t.Errorf("panel %q: duplicate id %v", title, id)
			}
			ids[id] = true
			if _, ok := pm["gridPos"].(map[string]any); !ok {
				t.Errorf("panel %q: no gridPos", title)
			}
			if sub, ok := pm["panels"].([]any); ok {
				walk(sub)
			}
			if pm["type"] == "row" {
				continue
			}
			check := func(where string, ds any) {
				dm, _ := ds.(map[string]any)
				if dm["uid"] != "${"+dsVar+"}" {
					t.Errorf("panel %q %s: datasource %v, want uid ${%s}", title, where, ds, dsVar)
				}
			}
			check("", pm["datasource"])
			targets, _ := pm["targets"].([]any)
			if len(targets) == 0 {
				t.Errorf("panel %q: no queries", title)
			}
			for _, tg := range targets {
				tm, _ := tg.(map[string]any)
				check("target "+fmt.Sprint(tm["refId"]), tm["datasource"])
			}
		}
	}
	panels, _ := d["panels"].([]any)
	walk(panels)
	for _, q := range dashboardQueries(t, d) {
		for _, m := range grafanaVarRE.FindAllStringSubmatch(q.expr, -1) {
			name := m[1] + m[2]
			if !defined[name] {
				t.Errorf("%s: $%s is not a variable of the dashboard", q.where, name)
			}
		}
	}

	// Grafana's provisioning (compose mounts deploy/grafana/provisioning) loads the
	// dashboard from the directory where compose mounts the file.
	var provider struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	decodeYAMLInto(t, "grafana/provisioning/dashboards/sluice.yaml", &provider)
	if len(provider.Providers) != 1 || provider.Providers[0].Type != "file" {
		t.Fatalf("dashboard provisioning: want one file provider")
	}
	c := loadCompose(t)
	g, ok := c.Services["grafana"]
	if !ok {
		t.Fatal("compose: no grafana service")
	}
	target := ""
	for _, v := range g.Volumes {
		m := parseMount(v)
		if filepath.Clean(filepath.Join(composeDir, m.source)) == filepath.Clean(dashboardPath) {
			target = m.target
		}
	}
	if filepath.Dir(target) != filepath.Clean(provider.Providers[0].Options.Path) {
		t.Errorf("compose mounts the dashboard at %q, but Grafana loads dashboards from %q", target, provider.Providers[0].Options.Path)
	}
	var ds struct {
		Datasources []struct {
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	decodeYAMLInto(t, "grafana/provisioning/datasources/prometheus.yaml", &ds)
	if len(ds.Datasources) == 0 || ds.Datasources[0].Type != "prometheus" {
		t.Fatalf("datasource provisioning: want a prometheus datasource")
	}
	if !strings.HasPrefix(ds.Datasources[0].URL, "http://prometheus:9090") {
		t.Errorf("datasource %s: want the compose prometheus service (http://prometheus:9090)", ds.Datasources[0].URL)
	}
}
