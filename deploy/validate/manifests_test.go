package validate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	egv1a1 "github.com/envoyproxy/gateway/api/v1alpha1"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3" // the @type of the rate limit filter
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	meshv1alpha1 "istio.io/api/mesh/v1alpha1"
	istionet "istio.io/client-go/pkg/apis/networking/v1alpha3"
	istiosec "istio.io/client-go/pkg/apis/security/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	kustomize "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/yaml"
)

// manifestDirs are the directories whose every YAML file is Kubernetes objects
// (kubectl apply -k / -f), relative to this directory.
var manifestDirs = []string{"../kubernetes", "../kubernetes/monitoring", "../envoy/kubernetes"}

// types maps apiVersion and kind to a new object of its Go type. A kind the manifests
// start to use without a type here fails the test: add the type, never skip it.
var types = map[string]func() any{
	"v1/ConfigMap":                                  func() any { return &corev1.ConfigMap{} },
	"v1/Namespace":                                  func() any { return &corev1.Namespace{} },
	"v1/Service":                                    func() any { return &corev1.Service{} },
	"v1/ServiceAccount":                             func() any { return &corev1.ServiceAccount{} },
	"apps/v1/Deployment":                            func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                           func() any { return &appsv1.StatefulSet{} },
	"batch/v1/Job":                                  func() any { return &batchv1.Job{} },
	"policy/v1/PodDisruptionBudget":                 func() any { return &policyv1.PodDisruptionBudget{} },
	"gateway.networking.k8s.io/v1/HTTPRoute":        func() any { return &gatewayv1.HTTPRoute{} },
	"gateway.envoyproxy.io/v1alpha1/SecurityPolicy": func() any { return &egv1a1.SecurityPolicy{} },
	"networking.istio.io/v1alpha3/EnvoyFilter":      func() any { return &istionet.EnvoyFilter{} },
	"security.istio.io/v1/AuthorizationPolicy":      func() any { return &istiosec.AuthorizationPolicy{} },
	"install.istio.io/v1alpha1/IstioOperator":       func() any { return &istioOperator{} },
	"monitoring.coreos.com/v1/PrometheusRule":       func() any { return &monitoringv1.PrometheusRule{} },
	"monitoring.coreos.com/v1/ServiceMonitor":       func() any { return &monitoringv1.ServiceMonitor{} },
	"kustomize.config.k8s.io/v1beta1/Kustomization": func() any { return &kustomize.Kustomization{} },
}

// istioOperator is the part of install.istio.io/v1alpha1 IstioOperator that the
// manifests use: its spec.meshConfig, a mesh.v1alpha1.MeshConfig (checked by
// checkProtoSpecs). The operator's own Go types live in the istio.io/istio module,
// far too large for this; a spec field beside meshConfig fails here until it is
// given a type.
type istioOperator struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              struct {
		MeshConfig map[string]any `json:"meshConfig"`
	} `json:"spec"`
}

// TestManifestsStrict decodes every object of every manifest into the Go type of its
// API (k8s.io/api, Gateway API, Envoy Gateway, Istio, the Prometheus operator,
// kustomize) with unknown and duplicate fields refused, as an API server with strict
// field validation would (kubectl apply --validate=strict). Istio's specs, which are
// protocol buffers, are read again with protojson, which refuses unknown fields where
// Istio's JSON reader lets them pass; the Envoy configuration an EnvoyFilter patches in
// is read into go-control-plane's types (its typed_config by its @type).
func TestManifestsStrict(t *testing.T) {
	seen := 0
	for _, dir := range manifestDirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("%s: no manifests", dir)
		}
		for _, f := range files {
			docs := readDocs(t, f)
			for i, doc := range docs {
				where := fmt.Sprintf("%s (document %d)", f, i+1)
				if err := checkObject(doc); err != nil {
					t.Errorf("%s: %v", where, err)
				}
				seen++
			}
		}
	}
	if seen < 20 {
		t.Errorf("only %d objects read: the manifests are not where this test looks", seen)
	}
}

// checkObject decodes one object strictly into its type.
func checkObject(doc []byte) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	newObj, ok := types[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return fmt.Errorf("%s %s: no Go type for it in this test (add one)", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return checkProtoSpecs(tm.Kind, doc)
}

// checkProtoSpecs reads the protocol buffer specs of Istio's objects with protojson,
// unknown fields refused, and the Envoy configuration an EnvoyFilter patches in.
func checkProtoSpecs(kind string, doc []byte) error {
	var raw struct {
		Spec json_ `json:"spec"`
	}
	if err := yaml.Unmarshal(doc, &raw); err != nil {
		return err
	}
	switch kind {
	case "EnvoyFilter":
		var ef istionet.EnvoyFilter
		if err := protoStrict(raw.Spec, &ef.Spec); err != nil {
			return fmt.Errorf("EnvoyFilter spec: %w", err)
		}
		for i, cp := range ef.Spec.GetConfigPatches() {
			value, err := protojson.Marshal(cp.GetPatch().GetValue())
			if err != nil {
				return err
			}
			var into proto.Message
			switch cp.GetApplyTo().String() {
			case "HTTP_FILTER":
				into = &hcmv3.HttpFilter{}
			case "VIRTUAL_HOST":
				into = &routev3.VirtualHost{}
			default:
				return fmt.Errorf("EnvoyFilter configPatches[%d]: applyTo %s: no Envoy type for it in this test (add one)", i, cp.GetApplyTo())
			}
			if err := protojson.Unmarshal(value, into); err != nil {
				return fmt.Errorf("EnvoyFilter configPatches[%d] (%s) patch.value: %w", i, cp.GetApplyTo(), err)
			}
		}
	case "AuthorizationPolicy":
		var ap istiosec.AuthorizationPolicy
		if err := protoStrict(raw.Spec, &ap.Spec); err != nil {
			return fmt.Errorf("AuthorizationPolicy spec: %w", err)
		}
	case "IstioOperator":
		var spec struct {
			MeshConfig json_ `json:"meshConfig"`
		}
		if err := yaml.Unmarshal(raw.Spec, &spec); err != nil {
			return err
		}
		if err := protoStrict(spec.MeshConfig, &meshv1alpha1.MeshConfig{}); err != nil {
			return fmt.Errorf("IstioOperator spec.meshConfig: %w", err)
		}
	}
	return nil
}

// json_ keeps a part of a document as JSON, to be read again.
type json_ []byte

func (j *json_) UnmarshalJSON(b []byte) error {
	*j = append((*j)[:0], b...)
	return nil
}

// protoStrict reads JSON into m with protojson, refusing unknown fields.
func protoStrict(b []byte, m proto.Message) error {
	if len(b) == 0 {
		return errors.New("missing")
	}
	return protojson.UnmarshalOptions{}.Unmarshal(b, m)
}

// readDocs splits a YAML file into its documents (empty ones dropped).
func readDocs(t *testing.T, path string) [][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := utilyaml.NewYAMLReader(bufio.NewReader(f))
	var docs [][]byte
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if len(bytes.TrimSpace(stripComments(doc))) > 0 {
			docs = append(docs, doc)
		}
	}
}

func stripComments(doc []byte) []byte {
	var out []string
	for _, l := range strings.Split(string(doc), "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			out = append(out, l)
		}
	}
	return []byte(strings.Join(out, "\n"))
}

// TestStrictCatches: the check refuses what it is for — a misspelt field of a
// Deployment, of an Istio spec (which Istio's own JSON reader lets pass), of the Envoy
// configuration an EnvoyFilter patches in, a duplicate key, an unknown kind — and
// takes the same objects spelt right.
func TestStrictCatches(t *testing.T) {
	good := map[string]string{
		"Deployment":          "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  selector: {matchLabels: {a: b}}\n  template:\n    metadata: {labels: {a: b}}\n    spec:\n      containers: [{name: c, image: i, args: [serve]}]\n",
		"AuthorizationPolicy": "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\nmetadata: {name: x}\nspec:\n  action: CUSTOM\n  provider: {name: sluice}\n",
		"EnvoyFilter":         "apiVersion: networking.istio.io/v1alpha3\nkind: EnvoyFilter\nmetadata: {name: x}\nspec:\n  configPatches:\n    - applyTo: HTTP_FILTER\n      patch:\n        operation: INSERT_BEFORE\n        value:\n          name: envoy.filters.http.ratelimit\n          typed_config:\n            \"@type\": type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit\n            domain: d\n",
	}
	for name, doc := range good {
		if err := checkObject([]byte(doc)); err != nil {
			t.Errorf("%s spelt right: %v", name, err)
		}
	}
	for name, doc := range map[string]string{
		"a misspelt container field": strings.Replace(good["Deployment"], "args:", "arg:", 1),
		"a duplicate key":            strings.Replace(good["Deployment"], "metadata: {name: x}", "metadata: {name: x, name: y}", 1),
		"a misspelt Istio field":     strings.Replace(good["AuthorizationPolicy"], "action:", "actions:", 1),
		"a misspelt Envoy field":     strings.Replace(good["EnvoyFilter"], "domain:", "domains:", 1),
		"an unknown kind":            strings.Replace(good["Deployment"], "kind: Deployment", "kind: Deploymnet", 1),
	} {
		if err := checkObject([]byte(doc)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
