package main

import (
	"bufio"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// The command line itself: completion, suggestions, sizes, the version, the values in
// force that --print-config shows, and a quiet clean stop.

func TestCompletion(t *testing.T) {
	for shell, want := range map[string][]string{
		"bash": {"# bash completion V2 for sluice", "__start_sluice"},
		"zsh":  {"#compdef sluice", "_sluice"},
		"fish": {"# fish completion for sluice", "complete -c sluice"},
	} {
		code, out, errOut := runIn(t, "completion", shell)
		if code != exitOK || errOut != "" {
			t.Errorf("completion %s: exit %d, stderr %q", shell, code, errOut)
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("completion %s: the script lacks %q", shell, w)
			}
		}
	}
	if code, _, errOut := runIn(t, "completion", "tcsh"); code != exitUsage || !strings.Contains(errOut, `"tcsh"`) {
		t.Errorf("completion tcsh: exit %d, stderr %q", code, errOut)
	}
	// What the scripts ask the binary for: commands, flags and flag values.
	for _, tc := range []struct {
		args      []string
		want, not []string
	}{
		{[]string{"se"}, []string{"serve\t"}, []string{"simulate"}},
		{[]string{"rules", ""}, []string{"check\t"}, nil},
		{[]string{"serve", "--log-f"}, []string{"--log-format\t"}, []string{"--log-level"}},
		{[]string{"serve", "--log-format", ""}, []string{"text", "json"}, nil},
		{[]string{"simulate", "--algorithm", "tok"}, []string{"token_bucket"}, []string{"leaky_bucket"}},
		{[]string{"dlq", ""}, []string{"list", "requeue", "purge"}, nil},
		{[]string{"help", "ru"}, []string{"rules\t"}, nil},
	} {
		code, out, _ := runIn(t, append([]string{"__complete"}, tc.args...)...)
		if code != exitOK {
			t.Errorf("__complete %q: exit %d", tc.args, code)
		}
		for _, w := range tc.want {
			if !strings.Contains(out, w) {
				t.Errorf("__complete %q: %q lacks %q", tc.args, out, w)
			}
		}
		for _, n := range tc.not {
			if strings.Contains(out, n) {
				t.Errorf("__complete %q: %q offers %q", tc.args, out, n)
			}
		}
	}
}

func TestDidYouMean(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string // on stderr, with exit status 2
	}{
		{"command", []string{"serv"}, `sluice: unknown command "serv" for "sluice" (did you mean "serve"?)`},
		{"command, one letter off", []string{"dispatsh"}, `(did you mean "dispatch"?)`},
		{"subcommand", []string{"rules", "chek"}, `unknown command "chek" for "sluice rules" (did you mean "check"?)`},
		{"help topic", []string{"help", "simulat"}, `unknown command "simulat" for "sluice" (did you mean "simulate"?)`},
		// The closest name, not the first within two edits (rls, before rules).
		{"command, closest by edit distance", []string{"rule", "check", "x.yaml"}, `unknown command "rule" for "sluice" (did you mean "rules"?)`},
		{"command, upper case", []string{"SERVE"}, `(did you mean "serve"?)`},
		{"command, a start of one", []string{"demo"}, `(did you mean "demo-upstream"?)`},
		// A flag of another command, named as such.
		{"mistyped command with its flag", []string{"serv", "--rules", "x.yaml"},
			`sluice: unknown command "serv" for "sluice" (did you mean "serve"?): --rules is a flag of serve, not serv`},
		{"unknown command with a flag of others", []string{"frob", "--rules", "x.yaml"}, `unknown command "frob" for "sluice": --rules is a flag of dispatch, ingress, rls and serve`},
		{"flag of another command", []string{"rules", "check", "--upstream", "http://x", "x.yaml"},
			"sluice rules check: unknown flag --upstream: it is a flag of ingress and serve, not of sluice rules check"},
		{"flag", []string{"serve", "--admin-lisen", "127.0.0.1:1"}, "sluice serve: unknown flag --admin-lisen (did you mean --admin-listen?)"},
		{"flag of a subcommand", []string{"rules", "check", "--merge-domain", "x.yaml"}, "unknown flag --merge-domain (did you mean --merge-domains?)"},
		{"flag with a value", []string{"simulate", "--algoritm=token_bucket"}, "unknown flag --algoritm (did you mean --algorithm?)"},
		{"flag far from any", []string{"dlq", "list", "orders", "--frobnicate"}, "sluice dlq: unknown flag --frobnicate\n"},
		// The flag package took -rules; pflag reads one dash as shorthands.
		{"one dash", []string{"serve", "-rules", "x.yaml"}, "unknown flag -rules: long flags take two dashes: --rules"},
		{"one dash with a value", []string{"dispatch", "-data-dir=/tmp"}, "long flags take two dashes: --data-dir=/tmp"},
		{"one dash, mistyped", []string{"serve", "-rulse"}, "unknown flag -rulse (did you mean --rules?)"},
		{"boolean with a separate value", []string{"serve", "--dispatch", "false"}, `unexpected argument "false" (a boolean flag takes its value after =: --dispatch=false)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runIn(t, tc.args...)
			if code != exitUsage || out != "" {
				t.Errorf("exit %d, stdout %q", code, out)
			}
			if !strings.Contains(errOut, tc.want) {
				t.Errorf("stderr %q\nlacks %q", errOut, tc.want)
			}
			if !strings.Contains(errOut, "-h' for its flags.") {
				t.Errorf("stderr %q does not say where the flags are", errOut)
			}
		})
	}
}

// TestHelpIsDoubleDash: the help lists flags as the documentation writes them.
func TestHelpIsDoubleDash(t *testing.T) {
	for _, cmd := range []string{"serve", "ingress", "rls", "dispatch", "queue", "dlq", "simulate", "version"} {
		code, out, _ := runIn(t, cmd, "--help")
		if code != exitOK {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		_, flags, ok := strings.Cut(out, "\nFlags")
		if !ok {
			t.Fatalf("%s --help has no flags section:\n%s", cmd, out)
		}
		sc := bufio.NewScanner(strings.NewReader(flags))
		sc.Scan() // the section's title
		n := 0
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" {
				continue
			}
			n++
			if !strings.HasPrefix(line, "--") && !strings.HasPrefix(line, "-h, --help") && !strings.HasPrefix(line, "-H, --header") {
				t.Errorf("%s --help: %q is not a --flag", cmd, line)
			}
		}
		if n == 0 {
			t.Errorf("%s --help lists no flags", cmd)
		}
	}
}

func TestSizeFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want map[string]setting
	}{
		{name: "defaults", want: map[string]setting{
			"max-body": {"10MiB", "default"}, "defer-memory": {"64MiB", "default"},
			"idempotency-max-bytes": {"256MiB", "default"}, "grpc-max-message": {"10304KiB", "default"}}},
		{name: "binary units", args: []string{"--max-body", "10MiB", "--defer-memory=1GiB", "--grpc-max-message", "512KiB"},
			want: map[string]setting{"max-body": {"10MiB", "flag"}, "defer-memory": {"1GiB", "flag"}, "grpc-max-message": {"512KiB", "flag"}}},
		{name: "decimal units", args: []string{"--max-body", "10MB", "--idempotency-max-bytes", "1GB"},
			want: map[string]setting{"max-body": {"10000000", "flag"}, "idempotency-max-bytes": {"1000000000", "flag"}}},
		{name: "plain bytes", args: []string{"--max-body", "1048576", "--defer-memory", "1000"},
			want: map[string]setting{"max-body": {"1MiB", "flag"}, "defer-memory": {"1000", "flag"}}},
		{name: "zero where it means none", args: []string{"--idempotency-max-bytes", "0", "--max-body=0"},
			want: map[string]setting{"idempotency-max-bytes": {"0", "flag"}, "max-body": {"0", "flag"}}},
		{name: "environment", env: map[string]string{"SLUICE_MAX_BODY": "2GiB", "SLUICE_IDEMPOTENCY_MAX_BYTES": "64 mib"},
			want: map[string]setting{"max-body": {"2GiB", "env SLUICE_MAX_BODY"}, "idempotency-max-bytes": {"64MiB", "env SLUICE_IDEMPOTENCY_MAX_BYTES"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			got := printedConfig(t, append([]string{"serve"}, tc.args...)...)
			for key, want := range tc.want {
				if got[key] != want {
					t.Errorf("%s = %+v, want %+v", key, got[key], want)
				}
			}
		})
	}
	file := writeFile(t, "sluice.yaml", "max-body: 512KiB\nidempotency-max-bytes: 1048576\n")
	got := printedConfig(t, "dispatch", "--config", file)
	if got["idempotency-max-bytes"] != (setting{"1MiB", "file"}) {
		t.Errorf("from a file: idempotency-max-bytes = %+v", got["idempotency-max-bytes"])
	}
	for i, tc := range []struct {
		args []string
		env  string
		want string
	}{
		{args: []string{"serve", "--max-body", "10MiBs"}, want: `sluice serve: invalid value "10MiBs" for --max-body: want a size in bytes, plain or with a unit`},
		{args: []string{"serve", "--max-body", "-1"}, want: `invalid value "-1" for --max-body: want a size`},
		{args: []string{"dispatch", "--idempotency-max-bytes", "99999999999TiB"}, want: "want a size in bytes, plain or with a unit: 1048576, 64KiB, 10MiB, 1GiB (or KB, MB, GB) (too large)"},
		{args: []string{"serve"}, env: "lots", want: `environment variable SLUICE_MAX_BODY (for --max-body): invalid value "lots": want a size`},
		{args: []string{"serve", "--rules", "x.yaml", "--upstream", "http://x", "--defer-memory", "0"}, want: "--defer-memory must be more than 0"},
		{args: []string{"ingress", "--rules", "x.yaml", "--upstream", "http://x", "--max-upstream-header", "0"}, want: "--max-upstream-header must be more than 0"},
		{args: []string{"serve", "--rules", "x.yaml", "--upstream", "http://x", "--upstream-reuse-after", "-1s"}, want: "--upstream-reuse-after must not be negative"},
		{args: []string{"serve", "--rules", "x.yaml", "--upstream", "http://x", "--upstream-max-hold", "0s"}, want: "--upstream-max-hold must be more than 0"},
		{args: []string{"rls", "--grpc-max-message", "1KiB", "--rules", "x.yaml"}, want: "--grpc-max-message must be between 4KiB and 1GiB"},
	} {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SLUICE_MAX_BODY", tc.env)
			}
			code, out, errOut := runIn(t, tc.args...)
			if code != exitUsage || out != "" || !strings.Contains(errOut, tc.want) {
				t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", tc.args, code, out, errOut, tc.want)
			}
		})
	}
}

func TestSizeFlagRoundTrip(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "1": 1, "1000": 1000, "1024": 1024, "4KiB": 4 << 10, "10MiB": 10 << 20,
		"1GiB": 1 << 30, "3GiB": 3 << 30, "1KB": 1000, "1 mb": 1e6, " 64MiB ": 64 << 20, "1536KiB": 1536 << 10} {
		var s sizeFlag
		if err := s.Set(in); err != nil {
			t.Errorf("Set(%q): %v", in, err)
			continue
		}
		if int64(s) != want {
			t.Errorf("Set(%q) = %d, want %d", in, s, want)
		}
		var again sizeFlag
		if err := again.Set(s.String()); err != nil || again != s {
			t.Errorf("%q printed as %q, read back as %d (%v)", in, s.String(), again, err)
		}
	}
	for _, bad := range []string{"", "-1", "1.5MiB", "MiB", "10 apples", "0x10", "99999999999999999999"} {
		var s sizeFlag
		if err := s.Set(bad); err == nil {
			t.Errorf("Set(%q) = %d, want an error", bad, s)
		}
	}
}

// FuzzSizeFlag: whatever a size flag takes, it prints in a form it takes back as the
// same size (--print-config output fed to --config).
func FuzzSizeFlag(f *testing.F) {
	for _, s := range []string{"0", "1", "64MiB", "1GB", "10 kib", "1536KiB", "4611686018427387904", "-1", "1e6", "9TiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var s sizeFlag
		if err := s.Set(in); err != nil {
			return
		}
		if s < 0 {
			t.Fatalf("Set(%q) = %d", in, s)
		}
		var again sizeFlag
		if err := again.Set(s.String()); err != nil || again != s {
			t.Fatalf("Set(%q) = %d printed %q, read back %d (%v)", in, s, s.String(), again, err)
		}
	})
}

func FuzzReplicasFlag(f *testing.F) {
	for _, s := range []string{"auto", "AUTO", "0", "1", "3", "5", "6", "-1", " 2 ", "three"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		var r replicasFlag
		if err := r.Set(in); err != nil {
			return
		}
		if r < 0 || r > 5 {
			t.Fatalf("Set(%q) = %d", in, r)
		}
		var again replicasFlag
		if err := again.Set(r.String()); err != nil || again != r {
			t.Fatalf("Set(%q) = %d printed %q, read back %d (%v)", in, r, r.String(), again, err)
		}
	})
}

// TestPrintConfigValuesInForce: the defaults that depend on other flags or on where the
// queues live are shown worked out, not as the 0 that stands for them.
func TestPrintConfigValuesInForce(t *testing.T) {
	got := printedConfig(t, "serve")
	for key, want := range map[string]setting{
		"ack-wait":         {"1m0s", "default (delivery-timeout + 30s)"},
		"delivery-timeout": {"30s", "default"},
		"replicas":         {"1", "default (the embedded server: one copy)"},
	} {
		if got[key] != want {
			t.Errorf("serve: %s = %+v, want %+v", key, got[key], want)
		}
	}
	got = printedConfig(t, "dispatch", "--delivery-timeout", "5s", "--nats", "nats://127.0.0.1:1", "--queue-key", testQueueKey)
	if got["ack-wait"] != (setting{"35s", "default (delivery-timeout + 30s)"}) {
		t.Errorf("dispatch: ack-wait = %+v", got["ack-wait"])
	}
	if got["replicas"] != (setting{"auto", "default (3 on a NATS cluster, 1 on a single server, once connected)"}) {
		t.Errorf("dispatch with --nats: replicas = %+v", got["replicas"])
	}
	t.Setenv("SLUICE_ACK_WAIT", "2m")
	got = printedConfig(t, "serve", "--replicas", "3", "--delivery-timeout", "5s")
	if got["ack-wait"] != (setting{"2m0s", "env SLUICE_ACK_WAIT"}) || got["replicas"] != (setting{"3", "flag"}) {
		t.Errorf("given: ack-wait = %+v, replicas = %+v", got["ack-wait"], got["replicas"])
	}
	// The printed configuration is taken back as it is.
	_, out, _ := runIn(t, "dispatch", "--nats", "nats://127.0.0.1:1", "--queue-key", testQueueKey, "--print-config")
	again := printedConfig(t, "dispatch", "--config", writeFile(t, "printed.yaml", out))
	if again["replicas"] != (setting{"auto", "file"}) || again["ack-wait"].value != "2m0s" {
		t.Errorf("read back: replicas = %+v, ack-wait = %+v", again["replicas"], again["ack-wait"])
	}
	if code, _, errOut := runIn(t, "serve", "--replicas", "7"); code != exitUsage || !strings.Contains(errOut, `invalid value "7" for --replicas: want auto or a count from 1 to 5`) {
		t.Errorf("--replicas 7: exit %d, %q", code, errOut)
	}
	// What is printed is what runs: resolveDefaults fills the configuration itself.
	var cfg gatewayConfig
	cmd := gatewayCommand(dispatchMode, "", nil, nil)
	cfg.disp.deliveryTimeout = 7 * time.Second
	cfg.resolveDefaults(cmd.Flags(), &flagSources{})
	if cfg.disp.ackWait != 37*time.Second || cfg.nats.replicas != 1 {
		t.Errorf("resolved ack wait %s, replicas %d", cfg.disp.ackWait, cfg.nats.replicas)
	}
}

// TestVersion runs the built binary: its version lines are the build information the
// Go toolchain recorded in it, as `go version -m` reads it. (The go command records no
// revision for a build in a git worktree; TestFormatVersion covers one with it.)
func TestVersion(t *testing.T) {
	out, err := exec.Command(sluiceBinary, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	again, err := exec.Command(sluiceBinary, "--version").Output()
	if err != nil || string(again) != string(out) {
		t.Errorf("--version printed %q (%v), version %q", again, err, out)
	}
	meta, err := exec.Command("go", "version", "-m", sluiceBinary).Output()
	if err != nil {
		t.Fatal(err)
	}
	recorded := map[string]string{}
	for _, l := range strings.Split(string(meta), "\n") {
		f := strings.Fields(l)
		switch {
		case len(f) >= 3 && f[0] == "mod" && f[1] == "github.com/sluicehq/sluice":
			recorded["version"] = f[2]
		case len(f) == 2 && f[0] == "build":
			if k, v, ok := strings.Cut(f[1], "="); ok {
				recorded[k] = v
			}
		}
	}
	want := "sluice " + recorded["version"] + "\n"
	if rev := recorded["vcs.revision"]; rev != "" {
		want += "revision: " + rev + "\ntime: " + recorded["vcs.time"] + "\nmodified: " + recorded["vcs.modified"] + "\n"
	} else {
		want += "revision: unknown (built without version control information)\n"
	}
	want += "go: " + strings.TrimSpace(strings.TrimPrefix(strings.SplitN(string(meta), "\n", 2)[0], sluiceBinary+":")) +
		" " + recorded["GOOS"] + "/" + recorded["GOARCH"] + "\n"
	if recorded["vcs.revision"] == "" && recorded["version"] == "(devel)" {
		want += unnamedBuild
	}
	if string(out) != want {
		t.Errorf("sluice version printed\n%s\nwant (from go version -m)\n%s", out, want)
	}
}

// TestVersionFromLdflags builds sluice as the README's build line does with
// -buildvcs=false (no version control information, as GOFLAGS has it on many build
// machines) and the version named at link time: that version is the first line.
func TestVersionFromLdflags(t *testing.T) {
	t.Parallel()
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-buildvcs=false", "-ldflags", "-X main.version=v0.0.0-readme", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "version").Output()
	if err != nil {
		t.Fatal(err)
	}
	if want := "sluice v0.0.0-readme\nrevision: unknown (built without version control information)\ngo: "; !strings.HasPrefix(string(out), want) ||
		strings.Contains(string(out), unnamedBuild) {
		t.Errorf("sluice version printed\n%s\nwant it to start\n%s", out, want)
	}
}

func TestFormatVersion(t *testing.T) {
	platform := runtime.GOOS + "/" + runtime.GOARCH
	stamped := &debug.BuildInfo{GoVersion: "go1.26.0", Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v0.0.0-20261130104100-4073f49abcde+dirty"},
		Settings: []debug.BuildSetting{{Key: "-buildmode", Value: "exe"}, {Key: "vcs", Value: "git"},
			{Key: "vcs.revision", Value: "4073f49abcde0123456789abcdef0123456789ab"}, {Key: "vcs.time", Value: "2026-11-30T10:41:00Z"},
			{Key: "vcs.modified", Value: "true"}}}
	for _, tc := range []struct {
		name, link string
		info       *debug.BuildInfo
		want       string
	}{
		{"stamped", "", stamped, "sluice v0.0.0-20261130104100-4073f49abcde+dirty\nrevision: 4073f49abcde0123456789abcdef0123456789ab\n" +
			"time: 2026-11-30T10:41:00Z\nmodified: true\ngo: go1.26.0 " + platform + "\n"},
		{"link-time version wins", "v1.2.3", stamped, "sluice v1.2.3\nrevision: 4073f49abcde0123456789abcdef0123456789ab\n" +
			"time: 2026-11-30T10:41:00Z\nmodified: true\ngo: go1.26.0 " + platform + "\n"},
		{"go install of a tag", "", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "v1.4.0"}},
			"sluice v1.4.0\nrevision: unknown (built without version control information)\ngo: go1.26.1 " + platform + "\n"},
		{"no build information", "", nil, "sluice (unknown)\nrevision: unknown (built without version control information)\ngo: " +
			runtime.Version() + " " + platform + "\n" + unnamedBuild},
		// GOFLAGS=-buildvcs=false, as on this project's build machines.
		{"a local build without VCS stamping", "", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}},
			"sluice (devel)\nrevision: unknown (built without version control information)\ngo: go1.26.1 " + platform + "\n" + unnamedBuild},
		{"the same, named at link time", "v0.9.0-3-g0474f4d", &debug.BuildInfo{GoVersion: "go1.26.1", Main: debug.Module{Version: "(devel)"}},
			"sluice v0.9.0-3-g0474f4d\nrevision: unknown (built without version control information)\ngo: go1.26.1 " + platform + "\n"},
	} {
		if got := formatVersion(tc.link, tc.info); got != tc.want {
			t.Errorf("%s:\n%s\nwant\n%s", tc.name, got, tc.want)
		}
	}
}

// TestServeStopsQuietly: SIGTERM stops serve with status 0, and nothing from the
// shutdown on is a warning or an error (a clean NATS close is no "disconnected").
func TestServeStopsQuietly(t *testing.T) {
	t.Parallel()
	up, down := newUpstream(t, 0), newDownstream(t, 0)
	rulesPath := writeRules(t, t.TempDir(), deferRules(down.URL, "outflow: {rate: 50/s}"))
	p := startSluice(t, "--rules", rulesPath, "--upstream", up.URL, "--shutdown-timeout", "20s")
	warmUp(t, p.url, "/v1/orders")
	mustDefer(t, p.url, "/v1/orders", "quiet-1")
	if code := p.stop(t); code != 0 {
		t.Fatalf("exit %d after SIGTERM:\n%s", code, p.output)
	}
	out := p.output.String()
	_, after, ok := strings.Cut(out, "msg=\"shutting down\"")
	if !ok {
		t.Fatalf("no shutdown logged:\n%s", out)
	}
	for _, bad := range []string{"level=WARN", "level=ERROR", "NATS disconnected", "panic"} {
		if strings.Contains(after, bad) {
			t.Errorf("the clean stop logged %q:\n%s", bad, after)
		}
	}
	if !strings.Contains(after, "NATS connection closed") {
		t.Errorf("the close of the NATS connection is not logged at debug level:\n%s", after)
	}
}

func TestExplainArgs(t *testing.T) {
	for _, tc := range []struct{ in, want []string }{
		{[]string{"rules", "check", "--explain", "GET", "/x", "a.yaml"}, []string{"rules", "check", "--explain=GET /x", "a.yaml"}},
		{[]string{"rules", "check", "a.yaml", "--explain", "GET"}, []string{"rules", "check", "a.yaml", "--explain", "GET"}},
		{[]string{"rules", "check", "--explain", "GET", "-H", "x"}, []string{"rules", "check", "--explain", "GET", "-H", "x"}},
		{[]string{"rules", "check", "--", "--explain", "GET", "/x"}, []string{"rules", "check", "--", "--explain", "GET", "/x"}},
		{[]string{"serve", "--explain", "GET", "/x"}, []string{"serve", "--explain", "GET", "/x"}},
	} {
		if got := explainArgs(tc.in); strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("explainArgs(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
	code, out, _ := runIn(t, "rules", "check", "--explain", "GET /health", "../../deploy/rules")
	if code != exitOK || !strings.Contains(out, "request: GET /health") {
		t.Errorf("--explain in one word: exit %d\n%s", code, out)
	}
}

// TestForwardedHeaderFlag: --forwarded-header takes x-forwarded-for (the default) or
// forwarded, from the command line, the environment or the file, and refuses
// anything else before anything starts: a header the trusted proxies do not write
// would let clients name their own address.
func TestForwardedHeaderFlag(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  string
		file string
		args []string
		want setting
	}{
		{name: "default", want: setting{"x-forwarded-for", "default"}},
		{name: "flag", args: []string{"--forwarded-header", "forwarded"}, want: setting{"forwarded", "flag"}},
		{name: "flag in another case", args: []string{"--forwarded-header=X-Forwarded-For"}, want: setting{"x-forwarded-for", "flag"}},
		{name: "environment", env: "Forwarded", want: setting{"forwarded", "env SLUICE_FORWARDED_HEADER"}},
		{name: "file", file: "forwarded-header: forwarded\n", want: setting{"forwarded", "file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SLUICE_FORWARDED_HEADER", tc.env)
			}
			args := append([]string{"serve"}, tc.args...)
			if tc.file != "" {
				args = append(args, "--config", writeFile(t, "sluice.yaml", tc.file))
			}
			if got := printedConfig(t, args...)["forwarded-header"]; got != tc.want {
				t.Errorf("forwarded-header = %+v, want %+v", got, tc.want)
			}
		})
	}
	for _, cmd := range []string{"serve", "ingress", "rls"} {
		code, out, errOut := runIn(t, cmd, "--rules", "x.yaml", "--upstream", "http://x", "--forwarded-header", "x-real-ip")
		want := `invalid value "x-real-ip" for --forwarded-header: want x-forwarded-for or forwarded`
		if cmd == "rls" {
			code, out, errOut = runIn(t, cmd, "--rules", "x.yaml", "--forwarded-header", "x-real-ip")
		}
		if code != exitUsage || out != "" || !strings.Contains(errOut, want) {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit 2 and %q", cmd, code, out, errOut, want)
		}
	}
}
