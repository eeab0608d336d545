package deploy_test

import (
	"cmp"
	"fmt"
	"net"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/deferral"
	"github.com/sluicehq/sluice/rules"
)

const envoyDir = "envoy"

// at walks a decoded YAML value: string steps index maps, int steps index lists; nil
// when something on the way is missing.
func at(v any, path ...any) any {
	for _, p := range path {
		switch k := p.(type) {
		case string:
			m, ok := v.(map[string]any)
			if !ok {
				return nil
			}
			v = m[k]
		case int:
			l, ok := v.([]any)
			if !ok || k >= len(l) {
				return nil
			}
			v = l[k]
		}
	}
	return v
}

func list(v any) []any { l, _ := v.([]any); return l }

func str(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case int:
		return strconv.Itoa(x)
	}
	return ""
}

// walk calls f on every map inside v.
func walk(v any, f func(map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		f(x)
		for _, c := range x {
			walk(c, f)
		}
	case []any:
		for _, c := range x {
			walk(c, f)
		}
	}
}

// descriptorsOf turns the rate_limits actions of an Envoy route into the descriptors
// Envoy sends, with sample values for what comes from the request.
func descriptorsOf(t *testing.T, rateLimits []any) [][]rules.Entry {
	t.Helper()
	var out [][]rules.Entry
	for _, rl := range rateLimits {
		var d []rules.Entry
		for _, a := range list(at(rl, "actions")) {
			switch {
			case at(a, "remote_address") != nil:
				d = append(d, rules.Entry{Key: "remote_address", Value: "192.0.2.10"})
			case at(a, "generic_key") != nil:
				key := cmp.Or(str(at(a, "generic_key", "descriptor_key")), "generic_key")
				d = append(d, rules.Entry{Key: key, Value: str(at(a, "generic_key", "descriptor_value"))})
			case at(a, "header_value_match") != nil:
				key := cmp.Or(str(at(a, "header_value_match", "descriptor_key")), "header_match")
				d = append(d, rules.Entry{Key: key, Value: str(at(a, "header_value_match", "descriptor_value"))})
			case at(a, "request_headers") != nil:
				value := "user-7"
				if str(at(a, "request_headers", "header_name")) == ":path" {
					value = "/api/search"
				}
				d = append(d, rules.Entry{Key: str(at(a, "request_headers", "descriptor_key")), Value: value})
			default:
				t.Errorf("rate limit action %v: the test does not know it", a)
			}
		}
		out = append(out, d)
	}
	return out
}

// checkDescriptors checks that every descriptor reaches a rule of domain in set.
func checkDescriptors(t *testing.T, where string, set *rules.Set, domain string, descs [][]rules.Entry) {
	t.Helper()
	if !slices.Contains(set.Domains(), domain) {
		t.Fatalf("%s: domain %q is in no rules file (have %v)", where, domain, set.Domains())
	}
	if len(descs) == 0 {
		t.Fatalf("%s: no rate_limits actions", where)
	}
	for _, d := range descs {
		if cs := set.Evaluate(domain, [][]rules.Entry{d}, nil); len(cs) == 0 {
			t.Errorf("%s: descriptor %v reaches no rule of domain %s", where, d, domain)
		}
	}
}

// checkDefers checks that POST path is matched by a route of set whose rule defers.
func checkDefers(t *testing.T, where string, set *rules.Set, path string) {
	t.Helper()
	r := httptest.NewRequest("POST", path, nil)
	r.Header.Set("X-User-ID", "42")
	route, checks := set.Match(r, netip.MustParseAddr("192.0.2.10"), nil)
	if route == nil || !slices.ContainsFunc(checks, func(c rules.Check) bool { return c.Rule.OnLimit == rules.Defer }) {
		name := "none"
		if route != nil {
			name = route.Name
		}
		t.Errorf("%s: POST %s reaches no defer rule (route %s)", where, path, name)
	}
}

// flagPort returns the port of --NAME=HOST:PORT in args.
func flagPort(args []any, name string) string {
	for _, a := range args {
		if v, ok := strings.CutPrefix(str(a), "--"+name+"="); ok {
			_, port, err := net.SplitHostPort(v)
			if err == nil {
				return port
			}
		}
	}
	return ""
}

func TestEnvoyBootstrap(t *testing.T) {
	docs := readYAMLDocs(t, filepath.Join(envoyDir, "envoy.yaml"))
	compose := readYAMLDocs(t, filepath.Join(envoyDir, "compose.yaml"))[0]
	set, err := rules.Load(filepath.Join(envoyDir, "rules"))
	if err != nil {
		t.Fatal(err)
	}
	boot := docs[0]

	// Clusters: where each points, against what compose runs there.
	clusters := map[string]string{}
	for _, c := range list(at(boot, "static_resources", "clusters")) {
		sa := at(c, "load_assignment", "endpoints", 0, "lb_endpoints", 0, "endpoint", "address", "socket_address")
		clusters[str(at(c, "name"))] = net.JoinHostPort(str(at(sa, "address")), str(at(sa, "port_value")))
	}
	sluiceArgs := list(at(compose, "services", "sluice", "command"))
	if slices.Index(sluiceArgs, any("serve")) != 0 {
		t.Fatalf("compose's sluice runs %v, want serve (ext_authz parks orders)", sluiceArgs)
	}
	want := map[string]string{
		"sluice_grpc":  net.JoinHostPort("sluice", flagPort(sluiceArgs, "grpc-listen")),
		"sluice_check": net.JoinHostPort("sluice", flagPort(sluiceArgs, "check-listen")),
		"orders_api":   net.JoinHostPort("orders-api", "8080"),
	}
	for name, addr := range want {
		if clusters[name] != addr {
			t.Errorf("cluster %s points at %q, want %q (compose.yaml)", name, clusters[name], addr)
		}
	}
	if got := str(at(compose, "services", "orders-api", "command", 1)); got != "0.0.0.0:8080" {
		t.Errorf("compose's orders-api listens on %q", got)
	}
	if !strings.Contains(fmt.Sprint(at(compose, "services", "sluice", "volumes")), "./rules:/etc/sluice/rules") ||
		!slices.Contains(sluiceArgs, any("--rules=/etc/sluice/rules")) {
		t.Error("compose's sluice does not load deploy/envoy/rules")
	}

	// Paths are normalised before routing and ext_authz: sluice refuses the others.
	hcm := at(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config")
	if at(hcm, "normalize_path") != true || at(hcm, "merge_slashes") != true ||
		at(hcm, "path_with_escaped_slashes_action") != "REJECT_REQUEST" {
		t.Errorf("the http_connection_manager does not normalise paths (normalize_path %v, merge_slashes %v, path_with_escaped_slashes_action %v)",
			at(hcm, "normalize_path"), at(hcm, "merge_slashes"), at(hcm, "path_with_escaped_slashes_action"))
	}

	// Every cluster named anywhere exists.
	var filters []map[string]any
	walk(boot, func(m map[string]any) {
		for _, k := range []string{"cluster_name", "cluster"} {
			if name, ok := m[k].(string); ok {
				if _, ok := clusters[name]; !ok {
					t.Errorf("%s %q is not a cluster", k, name)
				}
			}
		}
		if n, ok := m["name"].(string); ok && strings.HasPrefix(n, "envoy.filters.http.") {
			filters = append(filters, m)
		}
	})
	var sawRLS, sawAuthz bool
	for _, f := range filters {
		switch f["name"] {
		case "envoy.filters.http.ratelimit":
			sawRLS = true
			if at(f, "typed_config", "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name") != "sluice_grpc" ||
				at(f, "typed_config", "rate_limit_service", "transport_api_version") != "V3" {
				t.Errorf("rate limit filter: %v", f)
			}
			domain := str(at(f, "typed_config", "domain"))
			walk(boot, func(m map[string]any) {
				if rls, ok := m["rate_limits"].([]any); ok {
					checkDescriptors(t, "envoy.yaml", set, domain, descriptorsOf(t, rls))
				}
			})
		case "envoy.filters.http.ext_authz":
			sawAuthz = true
			tc := at(f, "typed_config")
			if at(tc, "grpc_service", "envoy_grpc", "cluster_name") != "sluice_grpc" || at(tc, "transport_api_version") != "V3" {
				t.Errorf("ext_authz filter: %v", f)
			}
			if at(tc, "with_request_body", "allow_partial_message") != false {
				t.Error("ext_authz must not send partial bodies: sluice cannot park them")
			}
			if n, _ := at(tc, "with_request_body", "max_request_bytes").(int); n <= 0 || n > ingress.DefaultMaxBody {
				t.Errorf("ext_authz max_request_bytes %d: want 1 to sluice's --max-body", n)
			}
		}
	}
	if !sawRLS || !sawAuthz {
		t.Fatalf("envoy.yaml: rate limit filter %v, ext_authz filter %v", sawRLS, sawAuthz)
	}
	// The route ext_authz sees orders on defers them in the rules.
	var authzPaths []string
	for _, r := range list(at(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "route_config", "virtual_hosts", 0, "routes")) {
		if at(r, "typed_per_filter_config", "envoy.filters.http.ext_authz", "disabled") != true {
			authzPaths = append(authzPaths, str(at(r, "match", "path")))
		}
	}
	if len(authzPaths) != 1 || authzPaths[0] == "" {
		t.Fatalf("routes under ext_authz: %v", authzPaths)
	}
	checkDefers(t, "envoy.yaml", set, authzPaths[0])
	if !strings.HasPrefix(deferral.Path, str(at(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "route_config", "virtual_hosts", 0, "routes", 0, "match", "prefix"))) {
		t.Error("the first route does not send the tickets to sluice_check")
	}
}

func TestEnvoyKubernetes(t *testing.T) {
	dir := filepath.Join(envoyDir, "kubernetes")
	kust := readYAMLDocs(t, filepath.Join(dir, "kustomization.yaml"))[0]
	if !slices.Contains(list(at(kust, "resources")), any("../../kubernetes")) {
		t.Fatal("the overlay does not build on deploy/kubernetes")
	}
	// The patch adds --grpc-listen and a port named grpc to the sluice container.
	patch, err := decodeYAMLDocs([]byte(str(at(kust, "patches", 0, "patch"))))
	if err != nil {
		t.Fatal(err)
	}
	var args []any
	var portName string
	var containerPort int
	for _, op := range list(patch[0]) {
		switch at(op, "path") {
		case "/spec/template/spec/containers/0/args/-":
			args = append(args, at(op, "value"))
		case "/spec/template/spec/containers/0/ports/-":
			portName, containerPort = str(at(op, "value", "name")), at(op, "value", "containerPort").(int)
		}
	}
	listenPort := flagPort(args, "grpc-listen")
	if listenPort == "" || listenPort != strconv.Itoa(containerPort) {
		t.Fatalf("patch: --grpc-listen port %q, containerPort %d", listenPort, containerPort)
	}
	var base map[string]any
	for _, d := range readYAMLDocs(t, filepath.Join(k8sDir, "sluice-deployment.yaml")) {
		if at(d, "kind") == "Deployment" && at(d, "metadata", "name") == "sluice" {
			base, _ = d.(map[string]any)
		}
	}
	if at(base, "spec", "template", "spec", "containers", 0, "name") != "sluice" {
		t.Fatal("containers/0 of the sluice Deployment is not sluice")
	}
	// The patched command line is one the binary takes.
	var patched []string
	for _, a := range append(list(at(base, "spec", "template", "spec", "containers", 0, "args")), args...) {
		patched = append(patched, str(a))
	}
	parseSluiceArgs(t, "envoy/kubernetes overlay", patched, nil)
	svc := readYAMLDocs(t, filepath.Join(dir, "grpc-service.yaml"))[0]
	for k, v := range at(svc, "spec", "selector").(map[string]any) {
		if at(base, "spec", "template", "metadata", "labels", k) != v {
			t.Errorf("sluice-grpc selects %s=%v, which the sluice pods lack", k, v)
		}
	}
	if at(svc, "spec", "ports", 0, "targetPort") != portName {
		t.Errorf("sluice-grpc targets port %v, the patch names it %q", at(svc, "spec", "ports", 0, "targetPort"), portName)
	}
	svcName, ns, svcPort := str(at(svc, "metadata", "name")), str(at(svc, "metadata", "namespace")), str(at(svc, "spec", "ports", 0, "port"))
	fqdn := svcName + "." + ns + ".svc.cluster.local"

	set, err := rules.Load(rulesDir) // what deploy/kubernetes loads (its ConfigMap copies deploy/rules)
	if err != nil {
		t.Fatal(err)
	}
	var sawFilter, sawActions, sawProvider, sawPolicy bool
	for _, d := range readYAMLDocs(t, filepath.Join(dir, "istio.yaml")) {
		walk(d, func(m map[string]any) {
			if m["name"] == "envoy.filters.http.ratelimit" {
				sawFilter = true
				if got := str(at(m, "typed_config", "rate_limit_service", "grpc_service", "envoy_grpc", "cluster_name")); got != "outbound|"+svcPort+"||"+fqdn {
					t.Errorf("istio rate limit cluster %q", got)
				}
				domain := str(at(m, "typed_config", "domain"))
				// The actions are in another document of the file.
				for _, d2 := range readYAMLDocs(t, filepath.Join(dir, "istio.yaml")) {
					walk(d2, func(m2 map[string]any) {
						if rls, ok := m2["rate_limits"].([]any); ok {
							sawActions = true
							checkDescriptors(t, "istio.yaml", set, domain, descriptorsOf(t, rls))
						}
					})
				}
			}
			if p, ok := m["envoyExtAuthzGrpc"]; ok {
				sawProvider = true
				if str(at(p, "service")) != fqdn || str(at(p, "port")) != svcPort || at(p, "includeRequestBodyInCheck", "allowPartialMessage") != false {
					t.Errorf("istio ext_authz provider %v", p)
				}
			}
		})
		if at(d, "kind") == "AuthorizationPolicy" {
			sawPolicy = true
			for _, p := range list(at(d, "spec", "rules", 0, "to", 0, "operation", "paths")) {
				checkDefers(t, "istio.yaml", set, str(p))
			}
		}
	}
	if !sawFilter || !sawActions || !sawProvider || !sawPolicy {
		t.Fatalf("istio.yaml: filter %v, actions %v, provider %v, policy %v", sawFilter, sawActions, sawProvider, sawPolicy)
	}
	var sawRef bool
	for _, d := range readYAMLDocs(t, filepath.Join(dir, "envoy-gateway.yaml")) {
		switch at(d, "kind") {
		case "SecurityPolicy":
			ref := at(d, "spec", "extAuth", "grpc", "backendRefs", 0)
			sawRef = str(at(ref, "name")) == svcName && str(at(ref, "namespace")) == ns && str(at(ref, "port")) == svcPort
		case "HTTPRoute":
			checkDefers(t, "envoy-gateway.yaml", set, str(at(d, "spec", "rules", 0, "matches", 0, "path", "value")))
		}
	}
	if !sawRef {
		t.Error("envoy-gateway.yaml: the SecurityPolicy does not call sluice-grpc")
	}
}
