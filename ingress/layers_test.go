package ingress

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/linktest"
)

// layers are the module's top-level folders, highest first. The direction rule: a
// package may import a package of another folder only when that folder is on a lower
// line, so every arrow between folders points down and a helper that two folders share
// lives in (a sub-package of) the lower one. Folders on one line are peers and import
// nothing of each other. Within a folder the packages arrange themselves. Test files
// are left out: nothing imports a test, so a test that drives a path end to end from a
// lower folder (queue/subscriber's tests run the dispatcher) makes no arrow.
var layers = [][]string{
	{"cmd", "deploy"},         // the programs and the checks of what deploys them
	{"ingress", "dispatcher"}, // the front door and the delivery: they meet in queue
	{"rules"},                 // compiles into limits and queue settings
	{"queue"},                 // the queues, their settings in limiter's rates
	{"limiter"},               // the bottom: the limiter core and what every folder's tests share (the test servers' launcher, go list)
}

// layerOf returns the line of layers that folder is on, or -1.
func layerOf(folder string) int {
	for i, l := range layers {
		for _, f := range l {
			if f == folder {
				return i
			}
		}
	}
	return -1
}

// mayImport reports whether a package of folder from may import one of folder to.
func mayImport(from, to string) bool {
	return from == to || layerOf(from) < layerOf(to)
}

// TestImportDirection: no package of the module imports one of a folder that is
// above it or beside it in layers (go list -f '{{.Imports}}' of every package).
func TestImportDirection(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	for _, bad := range [][2]string{{"queue", "dispatcher"}, {"queue", "ingress"}, {"dispatcher", "ingress"},
		{"limiter", "queue"}, {"queue", "rules"}, {"rules", "ingress"}} {
		if mayImport(bad[0], bad[1]) {
			t.Fatalf("the rule lets %s import %s: the check would prove nothing", bad[0], bad[1])
		}
	}
	const mod = "github.com/sluicehq/sluice"
	imports := linktest.Imports(t, mod+"/...")
	folder := func(pkg string) string {
		rel := strings.TrimPrefix(strings.TrimPrefix(pkg, mod), "/")
		f, _, _ := strings.Cut(rel, "/")
		return f
	}
	arrows := 0
	for _, pkg := range slices.Sorted(maps.Keys(imports)) {
		from := folder(pkg)
		if layerOf(from) < 0 {
			t.Errorf("%s: folder %q is in no layer; give it a line in layers", pkg, from)
			continue
		}
		for _, imp := range imports[pkg] {
			if imp != mod && !strings.HasPrefix(imp, mod+"/") {
				continue
			}
			to := folder(imp)
			if from != to {
				arrows++
			}
			if !mayImport(from, to) {
				t.Errorf("%s imports %s: an arrow from %s up or across to %s (move what both use down, into %s or below)",
					pkg, imp, from, to, from)
			}
		}
	}
	if arrows == 0 {
		t.Fatalf("go list shows no import between folders among %d packages; the check would prove nothing", len(imports))
	}
	t.Logf("%d imports between folders", arrows)
}
