package main

import (
	"bytes"
	"cmp"
	"context"
	"go/doc/comment"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"go.yaml.in/yaml/v3"
)

// runIn runs the sluice command line args in process.
func runIn(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

// writeFile writes content to a new file in a temporary directory and returns its path.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// setting is one line of --print-config: the value as --config reads it (a list
// joined with commas) and its source.
type setting struct{ value, source string }

// printedConfig runs `sluice args… --print-config` and parses what it prints.
func printedConfig(t *testing.T, args ...string) map[string]setting {
	t.Helper()
	code, out, errOut := runIn(t, append(args, "--print-config")...)
	if code != exitOK {
		t.Fatalf("%v --print-config: exit %d\n%s", args, code, errOut)
	}
	return parsePrinted(t, out)
}

func parsePrinted(t *testing.T, out string) map[string]setting {
	t.Helper()
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("--print-config printed no YAML: %v\n%s", err, out)
	}
	m := doc.Content[0]
	got := map[string]setting{}
	for i := 0; i < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		value := v.Value
		if v.Kind == yaml.SequenceNode {
			var parts []string
			for _, e := range v.Content {
				parts = append(parts, e.Value)
			}
			value = strings.Join(parts, ",")
		}
		got[k.Value] = setting{value, strings.TrimPrefix(v.LineComment, "# ")}
	}
	return got
}

func TestConfigPrecedence(t *testing.T) {
	// One key of each kind: string, int, bool, duration and list. The file sets all
	// of them; the environment and the command line some.
	file := writeFile(t, "sluice.yaml", `
listen: 127.0.0.1:7001
ipv6-prefix: 48
shadow: true
shutdown-timeout: 45s
trusted-proxies: [10.0.0.0/8, 192.168.0.0/16]
`)
	for _, tc := range []struct {
		name  string
		env   map[string]string
		args  []string
		key   string
		want  setting
		noCfg bool // run without the file
	}{
		{name: "string default", key: "listen", noCfg: true, want: setting{"127.0.0.1:8080", "default"}},
		{name: "string file", key: "listen", want: setting{"127.0.0.1:7001", "file"}},
		{name: "string env over file", key: "listen", env: map[string]string{"SLUICE_LISTEN": "127.0.0.1:7002"},
			want: setting{"127.0.0.1:7002", "env SLUICE_LISTEN"}},
		{name: "string flag over env", key: "listen", env: map[string]string{"SLUICE_LISTEN": "127.0.0.1:7002"},
			args: []string{"--listen", "127.0.0.1:7003"}, want: setting{"127.0.0.1:7003", "flag"}},
		{name: "int default", key: "ipv6-prefix", noCfg: true, want: setting{"64", "default"}},
		{name: "int file", key: "ipv6-prefix", want: setting{"48", "file"}},
		{name: "int env over file", key: "ipv6-prefix", env: map[string]string{"SLUICE_IPV6_PREFIX": "56"},
			want: setting{"56", "env SLUICE_IPV6_PREFIX"}},
		{name: "int flag over env", key: "ipv6-prefix", env: map[string]string{"SLUICE_IPV6_PREFIX": "56"},
			args: []string{"--ipv6-prefix=60"}, want: setting{"60", "flag"}},
		{name: "bool default", key: "shadow", noCfg: true, want: setting{"false", "default"}},
		{name: "bool file", key: "shadow", want: setting{"true", "file"}},
		{name: "bool env over file", key: "shadow", env: map[string]string{"SLUICE_SHADOW": "false"},
			want: setting{"false", "env SLUICE_SHADOW"}},
		{name: "bool flag over env", key: "shadow", env: map[string]string{"SLUICE_SHADOW": "false"},
			args: []string{"--shadow"}, want: setting{"true", "flag"}},
		{name: "duration default", key: "shutdown-timeout", noCfg: true, want: setting{"30s", "default"}},
		{name: "duration file", key: "shutdown-timeout", want: setting{"45s", "file"}},
		{name: "duration env over file", key: "shutdown-timeout", env: map[string]string{"SLUICE_SHUTDOWN_TIMEOUT": "1m"},
			want: setting{"1m0s", "env SLUICE_SHUTDOWN_TIMEOUT"}},
		{name: "duration flag over env", key: "shutdown-timeout", env: map[string]string{"SLUICE_SHUTDOWN_TIMEOUT": "1m"},
			args: []string{"--shutdown-timeout", "5s"}, want: setting{"5s", "flag"}},
		{name: "list default", key: "trusted-proxies", noCfg: true, want: setting{"", "default"}},
		{name: "list file", key: "trusted-proxies", want: setting{"10.0.0.0/8,192.168.0.0/16", "file"}},
		{name: "list env over file", key: "trusted-proxies", env: map[string]string{"SLUICE_TRUSTED_PROXIES": "172.16.0.0/12"},
			want: setting{"172.16.0.0/12", "env SLUICE_TRUSTED_PROXIES"}},
		{name: "list flag over env", key: "trusted-proxies", env: map[string]string{"SLUICE_TRUSTED_PROXIES": "172.16.0.0/12"},
			args: []string{"--trusted-proxies", "127.0.0.1/32,::1/128"}, want: setting{"127.0.0.1/32,::1/128", "flag"}},
		{name: "flag over file without env", key: "shutdown-timeout", args: []string{"--shutdown-timeout=2s"},
			want: setting{"2s", "flag"}},
		{name: "empty env over file", key: "listen", env: map[string]string{"SLUICE_LISTEN": ""},
			want: setting{"", "env SLUICE_LISTEN"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			args := []string{"serve"}
			if !tc.noCfg {
				args = append(args, "--config", file)
			}
			got := printedConfig(t, append(args, tc.args...)...)
			if got[tc.key] != tc.want {
				t.Errorf("%s = %+v, want %+v", tc.key, got[tc.key], tc.want)
			}
		})
	}
}

// TestConfigReachesTheCommand checks that values from a file are the ones the
// command runs with, not only the ones it prints: a bad --upstream from the file
// fails the start as one on the command line would.
func TestConfigReachesTheCommand(t *testing.T) {
	file := writeFile(t, "sluice.yaml", "rules: [x.yaml]\nupstream: ftp://nope\n")
	code, _, errOut := runIn(t, "serve", "--config", file)
	if code != exitUsage || !strings.Contains(errOut, `--upstream "ftp://nope"`) {
		t.Errorf("exit %d, stderr %q", code, errOut)
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		cmd     string // default serve
		content string
		want    []string // each a substring of stderr; FILE stands for the path
	}{
		{name: "unknown key with its line", content: "listen: 127.0.0.1:1\n\nadmin-lisen: 127.0.0.1:2\n",
			want: []string{`FILE:3: unknown key "admin-lisen" (did you mean "admin-listen"?)`}},
		{name: "unknown key far from any", content: "frobnicate: 1\n",
			want: []string{`FILE:1: unknown key "frobnicate"`}},
		{name: "bad duration", content: "shutdown-timeout: 30\n",
			want: []string{`FILE:1: shutdown-timeout: invalid value "30": want a duration`}},
		{name: "bad int", content: "\nipv6-prefix: wide\n",
			want: []string{`FILE:2: ipv6-prefix: invalid value "wide": want an integer`}},
		{name: "int out of range", content: "max-keys: 99999999999999999999\n",
			want: []string{`FILE:1: max-keys: invalid value "99999999999999999999": want an integer (value out of range)`}},
		{name: "bad size", content: "max-body: 10 MiBs\n",
			want: []string{`FILE:1: max-body: invalid value "10 MiBs": want a size in bytes, plain or with a unit: 1048576, 64KiB, 10MiB`}},
		{name: "size too large", content: "max-body: 99999999999999999999\n",
			want: []string{`FILE:1: max-body: invalid value "99999999999999999999": want a size`}},
		{name: "bad forwarded header", content: "forwarded-header: x-real-ip\n",
			want: []string{`FILE:1: forwarded-header: invalid value "x-real-ip": want x-forwarded-for or forwarded`}},
		{name: "forwarded header without a value", content: "forwarded-header:\n", want: []string{`FILE:1: forwarded-header: no value`}},
		{name: "bad bool", content: "shadow: yes\n",
			want: []string{`FILE:1: shadow: invalid value "yes": want true or false`}},
		{name: "bool without a value", content: "shadow:\n", want: []string{`FILE:1: shadow: no value`}},
		{name: "list for a single value", content: "listen: [a, b]\n",
			want: []string{`FILE:1: listen: takes one value, not a list`}},
		{name: "mapping for a value", content: "upstream:\n  url: http://x\n",
			want: []string{`FILE:2: upstream: want a value, not a mapping`}},
		{name: "list of mappings", content: "rules:\n  - a.yaml\n  - {b: c}\n",
			want: []string{`FILE:2: rules: line 3: want a list of strings`}},
		{name: "twice", content: "listen: a\nadmin-listen: b\nlisten: c\n",
			want: []string{`FILE:3: listen is set twice (first on line 1)`}},
		{name: "twice in two spellings", content: "admin-listen: a\nadmin_listen: b\n",
			want: []string{`FILE:2: admin-listen is set twice (first on line 1)`}},
		{name: "not a mapping", content: "- listen: a\n", want: []string{`FILE:1: want a mapping of flag names to values`}},
		{name: "not YAML", content: "listen: [a\n", want: []string{`FILE: yaml: line 1:`}},
		{name: "config in the file", content: "config: other.yaml\n",
			want: []string{`FILE:1: "config" cannot be set in a config file; give --config on the command line`}},
		{name: "every problem at once", content: "nope: 1\nreplicas: three\nshadow: maybe\n",
			want: []string{`FILE:1: unknown key "nope"`, `FILE:2: replicas: invalid value "three"`, `FILE:3: shadow: invalid value "maybe"`}},
		{name: "checked even where the command line wins", content: "shutdown-timeout: soon\n",
			want: []string{`FILE:1: shutdown-timeout: invalid value "soon"`}},
		{name: "checked even where the command has no such flag", cmd: "dispatch", content: "ipv6-prefix: wide\n",
			want: []string{`sluice dispatch: FILE:1: ipv6-prefix: invalid value "wide"`}},
		{name: "dlq: its own flags are not keys", cmd: "dlq", content: "yes: true\nlimit: 5\n",
			want: []string{`FILE:1: "yes" cannot be set in a config file; give --yes on the command line`, `FILE:2: "limit" cannot be set`}},
		{name: "dlq checks the whole file", cmd: "dlq", content: "upstream: http://x\nnats-listen: [a]\n",
			want: []string{`FILE:2: nats-listen: takes one value, not a list`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := writeFile(t, "sluice.yaml", tc.content)
			cmd := cmp.Or(tc.cmd, "serve")
			args := []string{cmd, "--config", path, "--shutdown-timeout", "1s"}
			switch cmd {
			case "dlq":
				args = []string{"dlq", "list", "orders", "--config", path}
			case "dispatch":
				args = []string{"dispatch", "--config", path}
			}
			code, out, errOut := runIn(t, args...)
			if code != exitUsage {
				t.Errorf("exit %d, want %d\n%s", code, exitUsage, errOut)
			}
			if out != "" {
				t.Errorf("stdout: %q", out)
			}
			for _, w := range tc.want {
				if w = strings.ReplaceAll(w, "FILE", path); !strings.Contains(errOut, w) {
					t.Errorf("stderr %q\ndoes not contain %q", errOut, w)
				}
			}
		})
	}
}

func TestConfigFileMissing(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	for _, tc := range []struct {
		name string
		env  string
		args []string
		want string
	}{
		{name: "--config", args: []string{"serve", "--config", missing}, want: "sluice serve: --config: open " + missing},
		{name: "SLUICE_CONFIG", env: missing, args: []string{"dispatch"}, want: "sluice dispatch: SLUICE_CONFIG: open " + missing},
		{name: "dlq", args: []string{"dlq", "list", "orders", "--config", missing}, want: "sluice dlq: --config: open " + missing},
		{name: "a directory", args: []string{"ingress", "--config", t.TempDir()}, want: "is a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.env != "" {
				t.Setenv("SLUICE_CONFIG", tc.env)
			}
			code, _, errOut := runIn(t, tc.args...)
			if code != exitUsage || !strings.Contains(errOut, tc.want) {
				t.Errorf("exit %d, stderr %q; want exit 2 and %q", code, errOut, tc.want)
			}
		})
	}
}

func TestSluiceConfigEnv(t *testing.T) {
	a := writeFile(t, "a.yaml", "listen: 127.0.0.1:7101\n")
	b := writeFile(t, "b.yaml", "listen: 127.0.0.1:7102\n")
	t.Setenv("SLUICE_CONFIG", a)
	if got := printedConfig(t, "serve")["listen"]; got != (setting{"127.0.0.1:7101", "file"}) {
		t.Errorf("SLUICE_CONFIG: listen = %+v", got)
	}
	if got := printedConfig(t, "serve", "--config", b)["listen"]; got.value != "127.0.0.1:7102" {
		t.Errorf("--config over SLUICE_CONFIG: listen = %+v", got)
	}
	if got := printedConfig(t, "serve", "--config="); got["listen"] != (setting{"127.0.0.1:8080", "default"}) {
		t.Errorf("--config= turns SLUICE_CONFIG off: listen = %+v", got["listen"])
	}
	_, out, _ := runIn(t, "serve", "--print-config")
	if !strings.Contains(out, "# config file: "+a+" (from SLUICE_CONFIG)") {
		t.Errorf("the header does not name the file and SLUICE_CONFIG:\n%s", out)
	}
	// simulate takes no config file: SLUICE_CONFIG is no concern of it.
	trace := writeFile(t, "trace", "0s\n")
	if code, _, errOut := runIn(t, "simulate", "--algorithm", "fixed_window", "--limit", "1", "--window", "1s", "--trace", trace); code != exitOK {
		t.Errorf("simulate with SLUICE_CONFIG set: exit %d\n%s", code, errOut)
	}
}

func TestConfigSharedBetweenCommands(t *testing.T) {
	file := writeFile(t, "sluice.yaml", `
rules: [a.yaml]
upstream: http://orders:8080
redis: redis://redis:6379/0
nats: nats://127.0.0.1:1
queue-key: `+testQueueKey+`
delivery-timeout: 5s
`)
	got := printedConfig(t, "dispatch", "--config", file)
	if _, ok := got["upstream"]; ok {
		t.Error("dispatch prints upstream, which it has no flag for")
	}
	if got["delivery-timeout"] != (setting{"5s", "file"}) || got["nats"] != (setting{"nats://127.0.0.1:1", "file"}) {
		t.Errorf("dispatch: delivery-timeout %+v, nats %+v", got["delivery-timeout"], got["nats"])
	}
	_, out, _ := runIn(t, "dispatch", "--config", file, "--print-config")
	if !strings.Contains(out, "has no flags for: upstream (line 3)\n") || got["redis"] != (setting{"redis://redis:6379/0", "file"}) {
		t.Errorf("the keys dispatch ignores are not listed:\n%s", out)
	}
	if got := printedConfig(t, "ingress", "--config", file); got["delivery-timeout"] != (setting{}) || got["upstream"].source != "file" {
		t.Errorf("ingress: %+v", got)
	}
	// dlq takes the NATS keys: here it reaches for nats://127.0.0.1:1, where no
	// server listens, and fails (1) instead of looking at --data-dir.
	code, _, errOut := runIn(t, "dlq", "list", "orders", "--config", file)
	if code != exitFailure || !strings.Contains(errOut, "--nats:") {
		t.Errorf("dlq with the file: exit %d\n%s", code, errOut)
	}
}

func TestPrintConfigMasksSecretsAndRoundTrips(t *testing.T) {
	secrets := []string{"hunter2", "s3cret-token", "natspass", "natstoken", "redispw", "listen-token-0123456789abcdef0123", "client-token-0123456789abcdef0123", "at-rest-key-0123456789abcdef01234", testQueueKey}
	file := writeFile(t, "sluice.yaml", `
rules: [a.yaml, b.yaml]
upstream: http://orders:8080
admin-token: s3cret-token
redis: redis://app:hunter2@redis:6379/0
nats: [nats://natstoken@n1:4222, "nats://user:natspass@n2:4222", nats://n3:4222]
nats-key: /etc/sluice/nats.key
queue-key: `+testQueueKey+`
nats-listen-token: listen-token-0123456789abcdef0123
nats-token: client-token-0123456789abcdef0123
encryption-key-file: /etc/sluice/at-rest.key
shutdown-timeout: 45s
shadow: true
max-body: 1048576
`)
	t.Setenv("SLUICE_REDIS_PASSWORD", "redispw")
	t.Setenv("SLUICE_ENCRYPTION_KEY", "at-rest-key-0123456789abcdef01234")
	_, out, errOut := runIn(t, "serve", "--config", file, "--print-config", "--log-level", "debug")
	for _, s := range secrets {
		if strings.Contains(out+errOut, s) {
			t.Errorf("--print-config shows the secret %q:\n%s", s, out)
		}
	}
	got := parsePrinted(t, out)
	for key, want := range map[string]setting{
		"admin-token":         {"****", "file"},
		"redis-password":      {"****", "env SLUICE_REDIS_PASSWORD"},
		"redis":               {"redis://app:****@redis:6379/0", "file"},
		"nats":                {"nats://****@n1:4222,nats://user:****@n2:4222,nats://n3:4222", "file"},
		"nats-key":            {"/etc/sluice/nats.key", "file"}, // a path, not a secret
		"nats-listen-token":   {"****", "file"},
		"nats-token":          {"****", "file"},
		"encryption-key":      {"****", "env SLUICE_ENCRYPTION_KEY"},
		"encryption-key-file": {"/etc/sluice/at-rest.key", "file"},
		"queue-key":           {"****", "file"},
		"rules":               {"a.yaml,b.yaml", "file"},
		"log-level":           {"debug", "flag"},
		"upstream":            {"http://orders:8080", "file"},
		"admin-listen":        {"127.0.0.1:9090", "default"},
		"redis-ca":            {"", "default"},
	} {
		if got[key] != want {
			t.Errorf("%s = %+v, want %+v", key, got[key], want)
		}
	}

	// Fed back as --config, the output gives the same configuration (the masks
	// stand for themselves), every value now from the file.
	again := writeFile(t, "printed.yaml", out)
	os.Unsetenv("SLUICE_REDIS_PASSWORD") // t.Setenv restores it
	os.Unsetenv("SLUICE_ENCRYPTION_KEY")
	got2 := printedConfig(t, "serve", "--config", again)
	if len(got2) != len(got) {
		t.Errorf("%d keys, then %d", len(got), len(got2))
	}
	for key, s := range got {
		if got2[key].value != s.value {
			t.Errorf("round trip: %s = %q, then %q", key, s.value, got2[key].value)
		}
		if got2[key].source != "file" {
			t.Errorf("round trip: %s from %s, want file", key, got2[key].source)
		}
	}
	for _, cmd := range []string{"ingress", "dispatch"} {
		_, out, _ := runIn(t, cmd, "--config", file, "--print-config")
		got := parsePrinted(t, out)
		again := writeFile(t, cmd+".yaml", out)
		for key, s := range printedConfig(t, cmd, "--config", again) {
			if got[key].value != s.value {
				t.Errorf("%s round trip: %s = %q, then %q", cmd, key, got[key].value, s.value)
			}
		}
	}
}

func TestMaskSecret(t *testing.T) {
	for _, tc := range []struct{ name, value, want string }{
		{"admin-token", "abc", "****"},
		{"admin-token", "", ""},
		{"redis-password", "pw", "****"},
		{"some-secret", "x", "****"},
		{"redis", "redis://:pw@h:6379/0", "redis://:****@h:6379/0"},
		{"redis", "rediss://user:p%40ss@h:6380/1?addr=h2:6380", "rediss://user:****@h:6380/1?addr=h2:6380"},
		{"redis", "redis://user@h:6379", "redis://user@h:6379"},
		{"redis", "redis://h:6379/0", "redis://h:6379/0"},
		{"nats", "nats://tok@a:4222,nats://b:4222", "nats://****@a:4222,nats://b:4222"},
		{"nats", "tls://u:p@a:4222", "tls://u:****@a:4222"},
		{"upstream", "http://u:p@orders", "http://u:****@orders"},
		{"nats-key", "/etc/key.pem", "/etc/key.pem"},
		{"queue-key", "c2VjcmV0", "****"},
		{"encryption-key", "k", "****"},
		{"encryption-key-file", "/etc/sluice/at-rest.key", "/etc/sluice/at-rest.key"},
		{"nats-listen-token", "t", "****"},
		{"nats-token", "t", "****"},
		{"listen", "127.0.0.1:8080", "127.0.0.1:8080"},
	} {
		if got := maskSecret(tc.name, tc.value); got != tc.want {
			t.Errorf("maskSecret(%q, %q) = %q, want %q", tc.name, tc.value, got, tc.want)
		}
	}
}

// TestConfigKeys pins down what the loader relies on: every key is a flag of pflag's
// own kinds, a sizeFlag, a rateFlag, a replicasFlag or a forwardedHeaderFlag (their String and Set round-trip), and the
// list flags are exactly those whose help says comma-separated.
func TestConfigKeys(t *testing.T) {
	for name, f := range keyFlags() {
		switch f.Value.Type() {
		case "string", "bool", "int", "int64", "duration", "size", "rate", "replicas", "header":
		default:
			t.Errorf("--%s is a %s: the config file and --print-config handle string, bool, int, int64, duration, size, rate, replicas and header flags", name, f.Value.Type())
		}
		if comma := strings.Contains(f.Usage, "comma-separated"); comma != listFlags[name] {
			t.Errorf("--%s: comma-separated in its help is %v, a list key is %v", name, comma, listFlags[name])
		}
	}
	// dlq's NATS flags are keys: the file of serve serves dlq too.
	fs := pflag.NewFlagSet("dlq", pflag.ContinueOnError)
	new(natsConfig).flags(fs, false)
	keys := keyFlags()
	fs.VisitAll(func(f *pflag.Flag) {
		if keys[f.Name] == nil {
			t.Errorf("dlq's --%s is no config key", f.Name)
		}
	})
}

// docBlock returns the one code block of the command's documentation (doc.go, which
// go doc ./cmd/sluice prints) that starts with prefix.
func docBlock(t *testing.T, prefix string) string {
	t.Helper()
	var found []string
	for _, b := range new(comment.Parser).Parse(docText(t)).Content {
		if c, ok := b.(*comment.Code); ok && strings.HasPrefix(c.Text, prefix) {
			found = append(found, c.Text)
		}
	}
	if len(found) != 1 {
		t.Fatalf("doc.go has %d code blocks starting with %q, want 1", len(found), prefix)
	}
	return found[0]
}

// docText returns the text of the command's documentation (doc.go).
func docText(t *testing.T) string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil || f.Doc == nil {
		t.Fatalf("doc.go: %v", err)
	}
	return f.Doc.Text()
}

// TestDocConfigExample checks the example config file of the command's documentation
// (doc.go): every long-running command accepts it, and takes its values from it.
func TestDocConfigExample(t *testing.T) {
	example := docBlock(t, "# /etc/sluice/sluice.yaml")
	file := writeFile(t, "sluice.yaml", example)
	for _, cmd := range []string{"serve", "ingress", "dispatch"} {
		got := printedConfig(t, cmd, "--config", file)
		if got["rules"] != (setting{"/etc/sluice/rules", "file"}) {
			t.Errorf("%s: rules = %+v", cmd, got["rules"])
		}
		if got["nats"].source != "file" || got["log-format"] != (setting{"json", "file"}) {
			t.Errorf("%s: nats %+v, log-format %+v", cmd, got["nats"], got["log-format"])
		}
	}
	if got := printedConfig(t, "serve", "--config", file); got["redis"].source != "file" || got["upstream"].source != "file" {
		t.Errorf("serve: redis %+v, upstream %+v", got["redis"], got["upstream"])
	}
	// The documented sample output is what the binary prints (for the lines it shows).
	sample := docBlock(t, "# sluice serve: the effective configuration")
	t.Setenv("SLUICE_ADMIN_TOKEN", "t")
	t.Setenv("SLUICE_REDIS_PASSWORD", "p")
	_, out, _ := runIn(t, "serve", "--config", file, "--print-config")
	out = strings.ReplaceAll(out, file, "/etc/sluice/sluice.yaml")
	for _, line := range strings.Split(sample, "\n") {
		if line != "" && line != "…" && !strings.Contains(out, line+"\n") {
			t.Errorf("doc.go shows %q, which --print-config does not print:\n%s", line, out)
		}
	}
}

// TestDocFlagsTable: the flags table of the command's documentation (doc.go, "The flags
// of sluice serve") names every flag that serve, ingress, dispatch and rls list in
// their help, so that a new flag cannot ship undocumented.
func TestDocFlagsTable(t *testing.T) {
	_, table, ok := strings.Cut(docText(t), "\n# The flags of sluice serve\n")
	if !ok {
		t.Fatal(`doc.go has no section "The flags of sluice serve"`)
	}
	table, _, _ = strings.Cut(table, "\n# ")
	for _, cmd := range []string{"serve", "ingress", "dispatch", "rls"} {
		code, out, _ := runIn(t, cmd, "--help")
		if code != exitOK {
			t.Fatalf("%s --help: exit %d", cmd, code)
		}
		_, flags, _ := strings.Cut(out, "\nFlags")
		for line := range strings.Lines(flags) {
			name, _, _ := strings.Cut(strings.TrimPrefix(strings.TrimSpace(line), "-h, "), " ")
			if !strings.HasPrefix(name, "--") || name == "--help" {
				continue
			}
			if !strings.Contains(table, "`"+name+"`") {
				t.Errorf("%s %s is not in the flags table of doc.go", cmd, name)
			}
		}
	}
}
