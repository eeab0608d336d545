package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// Shape only: a tiny run of each mode must produce its table. Timing on a shared CI
// machine means nothing, so no figure is asserted.

func TestPacingTable(t *testing.T) {
	out, errOut, code := benchRun(t, "pacing", "--rates", "20", "--duration", "300ms", "--stall", "0")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, contender := range []string{"sluice pacer", "sluice transport", "sluice dispatcher", "x/time/rate", "time.Ticker", "deadline loop"} {
		if !strings.Contains(out, contender) {
			t.Errorf("no row for %s in\n%s", contender, out)
		}
	}
}

func TestParkingTable(t *testing.T) {
	contenders := []string{"jetstream publish", "sluice park", "sluice ingress (HTTP 202)", "sluice park+idem", "sluice ingress+idem (HTTP 202)"}
	for _, tc := range []struct {
		args []string
		rows []string
	}{
		{[]string{"--client", "lean"}, contenders},
		{[]string{"--client", "net/http"}, contenders},
		{[]string{"--server", "net/http"}, contenders},
		{[]string{"--ceiling"}, append(slices.Clone(contenders), parkingShape, parkingCeiling, parkingBare)},
	} {
		args := append([]string{"parking", "--duration", "200ms", "--rounds", "1", "--concurrency", "2"}, tc.args...)
		out, errOut, code := benchRun(t, args...)
		if code != exitOK {
			t.Fatalf("%s: exit %d: %s", tc.args, code, errOut)
		}
		for _, contender := range tc.rows {
			if !strings.Contains(out, contender) {
				t.Errorf("%s: no row for %s in\n%s", tc.args, contender, out)
			}
		}
	}
	if _, errOut, code := benchRun(t, "parking", "--client", "curl"); code != exitUsage || !strings.Contains(errOut, "neither lean nor net/http") {
		t.Errorf("--client curl: exit %d: %s", code, errOut)
	}
	if _, errOut, code := benchRun(t, "parking", "--server", "nginx"); code != exitUsage || !strings.Contains(errOut, "neither fast nor net/http") {
		t.Errorf("--server nginx: exit %d: %s", code, errOut)
	}
}

func TestPacingJSON(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "pacing.svg")
	out, errOut, code := benchRun(t, "pacing", "--rates", "20,5/100ms", "--duration", "200ms", "--stall", "0", "--dispatcher=false", "--json", "--svg", svg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Mode       string         `json:"mode"`
		Rates      []string       `json:"rates"`
		Duration   string         `json:"duration"`
		Window     string         `json:"window"`
		Dispatcher *bool          `json:"dispatcher"`
		Results    []pacingResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "pacing" || len(doc.Rates) != 2 || doc.Duration != "200ms" || doc.Window != "100ms" || doc.Dispatcher == nil || *doc.Dispatcher {
		t.Errorf("parameters: %s", out)
	}
	if len(doc.Results) != 2*5 {
		t.Fatalf("%d results, want 5 contenders at 2 rates: %s", len(doc.Results), out)
	}
	for _, r := range doc.Results {
		if r.Contender == "" || r.Rate == "" || r.Events < 1 || r.Bound < 2 {
			t.Errorf("result %+v", r)
		}
	}
	doc2 := readSVG(t, svg, len(doc.Results))
	for _, group := range []string{"rate " + doc.Results[0].Rate, "rate " + doc.Results[5].Rate} {
		found := false
		for _, s := range doc2.texts {
			found = found || s == group
		}
		if !found {
			t.Errorf("no group heading %q in the chart", group)
		}
	}
}

func TestParkingJSON(t *testing.T) {
	svg := filepath.Join(t.TempDir(), "parking.svg")
	out, errOut, code := benchRun(t, "parking", "--duration", "100ms", "--rounds", "2", "--concurrency", "1,2", "--size", "64", "--json", "--svg", svg)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var doc struct {
		Mode        string          `json:"mode"`
		Duration    string          `json:"duration"`
		Concurrency []int           `json:"concurrency"`
		Size        int             `json:"size"`
		Rounds      int             `json:"rounds"`
		Results     []parkingResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("not one JSON document: %v\n%s", err, out)
	}
	if doc.Mode != "parking" || doc.Duration != "100ms" || len(doc.Concurrency) != 2 || doc.Size != 64 || doc.Rounds != 2 {
		t.Errorf("parameters: %s", out)
	}
	if len(doc.Results) != 2*5 {
		t.Fatalf("%d results, want 5 contenders with 1 and 2 callers: %s", len(doc.Results), out)
	}
	for _, r := range doc.Results {
		if r.Orders < 2 || r.PerSecond <= 0 || (r.Contender == parkingRaw) != (r.VsRaw == 0) { // an order at least per round
			t.Errorf("result %+v", r)
		}
	}
	readSVG(t, svg, len(doc.Results))
}

// --cpuprofile writes one profile per contender, caller count and round (a profile is
// gzipped protobuf).
func TestParkingCPUProfiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "profiles")
	if _, errOut, code := benchRun(t, "parking", "--duration", "100ms", "--rounds", "2", "--concurrency", "1", "--cpuprofile", dir); code != exitOK {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, name := range []string{"jetstream-publish", "sluice-park", "sluice-ingress", "sluice-park+idem", "sluice-ingress+idem"} {
		for _, round := range []string{"r1", "r2"} {
			b, err := os.ReadFile(filepath.Join(dir, name+"-1-"+round+".pprof"))
			if err != nil {
				t.Fatal(err)
			}
			if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
				t.Errorf("%s %s: not a gzipped profile (%d bytes)", name, round, len(b))
			}
		}
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 10 {
		t.Errorf("%d files in %s, want 10", len(entries), dir)
	}
}

func TestProfileName(t *testing.T) {
	for _, tc := range []struct{ contender, want string }{
		{parkingRaw, "jetstream-publish"},
		{"sluice park+idem", "sluice-park+idem"},
		{"sluice ingress (HTTP 202)", "sluice-ingress"},
		{"sluice ingress+idem (HTTP 202)", "sluice-ingress+idem"},
	} {
		if got := profileName(tc.contender); got != tc.want {
			t.Errorf("profileName(%q) = %q, want %q", tc.contender, got, tc.want)
		}
	}
}
