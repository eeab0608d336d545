// Command sluice is the sluice throttling gateway and its operator tools.
//
// Each subcommand is a function runX(ctx, args, stdout, stderr) int so that tests can
// run it in-process; main only wires the process's arguments, streams, signals and exit
// status to it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
)

// Exit statuses that scripts can rely on.
const (
	exitOK      = 0
	exitFailure = 1 // the command was well formed but failed (e.g. Redis unreachable)
	exitUsage   = 2 // bad flags, arguments or input
)

// command is one entry of the dispatch table.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, args []string, stdout, stderr io.Writer) int
}

// commands is the dispatch table, in the order usage lists them. Add new subcommands
// here. It is filled in init because runHelp refers to it.
var commands []command

func init() {
	commands = []command{
		{"serve", "run the front door and the dispatchers: proxy, reject or defer, then deliver", runServe},
		{"ingress", "run the front door alone (serve without dispatchers)", runIngress},
		{"rls", "run Envoy's rate limit service and ext_authz alone: rules and limiter, no front door, no queues", runRLS},
		{"dispatch", "run the dispatchers alone: drain the queues to their downstreams", runDispatch},
		{"queue", "list, show, pause, resume or retire the queues of a running sluice", runQueue},
		{"dlq", "list, re-queue or purge a queue's dead letters", runDLQ},
		{"simulate", "replay a trace of requests through one rule on a simulated clock", runSimulate},
		{"rules", "check rules files and explain how a request matches them", runRules},
		{"version", "print the version", runVersion},
		{"help", "show help for sluice or a subcommand", runHelp},
	}
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run dispatches args[0] to its subcommand.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help":
		usage(stdout)
		return exitOK
	case "-version", "--version":
		return runVersion(ctx, nil, stdout, stderr)
	}
	c, ok := lookup(args[0])
	if !ok {
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	return c.run(ctx, args[1:], stdout, stderr)
}

func lookup(name string) (command, bool) {
	for _, c := range commands {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func usage(w io.Writer) {
	fmt.Fprint(w, "sluice is a throttling gateway that rejects or defers requests over their rate limits.\n\n")
	fmt.Fprint(w, "Usage:\n  sluice <command> [flags] [arguments]\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(w, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprint(w, "\nRun 'sluice help <command>' or 'sluice <command> -h' for a command's flags.\n")
	fmt.Fprint(w, "Every flag can also be set by the environment variable SLUICE_<FLAG>, upper case\n")
	fmt.Fprint(w, "with dashes as underscores (--bucket-size: SLUICE_BUCKET_SIZE); flags win over it.\n")
	fmt.Fprint(w, "serve, ingress, dispatch and dlq also read --config FILE (or SLUICE_CONFIG): YAML whose\n")
	fmt.Fprint(w, "keys are flag names; flags and the environment win over it. 'sluice serve --print-config'\n")
	fmt.Fprint(w, "shows the effective configuration.\n")
}

// runHelp prints the top-level usage, or a subcommand's own help by running it with -h.
func runHelp(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		usage(stdout)
		return exitOK
	}
	c, ok := lookup(args[0])
	if !ok || c.name == "help" {
		if !ok {
			fmt.Fprintf(stderr, "sluice help: unknown command %q\n\n", args[0])
			usage(stderr)
			return exitUsage
		}
		usage(stdout)
		return exitOK
	}
	// Subcommands print their help to stdout for -h and exit 0, like -h of the binary.
	return c.run(ctx, []string{"-h"}, stdout, stderr)
}

// version is set at link time: go build -ldflags "-X main.version=v1.2.3".
var version = ""

func runVersion(_ context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	if _, code, done := parseFlags(fs, args, stdout, stderr, "Usage: sluice version\n\nPrints the version of sluice and of the Go toolchain that built it.\n"); done {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice version: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	fmt.Fprintf(stdout, "sluice %s %s %s/%s\n", buildVersion(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
	return exitOK
}

// buildVersion prefers the link-time version, then the module version that `go install
// ...@vX` records, then the VCS revision when the build recorded one.
func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	if v := info.Main.Version; v != "" && v != "(devel)" {
		return v
	}
	for _, s := range info.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return "devel-" + s.Value[:12]
		}
	}
	return "devel"
}

// parseFlags parses args into fs, then fills every flag not given on the command line
// from its SLUICE_* environment variable, and then, for a command with --config (see
// configFlags), every flag still unset from the config file. done is true when the
// caller should return code at once: help was asked for (printed to stdout, status 0)
// or the flags, the environment or the config file were bad (reported on stderr,
// status 2). help is the command's synopsis, printed above the flags. fromEnv holds
// the flags that were set from the environment, for messages that name them.
func parseFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (fromEnv map[string]bool, code int, done bool) {
	src, code, done := parseCommandFlags(fs, args, stdout, stderr, help)
	if done {
		return nil, code, true
	}
	return src.names(srcEnv), exitOK, false
}

// parseCommandFlags is parseFlags, telling where every flag's value came from.
// Precedence: command line > SLUICE_* environment > config file > default.
func parseCommandFlags(fs *flag.FlagSet, args []string, stdout, stderr io.Writer, help string) (src *flagSources, code int, done bool) {
	fs.SetOutput(stderr)
	// Parse reports a bad flag on stderr itself; the full flag list is only printed
	// when asked for, and then on stdout, so `sluice x -h | less` works.
	fs.Usage = func() {}
	config := fs.Lookup("config")
	err := fs.Parse(args)
	switch {
	case err == flag.ErrHelp:
		fmt.Fprint(stdout, help)
		if config != nil {
			fmt.Fprint(stdout, "\nFlags (each also read from SLUICE_<FLAG>, then from the --config file; see 'sluice help'):\n")
		} else {
			fmt.Fprint(stdout, "\nFlags (each also read from SLUICE_<FLAG>, see 'sluice help'):\n")
		}
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fs.SetOutput(stderr)
		return nil, exitOK, true
	case err != nil:
		fmt.Fprintf(stderr, "Run 'sluice %s -h' for its flags.\n", fs.Name())
		return nil, exitUsage, true
	}
	src = &flagSources{source: map[string]source{}}
	fs.Visit(func(f *flag.Flag) { src.source[f.Name] = srcFlag })
	fromEnv, err := applyEnv(fs, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", fs.Name(), err)
		return nil, exitUsage, true
	}
	for name := range fromEnv {
		src.source[name] = srcEnv
	}
	if config == nil || config.Value.String() == "" {
		return src, exitOK, false
	}
	src.config, src.origin = config.Value.String(), describeOrigin(src.of("config"))
	set, unused, err := applyConfig(fs, src.config, src.source)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			fmt.Fprintf(stderr, "sluice %s: %s: %v\n", fs.Name(), src.origin, err)
		} else {
			for _, line := range configErrorLines(err) {
				fmt.Fprintf(stderr, "sluice %s: %s\n", fs.Name(), line)
			}
		}
		return nil, exitUsage, true
	}
	for name := range set {
		src.source[name] = srcFile
	}
	src.unused = unused
	return src, exitOK, false
}

// envName is the environment variable that backs flag name: SLUICE_ followed by the
// name in upper case with dashes as underscores.
func envName(name string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets every flag of fs that was not given on the command line from its
// environment variable (see envName), so flags win over the environment. A flag set
// this way counts as given for fs.Visit, which is how commands tell "set" from
// "default". An empty variable counts as set: SLUICE_REDIS= turns Redis off.
// It returns the names of the flags it set.
func applyEnv(fs *flag.FlagSet, lookupEnv func(string) (string, bool)) (map[string]bool, error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	set := map[string]bool{}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || given[f.Name] {
			return
		}
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("environment variable %s (for --%s): %w", name, f.Name, e)
			return
		}
		set[f.Name] = true
	})
	return set, err
}
