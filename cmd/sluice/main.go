package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/rules"
)

// Exit statuses that scripts can rely on.
const (
	exitOK      = 0
	exitFailure = 1 // the command was well formed but failed (e.g. Redis unreachable)
	exitUsage   = 2 // bad flags, arguments or input
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// exitStatus is what a command returns to run when it has already said what went
// wrong on stderr: run exits with it and prints nothing more.
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// status turns a command's exit status into the error cobra expects of RunE.
func status(code int) error {
	if code == exitOK {
		return nil
	}
	return exitStatus(code)
}

// usageError is a bad command line found by sluice (cobra's own are plain errors):
// run prints it, and where to find the command's flags, and exits 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

func usageErrorf(format string, a ...any) error { return &usageError{fmt.Sprintf(format, a...)} }

// run runs the command line args (without the program name): it returns the exit
// status and writes only to stdout and stderr.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRoot(stdout, stderr)
	root.SetArgs(explainArgs(args))
	cmd, err := root.ExecuteContextC(ctx)
	var code exitStatus
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &code):
		return int(code)
	}
	// Every other error is a command line that cobra, pflag or a command's argument
	// check refused.
	path := "sluice"
	if cmd != nil {
		path = cmd.CommandPath()
	}
	fmt.Fprintf(stderr, "%s: %s\n", path, strings.TrimRight(err.Error(), "\n"))
	fmt.Fprintf(stderr, "Run '%s -h' for its flags.\n", path)
	return exitUsage
}

// commandOrder is the order in which the usage lists the commands (cobra sorts them
// by name, which puts the gateway's main command in the middle).
var commandOrder = []string{"serve", "ingress", "rls", "dispatch", "queue", "dlq", "simulate", "rules", "demo-upstream", "version", "completion", "help"}

// newRoot builds the command tree. Every command writes to stdout and stderr and
// reads the context of the execution (cmd.Context()).
func newRoot(stdout, stderr io.Writer) *cobra.Command {
	var showVersion bool
	root := &cobra.Command{
		Use:   "sluice",
		Short: "sluice is a throttling gateway that rejects or defers requests over their rate limits.",
		// Errors are printed by run, once, in sluice's own words; the usage is printed
		// on -h, not after every mistake.
		SilenceErrors: true,
		SilenceUsage:  true,
		// Instead of cobra's check, whose message spans lines: run prints one.
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(c, args[0])
			}
			return nil
		},
		RunE: func(c *cobra.Command, args []string) error {
			if showVersion {
				fmt.Fprint(stdout, versionText())
				return nil
			}
			rootUsage(stderr, c)
			return exitStatus(exitUsage)
		},
	}
	root.Flags().BoolVar(&showVersion, "version", false, "print the version (as sluice version)")
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(flagError)
	root.SetHelpFunc(printHelp)
	root.SetHelpCommand(helpCommand())

	root.AddCommand(
		gatewayCommand(serveMode, "run the front door and the dispatchers: proxy, reject or defer, then deliver", stdout, stderr),
		gatewayCommand(ingressMode, "run the front door alone (serve without dispatchers)", stdout, stderr),
		gatewayCommand(rlsMode, "run Envoy's rate limit service and ext_authz alone: rules and limiter, no front door, no queues", stdout, stderr),
		gatewayCommand(dispatchMode, "run the dispatchers alone: drain the queues to their downstreams", stdout, stderr),
		queueCommand(stdout, stderr),
		dlqCommand(stdout, stderr),
		simulateCommand(stdout, stderr),
		rulesCommand(stdout, stderr),
		demoUpstreamCommand(stdout, stderr),
		versionCommand(stdout),
	)
	// cobra's own completion command (bash, zsh, fish, powershell), added now rather
	// than when executing so that the usage lists it in sluice's words.
	root.InitDefaultCompletionCmd()
	if c, _, err := root.Find([]string{"completion"}); err == nil && c != root {
		c.Short = "print a shell completion script: sluice completion bash|zsh|fish|powershell"
		// Without a shell, or with one cobra does not know, it is a usage error, not
		// the help with status 0.
		c.Args = func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(c, args[0])
			}
			return usageErrorf("want a shell: bash, zsh, fish or powershell")
		}
		c.RunE = func(*cobra.Command, []string) error { return nil } // Args has refused
	}
	return root
}

// envAnnotation marks the commands whose flags also come from SLUICE_* variables (those
// that call loadFlags), for their help; withEnv annotates c.
const envAnnotation = "sluice-env"

func withEnv(c *cobra.Command) *cobra.Command {
	c.Annotations = map[string]string{envAnnotation: "true"}
	return c
}

// rootUsage writes the top-level usage.
func rootUsage(w io.Writer, root *cobra.Command) {
	fmt.Fprint(w, root.Short+"\n\n")
	fmt.Fprint(w, "Usage:\n  sluice <command> [flags] [arguments]\n\nCommands:\n")
	for _, name := range commandOrder {
		if c, _, err := root.Find([]string{name}); err == nil && c != root {
			fmt.Fprintf(w, "  %-13s %s\n", c.Name(), c.Short)
		}
	}
	fmt.Fprint(w, "\nRun 'sluice help <command>' or 'sluice <command> --help' for a command's flags.\n")
	fmt.Fprint(w, "Flags are written --name value or --name=value; -h is --help.\n")
	fmt.Fprint(w, "Every flag can also be set by the environment variable SLUICE_<FLAG>, upper case\n")
	fmt.Fprint(w, "with dashes as underscores (--bucket-size: SLUICE_BUCKET_SIZE); flags win over it.\n")
	fmt.Fprint(w, "serve, ingress, rls, dispatch and dlq also read --config FILE (or SLUICE_CONFIG): YAML\n")
	fmt.Fprint(w, "whose keys are flag names; flags and the environment win over it. 'sluice serve\n")
	fmt.Fprint(w, "--print-config' shows the configuration in force. 'sluice completion bash|zsh|fish'\n")
	fmt.Fprint(w, "prints a shell completion script.\n")
}

// printHelp is every command's help, on stdout: its synopsis (Long), its subcommands
// and its flags.
func printHelp(c *cobra.Command, _ []string) {
	w := c.OutOrStdout()
	if !c.HasParent() {
		rootUsage(w, c)
		return
	}
	fmt.Fprint(w, strings.TrimRight(cmp.Or(c.Long, c.Short), "\n")+"\n")
	if c.HasAvailableSubCommands() {
		fmt.Fprint(w, "\nCommands:\n")
		for _, sub := range c.Commands() {
			if sub.IsAvailableCommand() {
				fmt.Fprintf(w, "  %-10s %s\n", sub.Name(), sub.Short)
			}
		}
	}
	if !c.HasAvailableLocalFlags() {
		return
	}
	switch {
	case c.Flags().Lookup("config") != nil:
		fmt.Fprint(w, "\nFlags (each also read from SLUICE_<FLAG>, then from the --config file; see 'sluice help'):\n")
	case c.Annotations[envAnnotation] != "":
		fmt.Fprint(w, "\nFlags (each also read from SLUICE_<FLAG>, see 'sluice help'):\n")
	default:
		fmt.Fprint(w, "\nFlags:\n")
	}
	fmt.Fprint(w, c.LocalFlags().FlagUsages())
}

// helpCommand replaces cobra's, which answers an unknown topic with status 0.
func helpCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "help [command]",
		Short: "show help for sluice or a command",
		Long:  "Usage: sluice help [command [subcommand]]\n\nShows the help of sluice, or of a command (as sluice COMMAND --help).\n",
		ValidArgsFunction: func(c *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
			var names []cobra.Completion
			parent, _, err := c.Root().Find(args)
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			for _, sub := range parent.Commands() {
				if sub.IsAvailableCommand() && strings.HasPrefix(sub.Name(), toComplete) {
					names = append(names, cobra.CompletionWithDesc(sub.Name(), sub.Short))
				}
			}
			return names, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(c *cobra.Command, args []string) error {
			root := c.Root()
			target, rest, err := root.Find(args)
			if err == nil && len(rest) > 0 {
				err = unknownCommand(target, rest[0])
			}
			if err != nil {
				return err
			}
			target.InitDefaultHelpFlag() // so that the flags list -h, --help as when run
			target.SetOut(c.OutOrStdout())
			target.HelpFunc()(target, nil)
			return nil
		},
	}
}

// unknownCommand is the error for a subcommand of parent that does not exist, with
// the closest of its real subcommands by edit distance (rules.Suggest, as for flags),
// else the one it starts (sim: simulate). cobra's own suggestion takes the first
// command within its distance in the order of the tree, not the closest: rule gave rls.
func unknownCommand(parent *cobra.Command, name string) error {
	msg := fmt.Sprintf("unknown command %q for %q", name, parent.CommandPath())
	if s := suggestCommand(parent, name); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return &usageError{msg}
}

// suggestCommand returns the subcommand of parent that name is a typo or a start of,
// or "".
func suggestCommand(parent *cobra.Command, name string) string {
	var names []string
	for _, sub := range parent.Commands() {
		if sub.IsAvailableCommand() || sub.Name() == "help" {
			names = append(names, sub.Name())
			names = append(names, sub.Aliases...)
		}
	}
	lower := strings.ToLower(name)
	if best := rules.Suggest(lower, names); best != "" {
		return best
	}
	var prefixed []string
	for _, n := range names {
		if lower != "" && strings.HasPrefix(n, lower) {
			prefixed = append(prefixed, n)
		}
	}
	if len(prefixed) == 1 {
		return prefixed[0]
	}
	return ""
}

// flagError rewrites pflag's parse errors for run: an unknown flag with the closest
// flag of the command, a flag written with one dash (the flag package took -rules;
// pflag reads it as -r -u -l…) with its two-dash spelling, and a refused value with
// what the flag wants.
func flagError(c *cobra.Command, err error) error {
	var notExist *pflag.NotExistError
	var invalid *pflag.InvalidValueError
	var required *pflag.ValueRequiredError
	switch {
	case errors.As(err, &notExist):
		short := notExist.GetSpecifiedShortnames()
		if short == "" {
			name := notExist.GetSpecifiedName()
			if s := suggestFlag(c.Flags(), name); s != "" {
				return usageErrorf("unknown flag --%s%s", name, s)
			}
			return otherCommandsFlag(c, name)
		}
		// -name: a long flag with one dash (as the flag package took them), or an
		// unknown shorthand.
		name, _, _ := strings.Cut(short, "=")
		if c.Flags().Lookup(name) != nil {
			return usageErrorf("unknown flag -%s: long flags take two dashes: --%s", short, short)
		}
		if len(name) > 1 {
			return usageErrorf("unknown flag -%s%s", short, suggestFlag(c.Flags(), name))
		}
		return usageErrorf("unknown flag -%s", short)
	case errors.As(err, &invalid):
		f := invalid.GetFlag()
		return usageErrorf("invalid value %q for --%s: %s", invalid.GetValue(), f.Name, want(f, invalid.Unwrap()))
	case errors.As(err, &required):
		return usageErrorf("--%s needs a value", required.GetFlag().Name)
	}
	return &usageError{err.Error()}
}

// otherCommandsFlag is the error for --name, unknown to c: when other commands have
// it, it names them, and the command the user meant when a mistyped one came first
// (sluice serv --rules: cobra parsed the flags for sluice itself).
func otherCommandsFlag(c *cobra.Command, name string) error {
	var owners []string
	var visit func(*cobra.Command)
	visit = func(cmd *cobra.Command) {
		for _, sub := range cmd.Commands() {
			if f := sub.LocalFlags().Lookup(name); f != nil && !f.Hidden && sub.IsAvailableCommand() {
				owners = append(owners, strings.TrimPrefix(sub.CommandPath(), c.Root().Name()+" "))
			}
			visit(sub)
		}
	}
	visit(c.Root())
	if len(owners) == 0 {
		return usageErrorf("unknown flag --%s", name)
	}
	if !c.HasParent() && c.Flags().NArg() > 0 {
		typed := c.Flags().Arg(0)
		if meant := suggestCommand(c, typed); slices.Contains(owners, meant) {
			return usageErrorf("unknown command %q for %q (did you mean %q?): --%s is a flag of %s, not %s", typed, c.CommandPath(), meant, name, meant, typed)
		}
		return usageErrorf("unknown command %q for %q: --%s is a flag of %s", typed, c.CommandPath(), name, listWords(owners))
	}
	return usageErrorf("unknown flag --%s: it is a flag of %s, not of %s", name, listWords(owners), c.CommandPath())
}

// listWords joins words as a sentence does: "a", "a and b", "a, b and c".
func listWords(words []string) string {
	if len(words) < 2 {
		return strings.Join(words, "")
	}
	return strings.Join(words[:len(words)-1], ", ") + " and " + words[len(words)-1]
}

// suggestAction returns ` (did you mean "x"?)` for the action of a command (sluice
// queue lsit) closest to name by edit distance, or "".
func suggestAction(name string, actions ...string) string {
	if best := rules.Suggest(strings.ToLower(name), actions); best != "" {
		return fmt.Sprintf(" (did you mean %q?)", best)
	}
	return ""
}

// suggestFlag returns ` (did you mean --x?)` for the flag of fs closest to name, if one
// is close enough to be a typo; "" otherwise.
func suggestFlag(fs *pflag.FlagSet, name string) string {
	var names []string
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden {
			names = append(names, f.Name)
		}
	})
	if best := rules.Suggest(strings.ToLower(name), names); best != "" {
		return fmt.Sprintf(" (did you mean --%s?)", best)
	}
	return ""
}

// explainArgs joins the two words of `sluice rules check --explain METHOD PATH` into one
// flag value ("--explain=METHOD PATH"), which is how pflag can take them: a flag has
// one value. Anything else is left as it is.
func explainArgs(args []string) []string {
	if len(args) == 0 || args[0] != "rules" {
		return args
	}
	out := make([]string, 0, len(args))
	for i := 0; i < len(args); i++ {
		if args[i] == "--" {
			return append(out, args[i:]...)
		}
		// A METHOD has no space: "--explain 'GET /x' FILE" is the one-word form already.
		if args[i] == "--explain" && i+2 < len(args) && !strings.ContainsAny(args[i+1], " \t") &&
			!strings.HasPrefix(args[i+1], "-") && !strings.HasPrefix(args[i+2], "-") {
			out = append(out, "--explain="+args[i+1]+" "+args[i+2])
			i += 2
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// version is set at link time (go build -ldflags "-X main.version=v1.2.3"), as the
// image build does; otherwise the module version of the build information is shown.
var version = ""

func versionCommand(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "print the version",
		Long: "Usage: sluice version\n\nPrints the version of sluice (the module version, or the one given at link time), the\n" +
			"revision, time and modified state of the version control checkout it was built\n" +
			"from, and the Go toolchain and platform.\n",
		Args: noArgs,
		RunE: func(c *cobra.Command, _ []string) error {
			fmt.Fprint(stdout, versionText())
			return nil
		},
	}
}

// unnamedBuild ends sluice version for a build that nothing names (GOFLAGS=-buildvcs=false
// and no link-time version): the README's build command with the version added.
const unnamedBuild = "name a build with: go build -ldflags \"-X main.version=$(git describe --tags --always --dirty)\" -o sluice ./cmd/sluice\n"

// versionText is what sluice version prints, from the build information that the Go
// toolchain records in the binary (see formatVersion).
func versionText() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		info = nil
	}
	return formatVersion(version, info)
}

// buildVersion is this binary's version: the first line of sluice version.
func buildVersion() string {
	info, _ := debug.ReadBuildInfo()
	return versionName(version, info)
}

// versionName is linkVersion, else the module version of info.
func versionName(linkVersion string, info *debug.BuildInfo) string {
	v := linkVersion
	if v == "" && info != nil {
		v = info.Main.Version
	}
	return cmp.Or(v, "(unknown)")
}

// formatVersion writes the version of a binary built with info (nil: none recorded)
// and linked with the version linkVersion (empty: none):
//
//	sluice v1.2.3
//	revision: 4073f49… (the full commit)
//	time: 2026-11-30T10:41:00Z
//	modified: false
//	go: go1.26.0 linux/amd64
//
// The first line has linkVersion, else the module version (a tag, a pseudo-version
// such as v0.0.0-20261130104100-4073f49abcde+dirty, or "(devel)"). A build without
// version control information (-buildvcs=false, a tree without .git, a git worktree,
// which the go command does not recognise) has "revision: unknown" instead of the
// three VCS lines, and when nothing names the build (no link-time version, the module
// version "(devel)") a line saying how to name one.
func formatVersion(linkVersion string, info *debug.BuildInfo) string {
	var b strings.Builder
	fmt.Fprintf(&b, "sluice %s\n", versionName(linkVersion, info))
	vcs := map[string]string{}
	goVersion := runtime.Version()
	if info != nil {
		for _, s := range info.Settings {
			vcs[s.Key] = s.Value
		}
		goVersion = cmp.Or(info.GoVersion, goVersion)
	}
	if rev := vcs["vcs.revision"]; rev != "" {
		fmt.Fprintf(&b, "revision: %s\n", rev)
		if t := vcs["vcs.time"]; t != "" {
			fmt.Fprintf(&b, "time: %s\n", t)
		}
		fmt.Fprintf(&b, "modified: %s\n", cmp.Or(vcs["vcs.modified"], "false"))
	} else {
		b.WriteString("revision: unknown (built without version control information)\n")
	}
	fmt.Fprintf(&b, "go: %s %s/%s\n", goVersion, runtime.GOOS, runtime.GOARCH)
	if vcs["vcs.revision"] == "" && linkVersion == "" && (info == nil || info.Main.Version == "" || info.Main.Version == "(devel)") {
		// Nothing names this build: say how to name the next one.
		b.WriteString(unnamedBuild)
	}
	return b.String()
}

// noArgs is cobra.NoArgs in sluice's words.
func noArgs(_ *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return nil
	case args[0] == "true" || args[0] == "false":
		// --shadow false: a boolean takes no separate value.
		return usageErrorf("unexpected argument %q (a boolean flag takes its value after =: --dispatch=false)", args[0])
	}
	return usageErrorf("unexpected argument %q", args[0])
}
