package linktest_test

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/linktest"
)

const self = "github.com/sluicehq/sluice/limiter/linktest"

// The package links the standard library alone: Deps lists itself and os/exec, each
// on a line of its own, and no other package of a module; Imports names what its
// files import, not what its tests do.
func TestDepsAndImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	deps := linktest.Deps(t, self)
	for _, want := range []string{self + "\n", "os/exec\n"} {
		if !strings.Contains(deps, want) {
			t.Errorf("Deps does not list %q:\n%s", want, deps)
		}
	}
	if others := strings.ReplaceAll(deps, self+"\n", ""); strings.Contains(others, "github.com/") {
		t.Errorf("Deps lists a module's package beside the package itself:\n%s", deps)
	}
	linktest.CheckDeps(t, self, []string{"github.com/sluicehq/sluice/limiter\n"}, []string{"os/exec\n"})
	imports := linktest.Imports(t, "github.com/sluicehq/sluice/limiter/...")
	got, ok := imports[self]
	if !ok || !slices.Contains(got, "os/exec") || slices.Contains(got, self) {
		t.Errorf("Imports[%s] = %v, %v", self, got, ok)
	}
}

// Build builds a program, reports its size, and the binary runs.
func TestBuild(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a program")
	}
	bin, size := linktest.Build(t, "./testdata/hello")
	if size == 0 {
		t.Fatalf("%s: size 0", bin)
	}
	out, err := exec.Command(bin).Output()
	if err != nil || string(out) != "hello\n" {
		t.Errorf("the built program: %v, output %q", err, out)
	}
}
