// Package deploy_test checks the files of deploy/ against the code they deploy,
// statically (no Docker, no cluster, no network): every YAML and JSON file parses;
// every rules file that compose or Kubernetes loads passes the real validator; every
// metric that the Grafana dashboard and the alert rules query is one that sluice's
// packages register; every sluice command line and SLUICE_* variable is accepted by
// the binary built from ./cmd/sluice; and ports, images, hosts and mounts agree
// across the Dockerfile, the compose file, the Kubernetes manifests, nginx, NATS and
// Prometheus.
package deploy_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"go.yaml.in/yaml/v3"
)

// TestMain removes the binaries built for the flag checks, and fails when a
// goroutine outlives the tests (the metrics test runs an in-process NATS server).
func TestMain(m *testing.M) {
	code := m.Run()
	binaries.cleanup()
	staticBinaries.cleanup()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goroutines leaked:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// The directories of the repository, relative to deploy/ (where go test runs).
const (
	moduleRoot = ".."
	composeDir = "compose"
	k8sDir     = "kubernetes"
	rulesDir   = "rules"
)

// sluiceImage is the repository of the sluice image everywhere in deploy/.
const sluiceImage = "ghcr.io/sluicehq/sluice"

// readYAMLDocs decodes every document of a YAML file (--- separated) into generic
// values, failing the test on any syntax error.
func readYAMLDocs(t *testing.T, path string) []any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	docs, err := decodeYAMLDocs(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return docs
}

func decodeYAMLDocs(data []byte) ([]any, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var docs []any
	for {
		var v any
		err := dec.Decode(&v)
		if errors.Is(err, io.EOF) {
			return docs, nil
		}
		if err != nil {
			return nil, err
		}
		if v != nil {
			docs = append(docs, v)
		}
	}
}

// decodeYAMLInto decodes the single document of path into v.
func decodeYAMLInto(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// goModVersion returns the version go.mod requires of module (or, for "go", the go
// directive).
func goModVersion(t *testing.T, module string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(moduleRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(module) + `\s+v?([0-9][^\s]*)`)
	m := re.FindSubmatch(data)
	if m == nil {
		t.Fatalf("go.mod: no %s", module)
	}
	return string(m[1])
}

// majorMinor returns the first two numbers of a version such as 2.15.2 or 1.26.
func majorMinor(t *testing.T, v string) [2]int {
	t.Helper()
	var mm [2]int
	if _, err := fmt.Sscanf(strings.TrimPrefix(v, "v"), "%d.%d", &mm[0], &mm[1]); err != nil {
		t.Fatalf("version %q: %v", v, err)
	}
	return mm
}

func versionLess(a, b [2]int) bool { return a[0] < b[0] || (a[0] == b[0] && a[1] < b[1]) }

// splitImage splits an image reference into repository and tag ("" when none).
func splitImage(ref string) (repo, tag string) {
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, ""
}
