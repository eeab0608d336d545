package deploy_test

import (
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// dockerfile is what the tests need of deploy/Dockerfile.
type dockerfile struct {
	args   map[string]string // ARG defaults before the first FROM
	stages []dockerStage
}

type dockerStage struct {
	from, name string
	instrs     []dockerInstr
}

type dockerInstr struct {
	op, rest string
}

// parseDockerfile reads the instructions of a Dockerfile: comments dropped, lines
// continued with a backslash joined.
func parseDockerfile(t *testing.T, path string) dockerfile {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	d := dockerfile{args: map[string]string{}}
	var logical []string
	var cur strings.Builder
	for _, line := range strings.Split(string(data), "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") || (trimmed == "" && cur.Len() == 0) {
			continue
		}
		if strings.HasSuffix(trimmed, "\\") {
			cur.WriteString(strings.TrimSuffix(trimmed, "\\") + " ")
			continue
		}
		cur.WriteString(trimmed)
		logical = append(logical, cur.String())
		cur.Reset()
	}
	if cur.Len() > 0 {
		t.Fatalf("%s: ends in a continued line", path)
	}
	for _, l := range logical {
		op, rest, _ := strings.Cut(l, " ")
		op = strings.ToUpper(op)
		rest = strings.TrimSpace(rest)
		switch {
		case op == "FROM":
			f := strings.Fields(rest)
			var st dockerStage
			for i := 0; i < len(f); i++ {
				switch {
				case strings.HasPrefix(f[i], "--"):
				case strings.EqualFold(f[i], "AS") && i+1 < len(f):
					st.name = f[i+1]
					i++
				default:
					st.from = f[i]
				}
			}
			d.stages = append(d.stages, st)
		case len(d.stages) == 0:
			if op != "ARG" {
				t.Fatalf("%s: %s before the first FROM", path, op)
			}
			name, def, _ := strings.Cut(rest, "=")
			d.args[name] = def
		default:
			st := &d.stages[len(d.stages)-1]
			st.instrs = append(st.instrs, dockerInstr{op, rest})
		}
	}
	if len(d.stages) < 2 {
		t.Fatalf("%s: want a multi-stage build, got %d stages", path, len(d.stages))
	}
	return d
}

// expand replaces ${NAME} and $NAME by the global ARG defaults.
func (d dockerfile) expand(s string) string {
	return os.Expand(s, func(k string) string { return d.args[k] })
}

func (st dockerStage) all(op string) []string {
	var out []string
	for _, in := range st.instrs {
		if in.op == op {
			out = append(out, in.rest)
		}
	}
	return out
}

// env returns the ENV of a stage (KEY=VALUE pairs, several per instruction).
func (st dockerStage) env(t *testing.T) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, rest := range st.all("ENV") {
		for _, kv := range strings.Fields(rest) {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				t.Fatalf("Dockerfile: ENV %q: use the KEY=VALUE form", rest)
			}
			if u, err := strconv.Unquote(v); err == nil {
				v = u
			}
			env[k] = v
		}
	}
	return env
}

// execForm parses the JSON (exec) form of ENTRYPOINT / CMD.
func execForm(t *testing.T, op, rest string) []string {
	t.Helper()
	var v []string
	if err := json.Unmarshal([]byte(rest), &v); err != nil {
		t.Fatalf("Dockerfile: %s %s: use the exec (JSON) form: %v", op, rest, err)
	}
	return v
}

// sluiceImageConfig is what the runtime image gives every container: its
// entrypoint, and the SLUICE_* defaults of its ENV.
type sluiceImageConfig struct {
	entrypoint []string
	env        map[string]string
	expose     []int
	binaries   []string // paths of the binaries it holds
}

func loadImageConfig(t *testing.T) sluiceImageConfig {
	t.Helper()
	d := parseDockerfile(t, "Dockerfile")
	final := d.stages[len(d.stages)-1]
	var ic sluiceImageConfig
	eps := final.all("ENTRYPOINT")
	if len(eps) != 1 {
		t.Fatalf("Dockerfile: want one ENTRYPOINT in the final stage, got %d", len(eps))
	}
	ic.entrypoint = execForm(t, "ENTRYPOINT", eps[0])
	ic.env = final.env(t)
	for _, e := range final.all("EXPOSE") {
		for _, p := range strings.Fields(e) {
			n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
			if err != nil {
				t.Fatalf("Dockerfile: EXPOSE %s: %v", e, err)
			}
			ic.expose = append(ic.expose, n)
		}
	}
	for _, c := range final.all("COPY") {
		f := strings.Fields(c)
		var srcs []string
		for _, s := range f[:len(f)-1] {
			if !strings.HasPrefix(s, "--") {
				srcs = append(srcs, s)
			}
		}
		dst := f[len(f)-1]
		for _, s := range srcs {
			base := s[strings.LastIndex(s, "/")+1:]
			if strings.HasSuffix(dst, "/") {
				ic.binaries = append(ic.binaries, dst+base)
			}
		}
	}
	return ic
}

// TestDockerfileOffline checks that deploy/Dockerfile builds with the legacy builder as
// well as with BuildKit, and with no registry but for its base images, which are build
// arguments (a mirror or a local image stands in): no `# syntax=` line (BuildKit would
// fetch that frontend), no RUN --mount and no FROM --platform (the legacy builder has
// neither; $BUILDPLATFORM is empty there), and every stage that is no earlier stage
// names its image through a global ARG with a default.
func TestDockerfileOffline(t *testing.T) {
	raw, err := os.ReadFile("Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range strings.Split(string(raw), "\n") {
		l := strings.ToLower(strings.TrimSpace(line))
		if strings.HasPrefix(l, "#") && strings.HasPrefix(strings.ReplaceAll(strings.TrimPrefix(l, "#"), " ", ""), "syntax=") {
			t.Errorf("Dockerfile:%d: %s: BuildKit fetches that frontend from a registry", i+1, line)
		}
		if !strings.HasPrefix(l, "#") && strings.Contains(l, "--mount=") {
			t.Errorf("Dockerfile:%d: RUN --mount: the legacy builder refuses it", i+1)
		}
		if strings.HasPrefix(l, "from ") && strings.Contains(l, "--platform") {
			t.Errorf("Dockerfile:%d: FROM --platform: $BUILDPLATFORM is empty in the legacy builder", i+1)
		}
	}
	d := parseDockerfile(t, "Dockerfile")
	var names []string
	for _, st := range d.stages {
		if !slices.Contains(names, st.from) {
			name := strings.Trim(st.from, "${}")
			if !strings.HasPrefix(st.from, "$") || d.args[name] == "" {
				t.Errorf("Dockerfile: FROM %s: name the image with a global ARG with a default (FROM ${NAME_IMAGE}), so that a mirror can stand in", st.from)
			}
		}
		names = append(names, st.name)
	}
}

// TestDockerfile checks the image: a Go builder at least as new as go.mod's go
// directive that builds both commands, and a non-root runtime stage whose
// entrypoint is sluice, whose SLUICE_* defaults are flags of sluice serve, and whose
// EXPOSE are the ports those defaults listen on.
func TestDockerfile(t *testing.T) {
	d := parseDockerfile(t, "Dockerfile")
	build, final := d.stages[0], d.stages[len(d.stages)-1]

	from := d.expand(build.from)
	repo, tag := splitImage(from)
	if repo != "golang" {
		t.Errorf("builder stage FROM %s: want the golang image", from)
	}
	if goMod := goModVersion(t, "go"); versionLess(majorMinor(t, tag), majorMinor(t, goMod)) {
		t.Errorf("builder golang:%s is older than go.mod's go %s", tag, goMod)
	}
	runs := strings.Join(build.all("RUN"), "\n")
	if !slices.Contains(strings.Fields(runs), "./cmd/sluice") {
		t.Errorf("builder stage does not build ./cmd/sluice")
	}
	// sluice-bench is a module of its own: built from its directory, with its go.mod.
	if !strings.Contains(runs, "go build -C cmd/sluice-bench ") {
		t.Errorf("builder stage does not build cmd/sluice-bench (go build -C cmd/sluice-bench …)")
	}
	if copies := strings.Join(build.all("COPY"), "\n"); !strings.Contains(copies, "cmd/sluice-bench/go.mod") {
		t.Errorf("builder stage does not copy cmd/sluice-bench/go.mod before downloading modules")
	}
	if !strings.Contains(runs, "CGO_ENABLED=0") {
		t.Errorf("builder stage: build with CGO_ENABLED=0 (the runtime image has no libc)")
	}

	if r, _ := splitImage(d.expand(final.from)); !strings.HasPrefix(r, "gcr.io/distroless/") && r != "alpine" {
		t.Errorf("runtime stage FROM %s: want distroless or alpine", d.expand(final.from))
	}
	users := final.all("USER")
	if len(users) == 0 {
		t.Errorf("runtime stage: no USER (it would run as root)")
	} else if u, _, _ := strings.Cut(users[len(users)-1], ":"); u == "0" || u == "root" {
		t.Errorf("runtime stage: USER %s", users[len(users)-1])
	}

	ic := loadImageConfig(t)
	if len(ic.entrypoint) != 1 || !slices.Contains(ic.binaries, ic.entrypoint[0]) || !strings.HasSuffix(ic.entrypoint[0], "/sluice") {
		t.Errorf("ENTRYPOINT %v: want the sluice binary the image copies (%v)", ic.entrypoint, ic.binaries)
	}
	if len(final.all("CMD")) == 1 {
		cmd := execForm(t, "CMD", final.all("CMD")[0])
		if len(cmd) == 0 || !slices.Contains(sluiceCommands(t), cmd[0]) {
			t.Errorf("CMD %v: not a sluice command", cmd)
		}
	}
	g := parseSluiceArgs(t, "Dockerfile ENV", []string{"serve"}, ic.env)
	for k := range ic.env {
		if !strings.HasPrefix(k, "SLUICE_") {
			t.Errorf("Dockerfile: ENV %s is not a SLUICE_* setting", k)
		}
	}
	want := []int{g.port(t, "listen"), g.port(t, "admin-listen")}
	slices.Sort(want)
	got := slices.Clone(ic.expose)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Dockerfile: EXPOSE %v, but the image's sluice serve listens on %v", got, want)
	}
	if _, err := os.Stat("Dockerfile.dockerignore"); err != nil {
		t.Errorf("no Dockerfile.dockerignore: the whole repository (.git included) would be the build context")
	}
}
