package deploy_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// binaries builds ./cmd/sluice and ./cmd/sluice-bench once per test run: the flags,
// commands and modes that deploy/ uses are checked against what these binaries
// accept, not against a list kept by hand.
var binaries builtBinaries

// staticBinaries are the same built without cgo, as deploy/Dockerfile builds them:
// the compose test's image holds them alone.
var staticBinaries = builtBinaries{static: true}

type builtBinaries struct {
	static bool
	once   sync.Once
	dir    string
	err    error

	mu    sync.Mutex
	flags map[string]flagSet // by sluice subcommand
}

func (b *builtBinaries) build(t *testing.T) string {
	t.Helper()
	b.once.Do(func() {
		b.dir, b.err = os.MkdirTemp("", "sluice-deploy-test-")
		if b.err != nil {
			return
		}
		// sluice-bench is a module of its own, built from its directory.
		for _, dir := range []string{"cmd/sluice", "cmd/sluice-bench"} {
			cmd := exec.Command("go", "build", "-o", b.dir+string(filepath.Separator), ".")
			cmd.Dir = filepath.Join(moduleRoot, dir)
			if b.static {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				b.err = fmt.Errorf("go build ./%s: %w\n%s", dir, err, out)
				return
			}
		}
	})
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.dir
}

func (b *builtBinaries) cleanup() {
	if b.dir != "" {
		os.RemoveAll(b.dir)
	}
}

// run runs one of the built binaries with a clean SLUICE_* environment, bounded in
// time, and returns its exit status, stdout and stderr.
func (b *builtBinaries) run(t *testing.T, name string, args ...string) (int, string, string) {
	t.Helper()
	bin := filepath.Join(b.build(t), name)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Dir = t.TempDir() // never the repository: an accidental start would write there
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SLUICE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: still running after 20s", name, strings.Join(args, " "))
	}
	code := 0
	if err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) {
			t.Fatalf("%s: %v", name, err)
		}
		code = ee.ExitCode()
	}
	return code, stdout.String(), stderr.String()
}

// flagSet is a subcommand's flags as its -h lists them.
type flagSet map[string]flagInfo

type flagInfo struct {
	isBool bool
	def    string // the default, unquoted; "" when -h shows none
}

// flagLine is a flag as pflag's help lists it, one to a line: an optional shorthand,
// --name, the kind of value (none for a boolean), at least two spaces, the usage and
// perhaps "(default …)".
var (
	flagLine    = regexp.MustCompile(`^\s+(?:-[A-Za-z0-9], )?--([A-Za-z0-9][A-Za-z0-9_.-]*)( [^ ].*?)?  +(.*)$`)
	defaultPart = regexp.MustCompile(`\(default (.*)\)$`)
)

// sluiceCommands returns the subcommands that `sluice -h` lists.
func sluiceCommands(t *testing.T) []string {
	t.Helper()
	code, out, errOut := binaries.run(t, "sluice", "-h")
	if code != 0 {
		t.Fatalf("sluice -h: exit %d\n%s", code, errOut)
	}
	var cmds []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "Commands:"):
			in = true
		case in && strings.HasPrefix(line, "  "):
			cmds = append(cmds, strings.Fields(line)[0])
		case in:
			in = false
		}
	}
	if len(cmds) == 0 {
		t.Fatalf("sluice -h lists no commands:\n%s", out)
	}
	return cmds
}

// sluiceFlags returns the flags of `sluice CMD`, from `sluice CMD -h`.
func sluiceFlags(t *testing.T, cmd string) flagSet {
	t.Helper()
	binaries.mu.Lock()
	fs, ok := binaries.flags[cmd]
	binaries.mu.Unlock()
	if ok {
		return fs
	}
	if !slices.Contains(sluiceCommands(t), cmd) {
		t.Fatalf("sluice has no command %q (sluice -h lists %v)", cmd, sluiceCommands(t))
	}
	code, out, errOut := binaries.run(t, "sluice", cmd, "-h")
	if code != 0 {
		t.Fatalf("sluice %s -h: exit %d\n%s", cmd, code, errOut)
	}
	fs = flagSet{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		m := flagLine.FindStringSubmatch(sc.Text())
		if m == nil || m[1] == "help" {
			continue
		}
		// pflag writes the kind of value (or the `name` of the usage) after every
		// flag but booleans.
		f := flagInfo{isBool: m[2] == ""}
		if d := defaultPart.FindStringSubmatch(m[3]); d != nil {
			f.def = d[1]
			if s, err := strconv.Unquote(d[1]); err == nil {
				f.def = s
			}
		}
		fs[m[1]] = f
	}
	if len(fs) == 0 {
		t.Fatalf("sluice %s -h lists no flags:\n%s", cmd, out)
	}
	binaries.mu.Lock()
	if binaries.flags == nil {
		binaries.flags = map[string]flagSet{}
	}
	binaries.flags[cmd] = fs
	binaries.mu.Unlock()
	return fs
}

// benchModes returns the modes that `sluice-bench -h` lists.
func benchModes(t *testing.T) []string {
	t.Helper()
	code, out, errOut := binaries.run(t, "sluice-bench", "-h")
	if code != 0 {
		t.Fatalf("sluice-bench -h: exit %d\n%s", code, errOut)
	}
	var modes []string
	in := false
	for _, line := range strings.Split(out, "\n") {
		switch {
		case strings.HasPrefix(line, "Modes:"):
			in = true
		case in && strings.HasPrefix(line, "  "):
			modes = append(modes, strings.Fields(line)[0])
		case in:
			in = false
		}
	}
	return modes
}

// envName is the SLUICE_* variable of a flag (cmd/sluice: upper case, dashes as
// underscores).
func envName(flag string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// gatewayConfig is what one sluice process is started with: its command, flags
// (from the command line) and SLUICE_* environment (image, then container).
type gatewayConfig struct {
	where string // for messages
	cmd   string
	flags map[string]string
	env   map[string]string // SLUICE_* only
	known flagSet
}

// parseSluiceArgs checks a sluice command line (without the binary) the way pflag
// reads it (--name value, --name=value; a boolean takes no separate value), against
// the flags `sluice CMD -h` lists, then has the
// binary itself parse it (with -h appended, so that it parses every flag and value
// and exits without starting). env are the SLUICE_* variables the process gets; each
// must name a flag, and its value must parse as that flag's.
func parseSluiceArgs(t *testing.T, where string, args []string, env map[string]string) gatewayConfig {
	t.Helper()
	if len(args) == 0 {
		t.Fatalf("%s: sluice without a command", where)
	}
	g := gatewayConfig{where: where, cmd: args[0], flags: map[string]string{}, env: map[string]string{}}
	g.known = sluiceFlags(t, g.cmd)
	rest := args[1:]
	for i := 0; i < len(rest); i++ {
		a := rest[i]
		if a == "--" || !strings.HasPrefix(a, "-") || a == "-" {
			t.Fatalf("%s: sluice %s takes no arguments, got %q", where, g.cmd, a)
		}
		if !strings.HasPrefix(a, "--") {
			t.Fatalf("%s: %q: sluice's long flags take two dashes", where, a)
		}
		name, value, hasValue := strings.Cut(strings.TrimLeft(a, "-"), "=")
		f, ok := g.known[name]
		if !ok {
			t.Fatalf("%s: sluice %s has no flag --%s", where, g.cmd, name)
		}
		if !hasValue {
			if f.isBool {
				value = "true"
			} else {
				if i+1 >= len(rest) {
					t.Fatalf("%s: --%s needs a value", where, name)
				}
				i++
				value = rest[i]
			}
		}
		if _, dup := g.flags[name]; dup {
			t.Errorf("%s: --%s given twice", where, name)
		}
		g.flags[name] = value
	}
	byEnv := map[string]string{}
	for name := range g.known {
		byEnv[envName(name)] = name
	}
	var envArgs []string
	for k, v := range env {
		if !strings.HasPrefix(k, "SLUICE_") {
			continue
		}
		name, ok := byEnv[k]
		if !ok {
			t.Errorf("%s: %s is no flag of sluice %s", where, k, g.cmd)
			continue
		}
		g.env[k] = v
		envArgs = append(envArgs, "--"+name+"="+v)
	}
	slices.Sort(envArgs)
	// The binary parses the values: a duration that is not one, an int that is not, a
	// bool spelled wrong fail here with exit status 2.
	for _, try := range [][]string{args[1:], envArgs} {
		code, _, errOut := binaries.run(t, "sluice", append(append([]string{g.cmd}, try...), "-h")...)
		if code != 0 {
			t.Errorf("%s: sluice %s %s: exit %d\n%s", where, g.cmd, strings.Join(try, " "), code, errOut)
		}
	}
	return g
}

// value is the effective value of a flag: the command line wins over the
// environment, which wins over the default.
func (g gatewayConfig) value(name string) string {
	if _, ok := g.known[name]; !ok {
		panic("no flag " + name)
	}
	if v, ok := g.flags[name]; ok {
		return v
	}
	if v, ok := g.env[envName(name)]; ok {
		return v
	}
	return g.known[name].def
}

// port returns the port of the address flag name and checks that the process
// listens on every interface (loopback is unreachable from other containers).
func (g gatewayConfig) port(t *testing.T, name string) int {
	t.Helper()
	host, port, err := net.SplitHostPort(g.value(name))
	if err != nil {
		t.Fatalf("%s: --%s %q: %v", g.where, name, g.value(name), err)
	}
	if ip := net.ParseIP(host); host == "localhost" || (ip != nil && ip.IsLoopback()) {
		t.Errorf("%s: --%s %s listens on loopback only: nothing outside the container reaches it", g.where, name, g.value(name))
	}
	p, err := strconv.Atoi(port)
	if err != nil || p == 0 {
		t.Fatalf("%s: --%s %q: want a fixed port", g.where, name, g.value(name))
	}
	return p
}

func (g gatewayConfig) duration(t *testing.T, name string) time.Duration {
	t.Helper()
	d, err := time.ParseDuration(g.value(name))
	if err != nil {
		t.Fatalf("%s: --%s: %v", g.where, name, err)
	}
	return d
}

// list splits a comma-separated flag value.
func (g gatewayConfig) list(name string) []string {
	var out []string
	for _, s := range strings.Split(g.value(name), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// TestBinaryFlagsParsed guards the parser the other tests rely on: the flags that
// go doc ./cmd/sluice documents for sluice serve are found, with their defaults.
func TestBinaryFlagsParsed(t *testing.T) {
	fs := sluiceFlags(t, "serve")
	for _, name := range []string{"rules", "upstream", "listen", "admin-listen", "admin-token", "redis", "nats", "replicas", "trusted-proxies", "shutdown-timeout", "log-format", "dispatch", "shadow"} {
		if _, ok := fs[name]; !ok {
			t.Errorf("sluice serve -h: no --%s", name)
		}
	}
	if !fs["shadow"].isBool || fs["listen"].isBool {
		t.Errorf("booleans misread: %+v %+v", fs["shadow"], fs["listen"])
	}
	if fs["admin-listen"].def == "" || fs["shutdown-timeout"].def == "" {
		t.Errorf("defaults misread: %+v", fs)
	}
	if !slices.Contains(benchModes(t), "upstream") {
		t.Errorf("sluice-bench has no upstream mode (the demo API of compose and Kubernetes)")
	}
}
