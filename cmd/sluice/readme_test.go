package main

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/limiter/childproc"
)

// The README's blocks that run on one machine, run as a user would: in one bash, from
// a directory with the rules they name, with the sluice built for the tests as
// ./sluice (their `go build` line is what made it). The addresses they name move to
// free ports, in the commands and in the copied rules alike, so that nothing here
// depends on what else listens on the machine.

// readmeSection returns the text of the README's section (## or ###) titled title, up
// to the next heading of its level or above.
func readmeSection(t *testing.T, title string) string {
	t.Helper()
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	level, start := 0, -1
	fence := false
	for i, l := range lines {
		if strings.HasPrefix(l, "```") {
			fence = !fence
		}
		if fence || !strings.HasPrefix(l, "#") {
			continue
		}
		hashes := len(l) - len(strings.TrimLeft(l, "#"))
		switch {
		case start < 0 && strings.TrimSpace(l[hashes:]) == title:
			level, start = hashes, i+1
		case start >= 0 && hashes <= level:
			return strings.Join(lines[start:i], "\n")
		}
	}
	if start < 0 {
		t.Fatalf("README.md has no section %q", title)
	}
	return strings.Join(lines[start:], "\n")
}

// fencedBlocks returns the fenced blocks of md whose info string is lang ("" for
// none), in order.
func fencedBlocks(md, lang string) []string {
	var out []string
	for _, m := range regexp.MustCompile("(?s)```([a-z]*)\n(.*?)```").FindAllStringSubmatch(md, -1) {
		if m[1] == lang {
			out = append(out, m[2])
		}
	}
	return out
}

// readmeRun runs script (the README's commands) with bash in a new directory holding
// deploy/rules/quickstart.yaml and ./sluice, every address of ports replaced by a
// free one (in the script, the rules and env), and env added. It returns what the script
// printed (stdout and stderr, the background processes' too) with the ports put back,
// once the script has ended; every process it started is killed then.
func readmeRun(t *testing.T, script string, ports []string, env ...string) string {
	t.Helper()
	dir := t.TempDir()
	rules, err := os.ReadFile("../../deploy/rules/quickstart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	moved := map[string]string{}
	env = slices.Clone(env)
	for _, p := range ports {
		free := strings.TrimPrefix(freeAddr(t), "127.0.0.1:")
		moved[p] = free
		script = strings.ReplaceAll(script, ":"+p, ":"+free)
		rules = []byte(strings.ReplaceAll(string(rules), ":"+p, ":"+free))
		for i := range env {
			env[i] = strings.ReplaceAll(env[i], ":"+p, ":"+free)
		}
	}
	if err := os.MkdirAll(filepath.Join(dir, "deploy", "rules"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "deploy", "rules", "quickstart.yaml"), rules, 0o644); err != nil {
		t.Fatal(err)
	}
	// ./sluice dies with the bash that started it, which dies with the test (a test
	// binary that times out runs no cleanup): setpriv --pdeathsig where there is one.
	if setpriv, lerr := exec.LookPath("setpriv"); lerr == nil {
		wrapper := "#!/bin/sh\nexec " + setpriv + " --pdeathsig KILL " + sluiceBinary + ` "$@"` + "\n"
		err = os.WriteFile(filepath.Join(dir, "sluice"), []byte(wrapper), 0o755)
	} else {
		err = os.Symlink(sluiceBinary, filepath.Join(dir, "sluice"))
	}
	if err != nil {
		t.Fatal(err)
	}
	var kept []string
	for _, l := range strings.Split(script, "\n") {
		if !strings.HasPrefix(l, "go build ") { // ./sluice is the test's build
			kept = append(kept, l)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -eu\n"+strings.Join(kept, "\n"))
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = childproc.Attr()
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true // one group: the script and its background jobs
	// A file, not a pipe: the background jobs keep their copy of it open, and Wait
	// would wait for a pipe's writers to close it.
	out, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	err = cmd.Wait()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // the background jobs
	b, rerr := os.ReadFile(out.Name())
	if rerr != nil {
		t.Fatal(rerr)
	}
	text := string(b)
	for p, free := range moved {
		text = strings.ReplaceAll(text, ":"+free, ":"+p)
	}
	if err != nil {
		t.Fatalf("the README's commands failed (%v):\n%s", err, text)
	}
	if strings.Contains(text, "WARNING: DATA RACE") {
		t.Errorf("the race detector reported a race:\n%s", text)
	}
	return text
}

// varying stands for what changes from run to run in the output the README shows:
// tickets, one-time codes, Date headers, and numbers (times, seconds to wait).
var varying = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`Date: .*`), "Date: D"},
	{regexp.MustCompile(`\b[a-z2-7]{26}\b`), "TICKET"},
	{regexp.MustCompile(`\b[0-9a-f]{32}\b`), "CODE"},
	{regexp.MustCompile(`[0-9]+`), "N"},
}

func normalized(s string) string {
	for _, v := range varying {
		s = v.re.ReplaceAllString(s, v.with)
	}
	return s
}

// showsOutput checks that every line of shown, the output the README shows, is part
// of a line of got.
func showsOutput(t *testing.T, what, shown, got string) {
	t.Helper()
	lines := strings.Split(normalized(got), "\n")
	for _, want := range strings.Split(normalized(shown), "\n") {
		want = strings.TrimSpace(want)
		if want == "" {
			continue
		}
		found := false
		for _, l := range lines {
			if strings.Contains(l, want) {
				found = true
				break
			}
		}
		if !found {
			t.Errorf("%s: the README shows %q, which the commands did not print:\n%s", what, want, got)
		}
	}
}

// TestReadmeQuickStart runs the quick start (its sh blocks, in order) and checks that
// it prints what the README shows: the 429, the 202, the delivered order, the console
// line.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	md := readmeSection(t, "Quick start")
	scripts, shown := fencedBlocks(md, "sh"), fencedBlocks(md, "")
	if len(scripts) != 3 || len(shown) != 4 {
		t.Fatalf("the quick start has %d sh blocks and %d output blocks, want 3 and 4", len(scripts), len(shown))
	}
	if !strings.HasPrefix(scripts[0], "go build -o sluice ./cmd/sluice\n") {
		t.Errorf("the quick start does not start with the build:\n%s", scripts[0])
	}
	// serve listens on its defaults: the environment moves them with the rest.
	out := readmeRun(t, strings.Join(scripts, "\n"), []string{"8080", "9090", "9000"},
		"SLUICE_LISTEN=127.0.0.1:8080", "SLUICE_ADMIN_LISTEN=127.0.0.1:9090")
	for i, what := range []string{"the 429", "the 202", "the delivered order", "the console's sign-in line"} {
		showsOutput(t, what, shown[i], out)
	}
}

// TestReadmeHalvesApart runs the ingress and the dispatcher apart as the README
// shows, with its tokens and the ingress's queue key: the deferred order is delivered
// by the dispatcher, and sluice dlq reads the queue through the same listener.
func TestReadmeHalvesApart(t *testing.T) {
	t.Parallel()
	scripts := fencedBlocks(readmeSection(t, "Running the halves apart"), "sh")
	if len(scripts) != 1 {
		t.Fatalf("%d sh blocks, want 1", len(scripts))
	}
	for _, p := range []string{":4222", ":6379"} {
		if strings.Contains(scripts[0], p) {
			t.Errorf("the example uses %s, which is busy on many machines", p)
		}
	}
	out := readmeRun(t, scripts[0], []string{"8080", "9090", "9091", "9000", "14222"})
	if !strings.Contains(out, "no dead letters in queue quickstart-orders") || strings.Contains(out, "forged") {
		t.Errorf("sluice dlq list:\n%s", out)
	}
}

// TestReadmeRunCommand runs the README's command that runs sluice (go run, from the
// root of the tree) until it is ready, its addresses and data directory moved by the
// environment.
func TestReadmeRunCommand(t *testing.T) {
	t.Parallel()
	scripts := fencedBlocks(readmeSection(t, "Two commands"), "sh")
	if len(scripts) != 2 || !strings.HasPrefix(scripts[0], "go run ./cmd/sluice serve ") || strings.TrimSpace(scripts[1]) != ".ci/test" {
		t.Fatalf("the two commands are %q", scripts)
	}
	admin := freeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "exec "+strings.TrimSpace(scripts[0]))
	cmd.Dir = "../.."
	cmd.Env = append(os.Environ(), "SLUICE_LISTEN="+freeAddr(t), "SLUICE_ADMIN_LISTEN="+admin, "SLUICE_DATA_DIR="+t.TempDir())
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // go run and the sluice it starts
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := os.Create(filepath.Join(t.TempDir(), "output"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}()
	for {
		if resp, err := http.Get("http://" + admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		select {
		case <-done:
			b, _ := os.ReadFile(out.Name())
			t.Fatalf("%s exited (%v):\n%s", scripts[0], waitErr, b)
		case <-ctx.Done():
			b, _ := os.ReadFile(out.Name())
			t.Fatalf("%s not ready within 5 minutes:\n%s", scripts[0], b)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
