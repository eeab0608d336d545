package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRootModuleLight checks why this tool is a module of its own: the library's
// go.mod requires none of the peers that only the benchmarks use, and asks for no
// newer Go than the newest its dependencies ask for, so users need no patch-level
// toolchain for sluice's sake.
func TestRootModuleLight(t *testing.T) {
	root := filepath.Join("..", "..")
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	goMod := string(data)
	// golang.org/x/time may stay as an indirect requirement: nats-server needs it.
	peers := []string{"github.com/tsenart/vegeta", "github.com/go-redis/redis_rate", "golang.org/x/time", "github.com/envoyproxy/ratelimit"}
	var directive string
	for _, l := range strings.Split(goMod, "\n") {
		l = strings.TrimSpace(l)
		if v, ok := strings.CutPrefix(l, "go "); ok {
			directive = strings.TrimSpace(v)
		}
		for _, peer := range peers {
			if strings.Contains(l, peer) && !strings.HasSuffix(l, "// indirect") {
				t.Errorf("the root go.mod requires %s, a peer of the load tool only: %q", peer, l)
			}
		}
	}
	if strings.Contains(goMod, "\ntoolchain ") {
		t.Errorf("the root go.mod has a toolchain line")
	}

	cmd := exec.Command("go", "list", "-m", "-f", "{{if not .Main}}{{.Path}} {{.GoVersion}}{{end}}", "all")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -m all: %v", err)
	}
	newest, by := "", ""
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		path, v, ok := strings.Cut(l, " ")
		if ok && v != "" && goVersionLess(newest, v) {
			newest, by = v, path
		}
	}
	if newest == "" {
		t.Fatalf("no go directive among the dependencies:\n%s", out)
	}
	if goVersionLess(directive, newest) || goVersionLess(newest, directive) {
		t.Errorf("root go.mod says go %s; the newest any dependency asks for is %s (%s): use that", directive, newest, by)
	}
}

// goVersionLess compares Go versions such as 1.25, 1.26.0 and 1.26.8 ("" is the least).
func goVersionLess(a, b string) bool {
	pa, pb := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < max(len(pa), len(pb)); i++ {
		var x, y int
		if i < len(pa) {
			x = atoiOr0(pa[i])
		}
		if i < len(pb) {
			y = atoiOr0(pb[i])
		}
		if x != y {
			return x < y
		}
	}
	return false
}

func atoiOr0(s string) int {
	n := 0
	for _, c := range s {
		if c < '0' || c > '9' {
			break
		}
		n = n*10 + int(c-'0')
	}
	return n
}
