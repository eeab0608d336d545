package main

// Configuration files.
//
// A command that registers --config (serve, ingress, rls, dispatch and dlq, through
// configFlags) takes each flag from the first of: the command line, its SLUICE_*
// environment variable, the YAML file named by --config (or SLUICE_CONFIG), and the
// flag's default. loadFlags does this once for every command; the file may set
// only what the command line and the environment left unset.
//
// The file is a mapping from flag names to values, so that one file describes a whole
// deployment: a key that is a flag of another of these commands (upstream, read by
// serve and ingress but not by dispatch) is left alone; a key that is no flag of any
// of them is an error, as is a value that its flag does not accept.

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/rules"
)

// source is where a flag's value came from.
type source string

const (
	srcDefault source = "default"
	srcFlag    source = "flag"
	srcEnv     source = "env"
	srcFile    source = "file"
)

// flagSources is what loadFlags found out about a command's flags.
type flagSources struct {
	// source of each flag that was set; the others have their defaults.
	source map[string]source
	// config is the file that was read ("" if none) and origin how it was named:
	// "--config" or "SLUICE_CONFIG".
	config, origin string
	// unused are the file's keys that are flags of other commands, as "key (line N)".
	unused []string
	// derived says, of a flag whose default depends on other flags (--ack-wait) or on
	// where the queues live (--replicas), how the value in force was worked out; the
	// commands resolve such defaults before printing or using them.
	derived map[string]string
}

// derive records that the value of flag name in force was worked out as how says.
func (s *flagSources) derive(name, how string) {
	if s.derived == nil {
		s.derived = map[string]string{}
	}
	s.derived[name] = how
}

func (s *flagSources) of(name string) source {
	if src, ok := s.source[name]; ok {
		return src
	}
	return srcDefault
}

// names returns the flags whose values came from src.
func (s *flagSources) names(src source) map[string]bool {
	m := map[string]bool{}
	for name, from := range s.source {
		if from == src {
			m[name] = true
		}
	}
	return m
}

// configFlags registers --config, and --print-config when print is not nil.
func configFlags(fs *pflag.FlagSet, print *bool) {
	fs.String("config", "", "read flags from this YAML `file`: keys are flag names (admin-listen: 127.0.0.1:9090); the command line and SLUICE_* variables win over it")
	if print != nil {
		fs.BoolVar(print, "print-config", false, "print the effective configuration as YAML (every flag, its value and its source; secrets masked) and exit")
	}
}

// notInFile are flags that a file cannot set: they say what to do with the file, or
// belong to one invocation (dlq's --yes, --json, --limit are no keys either, since
// only the long-running commands' flags are).
var notInFile = map[string]bool{"config": true, "print-config": true, "help": true}

// keyFlags returns new flags for the keys a config file may have: the flags of serve,
// ingress and dispatch (dlq's NATS flags are among them), by name. Every value of a
// file is checked on them, whichever command reads it, so that a file is valid or not
// whatever the command and whatever the command line and environment override.
func keyFlags() map[string]*pflag.Flag {
	keys := map[string]*pflag.Flag{}
	for _, m := range []gatewayMode{serveMode, ingressMode, dispatchMode} {
		fs := pflag.NewFlagSet(m.name, pflag.ContinueOnError)
		m.flags(fs, new(gatewayConfig))
		fs.VisitAll(func(f *pflag.Flag) {
			if _, ok := keys[f.Name]; !ok && !notInFile[f.Name] {
				keys[f.Name] = f
			}
		})
	}
	return keys
}

// configKeys are the names of keyFlags, sorted.
var configKeys = sync.OnceValue(func() []string {
	keys := slices.Collect(maps.Keys(keyFlags()))
	slices.Sort(keys)
	return keys
})

// listFlags are the flags that take a comma-separated list; in a file their value may
// also be a YAML sequence.
var listFlags = map[string]bool{"rules": true, "trusted-proxies": true, "proxy-protocol": true, "nats": true}

// configError is one problem of a config file, at a line.
type configError struct {
	path string
	line int
	msg  string
}

func (e *configError) Error() string { return fmt.Sprintf("%s:%d: %s", e.path, e.line, e.msg) }

// applyConfig reads the config file at path and sets, from it, every flag of fs that
// given does not name (those the command line or the environment set). It returns
// the flags it set and the keys that are flags of other commands; every problem of
// the file at once (configErrors joined), or the error reading it.
func applyConfig(fs *pflag.FlagSet, path string, given map[string]source) (set map[string]bool, unused []string, err error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	set = map[string]bool{}
	if doc.Kind == 0 || len(doc.Content) == 0 { // empty, or only comments
		return set, nil, nil
	}
	top := doc.Content[0]
	if top.Kind == yaml.ScalarNode && top.Tag == "!!null" {
		return set, nil, nil
	}
	if top.Kind != yaml.MappingNode {
		return nil, nil, &configError{path, top.Line, `want a mapping of flag names to values, such as "listen: 127.0.0.1:8080"`}
	}
	keys := keyFlags()
	var errs []error
	problem := func(n *yaml.Node, format string, a ...any) {
		errs = append(errs, &configError{path, n.Line, fmt.Sprintf(format, a...)})
	}
	firstLine := map[string]int{}
	for i := 0; i+1 < len(top.Content); i += 2 {
		k, v := top.Content[i], top.Content[i+1]
		// snake_case works too; the documented form is the flag's.
		name := strings.ReplaceAll(k.Value, "_", "-")
		check := keys[name]
		switch {
		case k.Kind != yaml.ScalarNode:
			problem(k, "a key must be a flag name")
			continue
		case check == nil && fs.Lookup(name) != nil:
			problem(k, "%q cannot be set in a config file; give --%s on the command line", k.Value, name)
			continue
		case check == nil:
			problem(k, "unknown key %q%s", k.Value, didYouMean(name, configKeys()))
			continue
		}
		if line, dup := firstLine[name]; dup {
			problem(k, "%s is set twice (first on line %d)", name, line)
			continue
		}
		firstLine[name] = k.Line
		value, err := configValue(check, v)
		if err != nil {
			problem(v, "%s: %v", name, err)
			continue
		}
		if err := check.Value.Set(value); err != nil {
			problem(v, "%s: invalid value %q: %s", name, value, want(check, err))
			continue
		}
		f := fs.Lookup(name)
		switch {
		case f == nil:
			unused = append(unused, fmt.Sprintf("%s (line %d)", name, k.Line))
		case given[name] != "":
			// the command line or the environment wins
		default:
			if err := fs.Set(name, value); err != nil {
				problem(v, "%s: invalid value %q: %s", name, value, want(f, err))
				continue
			}
			set[name] = true
		}
	}
	return set, unused, errors.Join(errs...)
}

// configValue is the text that a YAML value stands for, as the flag would take it on
// the command line: a scalar as written, a sequence (for list flags) joined with
// commas, null as empty (for string flags).
func configValue(f *pflag.Flag, n *yaml.Node) (string, error) {
	if n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			if f.Value.Type() != "string" {
				return "", errors.New("no value")
			}
			return "", nil
		}
		return n.Value, nil
	case yaml.SequenceNode:
		if !listFlags[f.Name] {
			return "", errors.New("takes one value, not a list")
		}
		parts := make([]string, 0, len(n.Content))
		for _, e := range n.Content {
			if e.Kind == yaml.AliasNode && e.Alias != nil {
				e = e.Alias
			}
			if e.Kind != yaml.ScalarNode || e.Tag == "!!null" {
				return "", fmt.Errorf("line %d: want a list of strings", e.Line)
			}
			parts = append(parts, e.Value)
		}
		return strings.Join(parts, ","), nil
	}
	return "", errors.New("want a value, not a mapping")
}

// want describes what f takes, after its Set refused a value with err.
func want(f *pflag.Flag, err error) string {
	if invalid := (*pflag.InvalidValueError)(nil); errors.As(err, &invalid) { // from FlagSet.Set
		err = invalid.Unwrap()
	}
	var w string
	switch f.Value.Type() {
	case "bool":
		w = "want true or false"
	case "int", "int64", "uint", "uint64":
		w = "want an integer"
	case "duration":
		// time.ParseDuration's message repeats the value and adds nothing.
		return "want a duration such as 30s, 1m30s or 250ms"
	case "size":
		return "want a size in bytes, plain or with a unit: 1048576, 64KiB, 10MiB, 1GiB (or KB, MB, GB)" + sizeDetail(err)
	default:
		return err.Error()
	}
	// pflag hands strconv's error on: keep its reason (value out of range), not its
	// "strconv.ParseInt: parsing …" preamble.
	var num *strconv.NumError
	if errors.As(err, &num) {
		if !errors.Is(num.Err, strconv.ErrSyntax) {
			w += " (" + num.Err.Error() + ")"
		}
	} else if msg := err.Error(); msg != "" {
		w += " (" + msg + ")"
	}
	return w
}

// didYouMean returns ` (did you mean "x"?)` for the known key closest to name, if one is
// close enough to be a typo.
func didYouMean(name string, known []string) string {
	best := rules.Suggest(strings.ToLower(strings.TrimLeft(name, "-")), known)
	if best == "" {
		return "; keys are the flags' names, such as admin-listen (see -h)"
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

// printConfig writes the effective configuration of the command whose flags are fs
// as a YAML file that --config accepts: every flag but --config and --print-config,
// sorted by name, with its source as a comment and secrets masked.
func printConfig(w io.Writer, fs *pflag.FlagSet, src *flagSources) error {
	head := fmt.Sprintf("sluice %s: the effective configuration. After each value, where it came from:\n"+
		"flag, env (SLUICE_*), file or default. Secrets are masked.", fs.Name())
	if src.config != "" {
		head += "\nconfig file: " + src.config
		if src.origin != "--config" {
			head += " (from " + src.origin + ")"
		}
	}
	if len(src.unused) > 0 {
		head += fmt.Sprintf("\nkeys of the file that sluice %s has no flags for: %s", fs.Name(), strings.Join(src.unused, ", "))
	}
	m := &yaml.Node{Kind: yaml.MappingNode}
	fs.VisitAll(func(f *pflag.Flag) {
		if notInFile[f.Name] {
			return
		}
		value := maskSecret(f.Name, f.Value.String())
		var v *yaml.Node
		switch {
		case listFlags[f.Name]:
			v = &yaml.Node{Kind: yaml.SequenceNode, Style: yaml.FlowStyle}
			if value != "" {
				for _, part := range strings.Split(value, ",") {
					v.Content = append(v.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: part})
				}
			}
		default:
			tag := "!!str"
			switch f.Value.Type() {
			case "bool":
				tag = "!!bool"
			case "int", "int64", "uint", "uint64":
				tag = "!!int"
			case "replicas", "size", "rate":
				if _, err := strconv.Atoi(value); err == nil {
					tag = "!!int"
				}
			}
			v = &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value}
		}
		from := src.of(f.Name)
		v.LineComment = string(from)
		if from == srcEnv {
			v.LineComment += " " + envName(f.Name)
		}
		if how := src.derived[f.Name]; how != "" && from == srcDefault {
			v.LineComment += " (" + how + ")"
		}
		m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: f.Name}, v)
	})
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&yaml.Node{Kind: yaml.DocumentNode, HeadComment: head, Content: []*yaml.Node{m}}); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// mask replaces a secret in --print-config.
const mask = "****"

// secretFlags are secrets whose names do not say so (--nats-key and --redis-key name
// files, not keys).
var secretFlags = map[string]bool{"encryption-key": true, "queue-key": true}

// maskSecret masks value if the flag's name says it is a secret (a token, a
// password), and otherwise the credentials of every URL in it (comma-separated):
// the password (redis://:secret@host becomes redis://:****@host), or the user of a
// NATS URL without one, which is how a NATS token is given (nats://token@host).
// Empty values stay empty, so that the output shows what is not set.
func maskSecret(name, value string) string {
	if value == "" {
		return ""
	}
	if secretFlags[name] {
		return mask
	}
	for _, word := range []string{"token", "password", "passwd", "secret"} {
		if strings.Contains(name, word) {
			return mask
		}
	}
	parts := strings.Split(value, ",")
	for i, p := range parts {
		parts[i] = maskURL(p)
	}
	return strings.Join(parts, ",")
}

func maskURL(raw string) string {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || u.User == nil || u.Host == "" && u.Opaque != "" {
		return raw
	}
	// url.URL escapes a * in user information, so a placeholder stands in for the mask.
	const placeholder = "SLUICEMASKED"
	user := u.User.Username()
	if pw, ok := u.User.Password(); ok && pw != "" {
		u.User = url.UserPassword(user, placeholder)
	} else if isNATSScheme(u.Scheme) && user != "" {
		u.User = url.User(placeholder)
	} else {
		return raw
	}
	return strings.Replace(u.String(), placeholder, mask, 1)
}

func isNATSScheme(s string) bool {
	switch strings.ToLower(s) {
	case "nats", "tls", "ws", "wss":
		return true
	}
	return false
}

// describeOrigin names where the config file's name came from, for messages.
func describeOrigin(src source) string {
	if src == srcEnv {
		return envName("config")
	}
	return "--config"
}

// configErrorLines turns applyConfig's error into lines for stderr.
func configErrorLines(err error) []string {
	var lines []string
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			lines = append(lines, e.Error())
		}
		return lines
	}
	return strings.Split(err.Error(), "\n")
}

// loadFlags completes the flags that cobra parsed from the command line: every flag
// not given there is taken from its SLUICE_* environment variable, and then, for a
// command with --config (see configFlags), every flag still unset from the config
// file. Precedence: command line > SLUICE_* environment > config file > default.
// It returns where each value came from; ok is false when the environment or the file
// were bad, which it has reported on stderr (the command exits 2).
func loadFlags(fs *pflag.FlagSet, stderr io.Writer) (src *flagSources, ok bool) {
	src = &flagSources{source: map[string]source{}}
	fs.Visit(func(f *pflag.Flag) { src.source[f.Name] = srcFlag })
	fromEnv, err := applyEnv(fs, os.LookupEnv)
	if err != nil {
		fmt.Fprintf(stderr, "sluice %s: %v\n", fs.Name(), err)
		return nil, false
	}
	for name := range fromEnv {
		src.source[name] = srcEnv
	}
	config := fs.Lookup("config")
	if config == nil || config.Value.String() == "" {
		return src, true
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
		return nil, false
	}
	for name := range set {
		src.source[name] = srcFile
	}
	src.unused = unused
	return src, true
}

// envName is the environment variable that backs flag name: SLUICE_ followed by the
// name in upper case with dashes as underscores.
func envName(name string) string {
	return "SLUICE_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// applyEnv sets every flag of fs that was not given on the command line from its
// environment variable (see envName), so flags win over the environment. A flag set
// this way counts as changed (pflag's Changed, fs.Visit), which is how commands tell
// "set" from "default". An empty variable counts as set: SLUICE_REDIS= turns Redis
// off. --help is never read from the environment. It returns the names of the flags
// it set.
func applyEnv(fs *pflag.FlagSet, lookupEnv func(string) (string, bool)) (map[string]bool, error) {
	set := map[string]bool{}
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if err != nil || f.Changed || f.Name == "help" {
			return
		}
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if !ok {
			return
		}
		if e := fs.Set(f.Name, v); e != nil {
			err = fmt.Errorf("environment variable %s (for --%s): invalid value %q: %s", name, f.Name, v, want(f, e))
			return
		}
		set[f.Name] = true
	})
	return set, err
}
