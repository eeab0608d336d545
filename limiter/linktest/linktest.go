// Package linktest asks the go command what the module's packages import and link,
// for the tests that keep a package light (nothing heavy linked), a program small, or
// the import graph layered.
//
// It lives under limiter, the lowest of the layers, so that a test of any folder may
// import it; it imports the standard library alone.
package linktest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Go runs the go command with args in the test's working directory and returns what
// it writes to standard output. t fails at once, with what the command wrote to
// standard error, when the command cannot start or exits with a failure.
func Go(t testing.TB, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command("go", args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s%s", strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return string(out)
}

// Deps returns the import paths that pkg links (go list -deps pkg), the standard
// library's among them, each on a line of its own ending in "\n": "x\n" is found in
// it for x alone, "x/" for every package below x.
func Deps(t testing.TB, pkg string) string {
	t.Helper()
	return Go(t, "list", "-deps", pkg)
}

// CheckDeps fails t, without stopping it, for each string of banned that is found in
// Deps(pkg) and for each of needed that is not (a needed package shows the check looks
// at the right package). It logs how many packages pkg links.
func CheckDeps(t testing.TB, pkg string, banned, needed []string) {
	t.Helper()
	deps := Deps(t, pkg)
	t.Logf("%s: %d packages", pkg, strings.Count(deps, "\n"))
	for _, b := range banned {
		if strings.Contains(deps, b) {
			t.Errorf("go list -deps %s lists %s", pkg, strings.TrimSpace(b))
		}
	}
	for _, n := range needed {
		if !strings.Contains(deps, n) {
			t.Errorf("go list -deps %s does not list %s: the check would prove nothing", pkg, strings.TrimSpace(n))
		}
	}
}

// Imports returns, for every package that pattern matches (go list pattern, for
// example "example.com/mod/..."), the import paths its non-test files import. Test
// files are left out: nothing imports a test.
func Imports(t testing.TB, pattern string) map[string][]string {
	t.Helper()
	out := Go(t, "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, pattern)
	imports := map[string][]string{}
	for line := range strings.Lines(out) {
		if fields := strings.Fields(line); len(fields) > 0 {
			imports[fields[0]] = fields[1:]
		}
	}
	if len(imports) == 0 {
		t.Fatalf("go list %s lists no package", pattern)
	}
	return imports
}

// Build builds the program pkg (a path the go command accepts, such as
// "./testdata/tool") with the build flags into a directory of t's own, and returns
// the binary's path and size in bytes. t fails at once when the build fails.
func Build(t testing.TB, pkg string, flags ...string) (bin string, size int64) {
	t.Helper()
	bin = filepath.Join(t.TempDir(), filepath.Base(pkg))
	Go(t, append(append([]string{"build", "-o", bin}, flags...), pkg)...)
	st, err := os.Stat(bin)
	if err != nil {
		t.Fatal(err)
	}
	return bin, st.Size()
}
