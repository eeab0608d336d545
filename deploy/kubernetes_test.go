package deploy_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"io"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/rules"
)

// k8sObject is a Kubernetes object as far as the tests read it.
type k8sObject struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	Metadata   struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	} `yaml:"metadata"`
	Data map[string]string `yaml:"data"`
	Spec struct {
		Replicas    *int        `yaml:"replicas"`
		ServiceName string      `yaml:"serviceName"`
		Selector    k8sSelector `yaml:"selector"`
		ClusterIP   string      `yaml:"clusterIP"`
		Template    struct {
			Metadata struct {
				Labels      map[string]string `yaml:"labels"`
				Annotations map[string]string `yaml:"annotations"`
			} `yaml:"metadata"`
			Spec k8sPodSpec `yaml:"spec"`
		} `yaml:"template"`
		VolumeClaimTemplates []struct {
			Metadata struct {
				Name string `yaml:"name"`
			} `yaml:"metadata"`
		} `yaml:"volumeClaimTemplates"`
		Ports []struct {
			Name       string      `yaml:"name"`
			Port       int         `yaml:"port"`
			TargetPort intOrString `yaml:"targetPort"`
		} `yaml:"ports"`
		MaxUnavailable intOrString `yaml:"maxUnavailable"`
		MinAvailable   intOrString `yaml:"minAvailable"`
		Endpoints      []struct {
			Port string `yaml:"port"`
			Path string `yaml:"path"`
		} `yaml:"endpoints"`
		Groups any `yaml:"groups"`
	} `yaml:"spec"`

	file string
}

type k8sPodSpec struct {
	TerminationGracePeriodSeconds *int `yaml:"terminationGracePeriodSeconds"`
	SecurityContext               struct {
		RunAsNonRoot *bool `yaml:"runAsNonRoot"`
		RunAsUser    *int  `yaml:"runAsUser"`
	} `yaml:"securityContext"`
	Containers []k8sContainer `yaml:"containers"`
	Volumes    []struct {
		Name      string `yaml:"name"`
		ConfigMap *struct {
			Name string `yaml:"name"`
		} `yaml:"configMap"`
	} `yaml:"volumes"`
}

type k8sContainer struct {
	Name    string   `yaml:"name"`
	Image   string   `yaml:"image"`
	Command []string `yaml:"command"`
	Args    []string `yaml:"args"`
	Env     []struct {
		Name      string `yaml:"name"`
		Value     string `yaml:"value"`
		ValueFrom *struct {
			SecretKeyRef *struct {
				Name string `yaml:"name"`
				Key  string `yaml:"key"`
			} `yaml:"secretKeyRef"`
			FieldRef *struct {
				FieldPath string `yaml:"fieldPath"`
			} `yaml:"fieldRef"`
		} `yaml:"valueFrom"`
	} `yaml:"env"`
	EnvFrom []struct {
		ConfigMapRef *struct {
			Name string `yaml:"name"`
		} `yaml:"configMapRef"`
		SecretRef any `yaml:"secretRef"`
	} `yaml:"envFrom"`
	Ports          []k8sPort `yaml:"ports"`
	ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
	LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
	StartupProbe   *k8sProbe `yaml:"startupProbe"`
	Lifecycle      struct {
		PreStop struct {
			Sleep *struct {
				Seconds int `yaml:"seconds"`
			} `yaml:"sleep"`
		} `yaml:"preStop"`
	} `yaml:"lifecycle"`
	Resources struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext struct {
		RunAsNonRoot             *bool `yaml:"runAsNonRoot"`
		ReadOnlyRootFilesystem   *bool `yaml:"readOnlyRootFilesystem"`
		AllowPrivilegeEscalation *bool `yaml:"allowPrivilegeEscalation"`
	} `yaml:"securityContext"`
	VolumeMounts []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type k8sPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type k8sProbe struct {
	HTTPGet *struct {
		Path string      `yaml:"path"`
		Port intOrString `yaml:"port"`
	} `yaml:"httpGet"`
	TCPSocket *struct {
		Port intOrString `yaml:"port"`
	} `yaml:"tcpSocket"`
	Exec any `yaml:"exec"`
}

// intOrString is a port number or name (or a count or percentage).
type intOrString string

func (s *intOrString) UnmarshalYAML(n *yaml.Node) error {
	*s = intOrString(n.Value)
	return nil
}

// k8sSelector is a Service's label map or a {matchLabels: …} selector.
type k8sSelector map[string]string

func (s *k8sSelector) UnmarshalYAML(n *yaml.Node) error {
	var m map[string]any
	if err := n.Decode(&m); err != nil {
		return err
	}
	out := k8sSelector{}
	if ml, ok := m["matchLabels"].(map[string]any); ok {
		for k, v := range ml {
			out[k], _ = v.(string)
		}
	} else if _, ok := m["matchExpressions"]; ok {
		return errors.New("matchExpressions: not read by the tests")
	} else {
		for k, v := range m {
			out[k], _ = v.(string)
		}
	}
	*s = out
	return nil
}

func (s k8sSelector) matches(labels map[string]string) bool {
	if len(s) == 0 {
		return false
	}
	for k, v := range s {
		if labels[k] != v {
			return false
		}
	}
	return true
}

type k8sObjects []*k8sObject

func (o k8sObjects) ofKind(kind string) k8sObjects {
	var out k8sObjects
	for _, x := range o {
		if x.Kind == kind {
			out = append(out, x)
		}
	}
	return out
}

func (o k8sObjects) get(kind, name string) *k8sObject {
	for _, x := range o {
		if x.Kind == kind && x.Metadata.Name == name {
			return x
		}
	}
	return nil
}

// workloads are the objects with a pod template.
func (o k8sObjects) workloads() k8sObjects {
	var out k8sObjects
	for _, x := range o {
		switch x.Kind {
		case "Deployment", "StatefulSet", "DaemonSet":
			out = append(out, x)
		}
	}
	return out
}

// loadKubernetes decodes every document of every YAML file in dir (not in
// subdirectories).
func loadKubernetes(t *testing.T, dir string) k8sObjects {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var objs k8sObjects
	for _, f := range files {
		if filepath.Base(f) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		for {
			var o k8sObject
			err := dec.Decode(&o)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			if o.Kind == "" && o.APIVersion == "" {
				continue // an empty document
			}
			o.file = f
			objs = append(objs, &o)
		}
	}
	return objs
}

// k8sSecrets stands in for the Secrets that are made by hand: a random value for
// each key that a secretKeyRef names, the same for every reference to it. A value
// found in a configuration can only have come from a Secret.
type k8sSecrets map[string]string // "NAME/KEY" → value

func (s k8sSecrets) value(name, key string) string {
	k := name + "/" + key
	if _, ok := s[k]; !ok {
		s[k] = hex.EncodeToString(randomBytes(32))
	}
	return s[k]
}

func (s k8sSecrets) values() []string { return slices.Collect(maps.Values(s)) }

// env returns the environment of a container of pod: its envFrom ConfigMaps, then
// its env in order, values from Secrets (secrets) and the pod's name (fieldRef
// metadata.name), $(NAME) replaced by an earlier variable as Kubernetes does ($$ is
// a $; an unknown name stays as written).
func (c k8sContainer) env(t *testing.T, objs k8sObjects, pod string, secrets k8sSecrets) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		cm := objs.get("ConfigMap", ef.ConfigMapRef.Name)
		if cm == nil {
			t.Fatalf("container %s: envFrom ConfigMap %s does not exist", c.Name, ef.ConfigMapRef.Name)
		}
		maps.Copy(env, cm.Data)
	}
	for _, e := range c.Env {
		switch vf := e.ValueFrom; {
		case vf == nil:
			env[e.Name] = k8sDependentVarRE.ReplaceAllStringFunc(e.Value, func(ref string) string {
				if ref[1] == '$' {
					return ref[1:]
				}
				if v, ok := env[ref[2:len(ref)-1]]; ok {
					return v
				}
				return ref
			})
		case vf.SecretKeyRef != nil:
			env[e.Name] = secrets.value(vf.SecretKeyRef.Name, vf.SecretKeyRef.Key)
		case vf.FieldRef != nil && vf.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = pod
		default:
			env[e.Name] = "" // a resource, or another field of the pod
		}
	}
	return env
}

var k8sDependentVarRE = regexp.MustCompile(`\$?\$\([A-Za-z_][A-Za-z0-9_.-]*\)`)

// containerPort resolves a port name or number of a container.
func (c k8sContainer) containerPort(p intOrString) (int, bool) {
	for _, cp := range c.Ports {
		if cp.Name == string(p) || strconv.Itoa(cp.ContainerPort) == string(p) {
			return cp.ContainerPort, true
		}
	}
	return 0, false
}

// servicePort resolves host:port (a Service of the namespace, possibly written
// NAME.NAMESPACE[.svc…], or POD.SERVICE for a headless Service) to the workload and
// container port behind it.
func (o k8sObjects) servicePort(t *testing.T, ns, host string, port int) (*k8sObject, int, bool) {
	t.Helper()
	parts := strings.Split(host, ".")
	svcName := parts[0]
	pod := ""
	if len(parts) > 1 && parts[1] != ns {
		pod, svcName = parts[0], parts[1]
	}
	svc := o.get("Service", svcName)
	if svc == nil {
		return nil, 0, false
	}
	for _, w := range o.workloads() {
		if !svc.Spec.Selector.matches(w.Spec.Template.Metadata.Labels) {
			continue
		}
		if pod != "" && (w.Kind != "StatefulSet" || w.Spec.ServiceName != svcName || !strings.HasPrefix(pod, w.Metadata.Name+"-")) {
			continue
		}
		for _, sp := range svc.Spec.Ports {
			if sp.Port != port {
				continue
			}
			target := sp.TargetPort
			if target == "" {
				target = intOrString(strconv.Itoa(sp.Port))
			}
			for _, c := range w.Spec.Template.Spec.Containers {
				if cp, ok := c.containerPort(target); ok {
					return w, cp, true
				}
			}
		}
	}
	return nil, 0, false
}

type kustomization struct {
	Namespace string   `yaml:"namespace"`
	Resources []string `yaml:"resources"`
	Images    []struct {
		Name    string `yaml:"name"`
		NewName string `yaml:"newName"`
		NewTag  string `yaml:"newTag"`
	} `yaml:"images"`
}

// TestKubernetes checks deploy/kubernetes: the kustomizations list every manifest;
// every object is named and in the namespace; the sluice Deployment's command line
// and SLUICE_* environment are accepted by the binary, its ports, probes and
// Service agree with --listen / --admin-listen, the rules it mounts pass the
// validator and keep ConfigMap reloads working; Redis, NATS and the upstream it
// names are Services of the namespace on the ports their pods listen on; Services,
// PodDisruptionBudgets and the ServiceMonitor select what they should.
func TestKubernetes(t *testing.T) {
	objs := loadKubernetes(t, k8sDir)
	monitoring := loadKubernetes(t, filepath.Join(k8sDir, "monitoring"))
	all := append(slices.Clone(objs), monitoring...)

	var kz kustomization
	for _, dir := range []string{k8sDir, filepath.Join(k8sDir, "monitoring")} {
		var k kustomization
		decodeYAMLInto(t, filepath.Join(dir, "kustomization.yaml"), &k)
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		var want []string
		for _, f := range files {
			if b := filepath.Base(f); b != "kustomization.yaml" {
				want = append(want, b)
			}
		}
		got := slices.Clone(k.Resources)
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Errorf("%s/kustomization.yaml: resources %v, want every manifest %v", dir, got, want)
		}
		if dir == k8sDir {
			kz = k
		}
	}
	ns := kz.Namespace
	if ns == "" || all.get("Namespace", ns) == nil {
		t.Fatalf("kustomization namespace %q: no Namespace object", ns)
	}

	seen := map[string]bool{}
	for _, o := range all {
		id := o.Kind + "/" + o.Metadata.Name
		if o.APIVersion == "" || o.Kind == "" || o.Metadata.Name == "" {
			t.Errorf("%s: an object without apiVersion, kind or name", o.file)
		}
		if seen[id] {
			t.Errorf("%s: %s twice", o.file, id)
		}
		seen[id] = true
		if o.Kind != "Namespace" && o.Metadata.Namespace != ns {
			t.Errorf("%s: %s in namespace %q, want %q", o.file, id, o.Metadata.Namespace, ns)
		}
	}

	// Services and PodDisruptionBudgets select pods, on ports the pods have.
	for _, svc := range objs.ofKind("Service") {
		var w *k8sObject
		for _, x := range objs.workloads() {
			if svc.Spec.Selector.matches(x.Spec.Template.Metadata.Labels) {
				w = x
			}
		}
		if w == nil {
			t.Errorf("Service %s selects no pods", svc.Metadata.Name)
			continue
		}
		for _, sp := range svc.Spec.Ports {
			target := sp.TargetPort
			if target == "" {
				target = intOrString(strconv.Itoa(sp.Port))
			}
			found := false
			for _, c := range w.Spec.Template.Spec.Containers {
				if _, ok := c.containerPort(target); ok {
					found = true
				}
			}
			if !found {
				t.Errorf("Service %s: targetPort %s is no port of %s %s", svc.Metadata.Name, target, w.Kind, w.Metadata.Name)
			}
		}
	}
	for _, pdb := range objs.ofKind("PodDisruptionBudget") {
		matched := false
		for _, w := range objs.workloads() {
			if pdb.Spec.Selector.matches(w.Spec.Template.Metadata.Labels) {
				matched = true
				if n, err := strconv.Atoi(string(pdb.Spec.MaxUnavailable)); err == nil && w.Spec.Replicas != nil && n >= *w.Spec.Replicas {
					t.Errorf("PodDisruptionBudget %s lets all %d pods go", pdb.Metadata.Name, *w.Spec.Replicas)
				}
			}
		}
		if !matched {
			t.Errorf("PodDisruptionBudget %s selects no pods", pdb.Metadata.Name)
		}
	}
	for _, w := range objs.workloads() {
		if !w.Spec.Selector.matches(w.Spec.Template.Metadata.Labels) {
			t.Errorf("%s %s: its selector does not match its pods", w.Kind, w.Metadata.Name)
		}
		for _, c := range w.Spec.Template.Spec.Containers {
			if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
				t.Errorf("%s %s: container %s without cpu/memory requests and a memory limit", w.Kind, w.Metadata.Name, c.Name)
			}
			if f := c.SecurityContext.ReadOnlyRootFilesystem; f == nil || !*f {
				t.Errorf("%s %s: container %s: readOnlyRootFilesystem", w.Kind, w.Metadata.Name, c.Name)
			}
			if f := c.SecurityContext.AllowPrivilegeEscalation; f == nil || *f {
				t.Errorf("%s %s: container %s: allowPrivilegeEscalation: false", w.Kind, w.Metadata.Name, c.Name)
			}
			nonRoot := w.Spec.Template.Spec.SecurityContext.RunAsNonRoot
			if c.SecurityContext.RunAsNonRoot != nil {
				nonRoot = c.SecurityContext.RunAsNonRoot
			}
			if nonRoot == nil || !*nonRoot {
				t.Errorf("%s %s: container %s: runAsNonRoot", w.Kind, w.Metadata.Name, c.Name)
			}
		}
	}

	// Passwords and keys live in Secrets made by hand: a Secret in the manifests
	// would put its values in the repository.
	for _, o := range all.ofKind("Secret") {
		t.Errorf("%s: Secret %s: create it by hand (deploy/README.md), never in the manifests", o.file, o.Metadata.Name)
	}
	secrets := k8sSecrets{}
	users := checkKubernetesNATS(t, objs, secrets)
	checkKubernetesSluice(t, objs, monitoring, ns, kz, secrets, users)

	// Alert rules for the operator: the same groups as deploy/prometheus/alerts.yaml.
	pr := monitoring.get("PrometheusRule", "sluice")
	if pr == nil {
		t.Fatal("monitoring: no PrometheusRule sluice")
	}
	var alerts struct {
		Groups any `yaml:"groups"`
	}
	decodeYAMLInto(t, "prometheus/alerts.yaml", &alerts)
	if !reflect.DeepEqual(pr.Spec.Groups, alerts.Groups) {
		t.Errorf("monitoring/prometheusrule.yaml: its groups differ from prometheus/alerts.yaml")
	}
}

// checkKubernetesSluice checks the sluice Deployment against the binary and the
// objects it refers to, and that it connects to NATS as one of users, with the
// password of the Secret the servers have it from.
func checkKubernetesSluice(t *testing.T, objs, monitoring k8sObjects, ns string, kz kustomization, secrets k8sSecrets, users map[string]*server.User) {
	t.Helper()
	ic := loadImageConfig(t)
	var dep *k8sObject
	var ctr k8sContainer
	for _, w := range objs.workloads() {
		for _, c := range w.Spec.Template.Spec.Containers {
			if repo, _ := splitImage(c.Image); repo == sluiceImage && len(c.Command) == 0 {
				if dep != nil {
					t.Fatalf("two sluice workloads: %s and %s", dep.Metadata.Name, w.Metadata.Name)
				}
				dep, ctr = w, c
			}
		}
	}
	if dep == nil {
		t.Fatal("no workload runs the sluice image's entrypoint")
	}
	where := "kubernetes " + dep.Kind + " " + dep.Metadata.Name
	if dep.Kind != "Deployment" || dep.Spec.Replicas == nil || *dep.Spec.Replicas != 3 {
		t.Errorf("%s: want a Deployment of 3 replicas", where)
	}
	for _, ef := range ctr.EnvFrom {
		if ef.ConfigMapRef == nil {
			continue
		}
		if cm := objs.get("ConfigMap", ef.ConfigMapRef.Name); cm != nil {
			for k := range cm.Data {
				if !strings.HasPrefix(k, "SLUICE_") {
					t.Errorf("%s: ConfigMap %s: %s is not a SLUICE_* setting", where, cm.Metadata.Name, k)
				}
			}
		}
	}
	env := maps.Clone(ic.env)
	maps.Copy(env, ctr.env(t, objs, dep.Metadata.Name+"-pod", secrets))
	g := parseSluiceArgs(t, where, ctr.Args, env)
	if g.cmd != "serve" {
		t.Errorf("%s: sluice %s, want serve", where, g.cmd)
	}

	// Ports: the container ports are the listen addresses; probes and the scrape
	// use the admin port.
	listen, admin := g.port(t, "listen"), g.port(t, "admin-listen")
	if p, ok := ctr.containerPort("http"); !ok || p != listen {
		t.Errorf("%s: container port http %d, --listen port %d", where, p, listen)
	}
	if p, ok := ctr.containerPort("admin"); !ok || p != admin {
		t.Errorf("%s: container port admin %d, --admin-listen port %d", where, p, admin)
	}
	probe := func(name string, pr *k8sProbe, path string) {
		if pr == nil || pr.HTTPGet == nil {
			t.Errorf("%s: no HTTP %s", where, name)
			return
		}
		if p, ok := ctr.containerPort(pr.HTTPGet.Port); !ok || p != admin || pr.HTTPGet.Path != path {
			t.Errorf("%s: %s GET %s on port %s, want %s on the admin port %d", where, name, pr.HTTPGet.Path, pr.HTTPGet.Port, path, admin)
		}
	}
	probe("readinessProbe", ctr.ReadinessProbe, "/readyz")
	probe("livenessProbe", ctr.LivenessProbe, "/healthz")
	if g.value("admin-token") != "" {
		t.Errorf("%s: with --admin-token, the kubelet's /readyz probe gets 401", where)
	}
	if a := dep.Spec.Template.Metadata.Annotations; a["prometheus.io/port"] != "" && a["prometheus.io/port"] != strconv.Itoa(admin) {
		t.Errorf("%s: prometheus.io/port %s, admin port %d", where, a["prometheus.io/port"], admin)
	}
	for _, sm := range monitoring.ofKind("ServiceMonitor") {
		found := false
		for _, svc := range objs.ofKind("Service") {
			if !sm.Spec.Selector.matches(svc.Metadata.Labels) {
				continue
			}
			for _, ep := range sm.Spec.Endpoints {
				for _, sp := range svc.Spec.Ports {
					if sp.Name != ep.Port {
						continue
					}
					found = true
					if p, ok := ctr.containerPort(sp.TargetPort); !ok || p != admin {
						t.Errorf("ServiceMonitor %s scrapes Service %s port %s → %s, not the admin port %d", sm.Metadata.Name, svc.Metadata.Name, ep.Port, sp.TargetPort, admin)
					}
					if ep.Path != "" && ep.Path != "/metrics" {
						t.Errorf("ServiceMonitor %s: path %s", sm.Metadata.Name, ep.Path)
					}
				}
			}
		}
		if !found {
			t.Errorf("ServiceMonitor %s selects no Service port", sm.Metadata.Name)
		}
	}

	// Shutdown: the grace period covers the preStop pause and --shutdown-timeout.
	grace := 30 * time.Second
	if p := dep.Spec.Template.Spec.TerminationGracePeriodSeconds; p != nil {
		grace = time.Duration(*p) * time.Second
	}
	pause := time.Duration(0)
	if s := ctr.Lifecycle.PreStop.Sleep; s != nil {
		pause = time.Duration(s.Seconds) * time.Second
	}
	if st := g.duration(t, "shutdown-timeout"); grace <= pause+st {
		t.Errorf("%s: terminationGracePeriodSeconds %s does not cover preStop %s + --shutdown-timeout %s", where, grace, pause, st)
	}

	// Redis, NATS and the upstream are Services of the namespace.
	for _, flag := range []string{"redis", "upstream"} {
		h, p := urlHostPort(t, where+" --"+flag, g.value(flag))
		if _, _, ok := objs.servicePort(t, ns, h, p); !ok {
			t.Errorf("%s: --%s %s: no Service port with pods behind it", where, flag, g.value(flag))
		}
	}
	// Replicas sharing NATS share the signing key, kept in a Secret, not in the manifests.
	if len(g.list("nats")) > 0 && !slices.Contains(secrets.values(), g.value("queue-key")) {
		t.Errorf("%s: --nats without SLUICE_QUEUE_KEY from a Secret: sluice refuses to start", where)
	}
	// NATS admits only the user sluice of accounts.conf, with the password of the
	// Secret the NATS pods have it from (every replica: one pod template).
	sluiceUser := checkNATSClient(t, where, g, users)
	var natsPods []string
	var natsSet *k8sObject
	for _, u := range g.list("nats") {
		h, p := urlHostPort(t, where+" --nats", u)
		w, cp, ok := objs.servicePort(t, ns, h, p)
		if !ok {
			t.Errorf("%s: --nats %s: no NATS pod behind it", where, u)
			continue
		}
		natsSet = w
		if client, _ := w.Spec.Template.Spec.Containers[0].containerPort("client"); client != cp {
			t.Errorf("%s: --nats %s is not the client port of %s", where, u, w.Metadata.Name)
		}
		natsPods = append(natsPods, strings.Split(h, ".")[0])
	}
	if natsSet != nil {
		var want []string
		for i := 0; i < *natsSet.Spec.Replicas; i++ {
			want = append(want, natsSet.Metadata.Name+"-"+strconv.Itoa(i))
		}
		slices.Sort(natsPods)
		if !slices.Equal(natsPods, want) {
			t.Errorf("%s: --nats names %v, want every node %v", where, natsPods, want)
		}
		if r, _ := strconv.Atoi(g.value("replicas")); r != 3 || r > *natsSet.Spec.Replicas {
			t.Errorf("%s: --replicas %s with %d NATS nodes: want R3", where, g.value("replicas"), *natsSet.Spec.Replicas)
		}
	}

	// Rules: a ConfigMap mounted as a directory (a subPath mount never sees the
	// ConfigMap's updates), loaded by the validator as sluice loads it.
	var rulesPaths []string
	for _, p := range g.list("rules") {
		var vol string
		for _, vm := range ctr.VolumeMounts {
			if p == vm.MountPath || strings.HasPrefix(p, vm.MountPath+"/") {
				vol = vm.Name
				if vm.SubPath != "" {
					t.Errorf("%s: rules mount %s uses subPath: ConfigMap updates would never reach sluice", where, vm.MountPath)
				}
				if p != vm.MountPath {
					t.Errorf("%s: --rules %s: give the mounted directory %s, whose ..data swap the watcher sees", where, p, vm.MountPath)
				}
			}
		}
		var cmName string
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == vol && v.ConfigMap != nil {
				cmName = v.ConfigMap.Name
			}
		}
		cm := objs.get("ConfigMap", cmName)
		if cm == nil {
			t.Errorf("%s: --rules %s is not a mounted ConfigMap", where, p)
			continue
		}
		dir := t.TempDir()
		for name, content := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			// The examples are copies of deploy/rules, byte for byte.
			orig, err := os.ReadFile(filepath.Join(rulesDir, name))
			if err != nil {
				t.Errorf("ConfigMap %s: %s is not a file of deploy/rules", cm.Metadata.Name, name)
			} else if string(orig) != content {
				t.Errorf("ConfigMap %s: %s differs from deploy/rules/%s", cm.Metadata.Name, name, name)
			}
		}
		rulesPaths = append(rulesPaths, dir)
	}
	if len(rulesPaths) > 0 {
		set, err := rules.Load(rulesPaths...)
		if err != nil {
			t.Errorf("%s: the rules it mounts have problems:\n%v", where, err)
		} else {
			if sluiceUser != nil {
				checkNATSDownstreams(t, where, sluiceUser, set)
			}
			for _, q := range set.Queues() {
				if q.NATSSubject() != "" {
					continue
				}
				h, p := urlHostPort(t, where+" queue "+q.Name, q.Downstream)
				if _, _, ok := objs.servicePort(t, ns, h, p); !ok {
					t.Errorf("%s: queue %s delivers to %s: no Service port with pods behind it", where, q.Name, q.Downstream)
				}
			}
		}
	}

	// Images: one sluice image everywhere, and the kustomization retags that one.
	c := loadCompose(t)
	var refs []string
	for _, s := range c.Services {
		if repo, _ := splitImage(s.Image); repo == sluiceImage {
			refs = append(refs, "compose "+s.Image)
		}
	}
	for _, w := range objs.workloads() {
		for _, ct := range w.Spec.Template.Spec.Containers {
			if strings.Contains(ct.Image, "sluice") {
				refs = append(refs, "kubernetes "+ct.Image)
				if repo, _ := splitImage(ct.Image); repo != sluiceImage {
					t.Errorf("%s %s: image %s, want %s", w.Kind, w.Metadata.Name, ct.Image, sluiceImage)
				}
				if len(ct.Command) > 0 && !slices.Contains(ic.binaries, ct.Command[0]) {
					t.Errorf("%s %s: command %s is not in the image (%v)", w.Kind, w.Metadata.Name, ct.Command[0], ic.binaries)
				}
				if len(ct.Command) > 0 && strings.HasSuffix(ct.Command[0], "/sluice-bench") {
					if len(ct.Args) != 2 || !slices.Contains(benchModes(t), ct.Args[0]) {
						t.Errorf("%s %s: sluice-bench %v: want MODE ADDR", w.Kind, w.Metadata.Name, ct.Args)
					} else if _, p, _ := net.SplitHostPort(ct.Args[1]); !slices.ContainsFunc(ct.Ports, func(cp k8sPort) bool { return strconv.Itoa(cp.ContainerPort) == p }) {
						t.Errorf("%s %s: listens on %s, which is no container port", w.Kind, w.Metadata.Name, ct.Args[1])
					}
				}
			}
			if repo, _ := splitImage(ct.Image); repo == "redis" {
				for _, s := range c.Services {
					if r, _ := splitImage(s.Image); r == "redis" && s.Image != ct.Image {
						t.Errorf("redis image %s in Kubernetes, %s in compose", ct.Image, s.Image)
					}
				}
			}
		}
	}
	var tags []string
	for _, r := range refs {
		_, tag := splitImage(strings.Fields(r)[1])
		tags = append(tags, tag)
	}
	if len(slices.Compact(slices.Sorted(slices.Values(tags)))) != 1 {
		t.Errorf("the sluice image has different tags: %v", refs)
	}
	if len(kz.Images) != 1 || kz.Images[0].Name != sluiceImage {
		t.Errorf("kustomization images: want one entry for %s", sluiceImage)
	}
}

// checkKubernetesNATS: the StatefulSet runs the config of its ConfigMap, which the
// real nats-server parser accepts for every pod (with the ConfigMap's other keys
// beside it for its includes: accounts.conf, a copy of deploy/nats/accounts.conf);
// routes name every pod through the headless Service on the cluster port; JetStream
// stores on the claim template; clients and routes authenticate with passwords from
// Secrets (checkNATSAuth). It returns the users of the configuration.
func checkKubernetesNATS(t *testing.T, objs k8sObjects, secrets k8sSecrets) map[string]*server.User {
	t.Helper()
	var sts *k8sObject
	for _, w := range objs.ofKind("StatefulSet") {
		if repo, _ := splitImage(w.Spec.Template.Spec.Containers[0].Image); repo == "nats" {
			sts = w
		}
	}
	if sts == nil {
		t.Fatal("no NATS StatefulSet")
	}
	where := "StatefulSet " + sts.Metadata.Name
	ctr := sts.Spec.Template.Spec.Containers[0]
	checkNATSImage(t, where, ctr.Image)
	c := loadCompose(t)
	for name, s := range c.Services {
		if r, _ := splitImage(s.Image); r == "nats" && s.Image != ctr.Image {
			t.Errorf("NATS image %s in Kubernetes, %s in compose %s", ctr.Image, s.Image, name)
		}
	}
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas != 3 {
		t.Errorf("%s: want 3 replicas", where)
	}
	svc := objs.get("Service", sts.Spec.ServiceName)
	if svc == nil || svc.Spec.ClusterIP != "None" {
		t.Fatalf("%s: serviceName %s is not a headless Service", where, sts.Spec.ServiceName)
	}
	cfg := ""
	args := append(slices.Clone(ctr.Command), ctr.Args...)
	for i, a := range args {
		if (a == "--config" || a == "-c") && i+1 < len(args) {
			cfg = args[i+1]
		}
	}
	var cm *k8sObject
	var key string
	for _, vm := range ctr.VolumeMounts {
		if filepath.Dir(cfg) == vm.MountPath {
			for _, v := range sts.Spec.Template.Spec.Volumes {
				if v.Name == vm.Name && v.ConfigMap != nil {
					cm, key = objs.get("ConfigMap", v.ConfigMap.Name), filepath.Base(cfg)
				}
			}
		}
	}
	if cm == nil || cm.Data[key] == "" {
		t.Fatalf("%s: --config %s is not a mounted ConfigMap key", where, cfg)
	}
	// The volume holds every key of the ConfigMap.
	dir := t.TempDir()
	for k, v := range cm.Data {
		if err := os.WriteFile(filepath.Join(dir, k), []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	path := filepath.Join(dir, key)
	if acc, err := os.ReadFile(filepath.Join("nats", "accounts.conf")); err != nil {
		t.Fatal(err)
	} else if cm.Data["accounts.conf"] != string(acc) {
		t.Errorf("ConfigMap %s: accounts.conf differs from deploy/nats/accounts.conf", cm.Metadata.Name)
	}
	var names []string
	var users map[string]*server.User
	for i := 0; i < *sts.Spec.Replicas; i++ {
		pod := sts.Metadata.Name + "-" + strconv.Itoa(i)
		opts := loadNATSConfig(t, path, ctr.env(t, objs, pod, secrets))
		u := checkNATSAuth(t, where+" pod "+pod, opts, secrets.values())
		if why := natsNotDurable(opts); why != "" {
			t.Errorf("%s: %s", where+" pod "+pod, why)
		}
		if users == nil {
			users = u
		} else if !slices.Equal(slices.Sorted(maps.Keys(u)), slices.Sorted(maps.Keys(users))) {
			t.Errorf("%s: pods with different users", where)
		}
		names = append(names, opts.ServerName)
		if !opts.JetStream {
			t.Errorf("%s: JetStream is off", where)
		}
		if opts.Cluster.Name == "" {
			t.Errorf("%s: no cluster name", where)
		}
		for want, port := range map[string]int{"client": opts.Port, "cluster": opts.Cluster.Port, "monitor": opts.HTTPPort} {
			if p, ok := ctr.containerPort(intOrString(want)); !ok || p != port {
				t.Errorf("%s: container port %s %d, the config listens on %d", where, want, p, port)
			}
		}
		var routes, wantRoutes []string
		for _, r := range opts.Routes {
			routes = append(routes, r.Host)
		}
		for j := 0; j < *sts.Spec.Replicas; j++ {
			wantRoutes = append(wantRoutes, net.JoinHostPort(sts.Metadata.Name+"-"+strconv.Itoa(j)+"."+svc.Metadata.Name, strconv.Itoa(opts.Cluster.Port)))
		}
		slices.Sort(routes)
		if !slices.Equal(routes, wantRoutes) {
			t.Errorf("%s: routes %v, want %v", where, routes, wantRoutes)
		}
		onClaim := false
		for _, vm := range ctr.VolumeMounts {
			for _, vct := range sts.Spec.VolumeClaimTemplates {
				if vm.Name == vct.Metadata.Name && (opts.StoreDir == vm.MountPath || strings.HasPrefix(opts.StoreDir, vm.MountPath+"/")) {
					onClaim = true
				}
			}
		}
		if !onClaim {
			t.Errorf("%s: store_dir %s is on no volume claim", where, opts.StoreDir)
		}
		for name, pr := range map[string]*k8sProbe{"startupProbe": ctr.StartupProbe, "readinessProbe": ctr.ReadinessProbe, "livenessProbe": ctr.LivenessProbe} {
			if pr == nil || pr.HTTPGet == nil || !strings.HasPrefix(pr.HTTPGet.Path, "/healthz") {
				t.Errorf("%s: no %s on /healthz", where, name)
			} else if p, ok := ctr.containerPort(pr.HTTPGet.Port); !ok || p != opts.HTTPPort {
				t.Errorf("%s: %s on port %s, not the monitoring port %d", where, name, pr.HTTPGet.Port, opts.HTTPPort)
			}
		}
	}
	if len(slices.Compact(slices.Sorted(slices.Values(names)))) != len(names) || slices.Contains(names, "") {
		t.Errorf("%s: server names %v are not unique", where, names)
	}
	checkKubernetesStreamsJob(t, objs, secrets, users)
	return users
}

// checkKubernetesStreamsJob checks that the Job nats-streams connects as a user of the
// NATS servers, with the password of the Secret the servers have it from, to every
// node: the shipped Job once had no credentials, so the servers refused it and the
// queues of the nats: downstreams stayed undeclared. (deploy's TestComposeNATSCluster
// runs compose's copy of its command against real servers.)
func checkKubernetesStreamsJob(t *testing.T, objs k8sObjects, secrets k8sSecrets, users map[string]*server.User) {
	t.Helper()
	job := objs.get("Job", "nats-streams")
	if job == nil || len(job.Spec.Template.Spec.Containers) != 1 {
		t.Error("no Job nats-streams with one container")
		return
	}
	env := job.Spec.Template.Spec.Containers[0].env(t, objs, "nats-streams", secrets)
	if u := users[env["NATS_USER"]]; u == nil || u.Password != env["NATS_PASSWORD"] {
		t.Errorf("Job nats-streams: NATS_USER %q with NATS_PASSWORD: not a user of the NATS servers with the password they have (the servers refuse it)", env["NATS_USER"])
	}
	if env["NATS_URL"] == "" {
		t.Error("Job nats-streams: no NATS_URL")
	}
}
