package pace_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/limiter/linktest"
)

// TestLightPackages: pace links neither NATS nor Redis nor the rest of sluice's
// server side; redispace adds go-redis and nothing of NATS.
func TestLightPackages(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/sluicehq/sluice/"
	for _, tc := range []struct {
		pkg            string
		banned, needed []string
	}{
		{"dispatcher/pace", []string{"github.com/nats-io/", "github.com/redis/", "github.com/prometheus/",
			mod + "ingress\n", mod + "queue\n", mod + "dispatcher\n"}, nil},
		{"dispatcher/pace/redispace", []string{"github.com/nats-io/", mod + "queue\n", mod + "dispatcher\n"},
			[]string{"github.com/redis/go-redis/v9\n"}},
	} {
		linktest.CheckDeps(t, mod+tc.pkg, tc.banned, tc.needed)
	}
}

// TestLightPacer builds a client paced by pace.Transport (testdata/pacedclient) and
// the same client on x/time/rate (testdata/rateclient), reads the modules the paced one
// links (go version -m), runs it once, and holds its size to at most 1.5× the other's
// (sizes of a given toolchain are deterministic). Both sizes are logged, with and
// without symbols:
//
//	go test -run TestLightPacer -v ./dispatcher/pace/
func TestLightPacer(t *testing.T) {
	if testing.Short() {
		t.Skip("builds programs")
	}
	paced, size := linktest.Build(t, "./testdata/pacedclient")
	rateBin, rateSize := linktest.Build(t, "./testdata/rateclient")
	mods := linktest.Go(t, "version", "-m", paced)
	if !strings.Contains(mods, "\tmod\tgithub.com/sluicehq/sluice\t") {
		t.Fatalf("go version -m does not name sluice's module; the check would prove nothing:\n%s", mods)
	}
	if rm := linktest.Go(t, "version", "-m", rateBin); !strings.Contains(rm, "\tdep\tgolang.org/x/time\t") {
		t.Fatalf("go version -m lists no dependency of the x/time/rate client; the check would prove nothing:\n%s", rm)
	}
	for _, banned := range []string{"github.com/nats-io/", "github.com/redis/", "github.com/prometheus/"} {
		if strings.Contains(mods, "\tdep\t"+banned) {
			t.Errorf("the paced client links %s…:\n%s", banned, mods)
		}
	}

	// It works: two calls through the transport.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s\n", r.URL.Path)
	}))
	defer srv.Close()
	out, err := exec.Command(paced, srv.URL+"/a", srv.URL+"/b").CombinedOutput()
	if err != nil || string(out) != "/a\n/b\n" {
		t.Errorf("pacedclient: %v, output %q", err, out)
	}

	_, stripped := linktest.Build(t, "./testdata/pacedclient", "-ldflags=-s -w")
	_, rateStripped := linktest.Build(t, "./testdata/rateclient", "-ldflags=-s -w")
	mb := func(n int64) float64 { return float64(n) / (1 << 20) }
	ratio := float64(size) / float64(rateSize)
	t.Logf("paced client: %.2f MiB (%.2f MiB with -s -w); the same on x/time/rate: %.2f MiB (%.2f MiB); ratio %.3f (%.3f)",
		mb(size), mb(stripped), mb(rateSize), mb(rateStripped), ratio, float64(stripped)/float64(rateStripped))
	if ratio > 1.5 || float64(stripped) > 1.5*float64(rateStripped) {
		t.Errorf("the paced client is %.2f× the x/time/rate one (at most 1.5×)", ratio)
	}
}
