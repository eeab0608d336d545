package deploy_test

import (
	"cmp"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/rules"
)

// The compose file, as far as the tests read it. Unknown keys are ignored; the YAML
// merge keys (<<: *anchor) of the file are resolved by the decoder.
type composeFile struct {
	Name     string                     `yaml:"name"`
	Services map[string]composeService  `yaml:"services"`
	Networks map[string]*composeNetwork `yaml:"networks"`
	Volumes  map[string]any             `yaml:"volumes"`
}

type composeService struct {
	Image           string          `yaml:"image"`
	Build           any             `yaml:"build"`
	Command         stringList      `yaml:"command"`
	Entrypoint      stringList      `yaml:"entrypoint"`
	Environment     envMap          `yaml:"environment"`
	Ports           []string        `yaml:"ports"`
	Expose          []string        `yaml:"expose"`
	Volumes         []string        `yaml:"volumes"`
	Networks        serviceNetworks `yaml:"networks"`
	DependsOn       nameSet         `yaml:"depends_on"`
	StopGracePeriod string          `yaml:"stop_grace_period"`
	ReadOnly        bool            `yaml:"read_only"`
	Healthcheck     *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
}

type composeNetwork struct {
	IPAM struct {
		Config []struct {
			Subnet string `yaml:"subnet"`
		} `yaml:"config"`
	} `yaml:"ipam"`
}

// stringList is a command or entrypoint: a list, or a string split on spaces.
type stringList []string

func (s *stringList) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*s = strings.Fields(n.Value)
		return nil
	}
	var l []string
	err := n.Decode(&l)
	*s = l
	return err
}

// envMap is an environment: a mapping, or a list of KEY=VALUE.
type envMap map[string]string

func (e *envMap) UnmarshalYAML(n *yaml.Node) error {
	out := envMap{}
	switch n.Kind {
	case yaml.MappingNode:
		// Decoding resolves merge keys (<<: *anchor).
		if err := n.Decode((*map[string]string)(&out)); err != nil {
			return err
		}
	case yaml.SequenceNode:
		for _, c := range n.Content {
			k, v, _ := strings.Cut(c.Value, "=")
			out[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment: want a mapping or a list", n.Line)
	}
	*e = out
	return nil
}

// nameSet is a list of names, or a mapping whose keys are the names (depends_on).
type nameSet []string

func (s *nameSet) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i < len(n.Content); i += 2 {
			*s = append(*s, n.Content[i].Value)
		}
		return nil
	case yaml.SequenceNode:
		var l []string
		err := n.Decode(&l)
		*s = l
		return err
	}
	return fmt.Errorf("line %d: want a list or a mapping", n.Line)
}

// serviceNetworks are the networks of a service: a list of names, or a mapping with
// per-network settings.
type serviceNetworks map[string]struct {
	IPv4Address string   `yaml:"ipv4_address"`
	Aliases     []string `yaml:"aliases"`
}

func (s *serviceNetworks) UnmarshalYAML(n *yaml.Node) error {
	out := serviceNetworks{}
	switch n.Kind {
	case yaml.SequenceNode:
		for _, c := range n.Content {
			out[c.Value] = out[c.Value] //nolint:staticcheck // SA4018: the name, with no settings (the value type has no name)
		}
	case yaml.MappingNode:
		m := map[string]*struct {
			IPv4Address string   `yaml:"ipv4_address"`
			Aliases     []string `yaml:"aliases"`
		}{}
		if err := n.Decode(&m); err != nil {
			return err
		}
		for k, v := range m {
			e := out[k]
			if v != nil {
				e.IPv4Address, e.Aliases = v.IPv4Address, v.Aliases
			}
			out[k] = e
		}
	default:
		return fmt.Errorf("line %d: networks: want a list or a mapping", n.Line)
	}
	*s = out
	return nil
}

// composeEnv is the environment of `docker compose up` in the tests: a value for
// every variable that compose.yaml uses. The values are random, so one found in a
// configuration can only have come from the environment, never from a file.
var composeEnv = map[string]string{
	"SLUICE_QUEUE_KEY":     base64.StdEncoding.EncodeToString(randomBytes(32)),
	"NATS_SLUICE_PASSWORD": hex.EncodeToString(randomBytes(32)),
	"NATS_EVENTS_PASSWORD": hex.EncodeToString(randomBytes(32)),
	"NATS_WORKER_PASSWORD": hex.EncodeToString(randomBytes(32)),
	"NATS_ROUTE_PASSWORD":  hex.EncodeToString(randomBytes(32)),
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand)
	return b
}

// loadCompose reads compose.yaml as `docker compose` does with composeEnv.
func loadCompose(t *testing.T) composeFile {
	t.Helper()
	c, _, err := readCompose(composeEnv)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// readCompose reads compose.yaml and interpolates its values with env, as `docker
// compose` does; it returns the names of the variables the file uses.
func readCompose(env map[string]string) (composeFile, []string, error) {
	var c composeFile
	path := filepath.Join(composeDir, "compose.yaml")
	data, err := os.ReadFile(path)
	if err != nil {
		return c, nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return c, nil, fmt.Errorf("%s: %w", path, err)
	}
	used := map[string]bool{}
	lookup := func(name string) (string, bool) {
		used[name] = true
		v, ok := env[name]
		return v, ok
	}
	if err := interpolateNode(&doc, lookup, map[*yaml.Node]bool{}); err != nil {
		return c, nil, fmt.Errorf("%s: %w", path, err)
	}
	if err := doc.Decode(&c); err != nil {
		return c, nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(c.Services) == 0 {
		return c, nil, fmt.Errorf("%s: no services", path)
	}
	return c, slices.Sorted(maps.Keys(used)), nil
}

// interpolateNode interpolates every scalar value under n (mapping keys are not
// interpolated, as in compose), each node once however many aliases reach it.
func interpolateNode(n *yaml.Node, lookup func(string) (string, bool), seen map[*yaml.Node]bool) error {
	if n == nil || seen[n] {
		return nil
	}
	seen[n] = true
	switch n.Kind {
	case yaml.ScalarNode:
		v, err := interpolate(n.Value, lookup)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		n.Value = v
	case yaml.AliasNode:
		return interpolateNode(n.Alias, lookup, seen)
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			if err := interpolateNode(n.Content[i], lookup, seen); err != nil {
				return err
			}
		}
	default:
		for _, c := range n.Content {
			if err := interpolateNode(c, lookup, seen); err != nil {
				return err
			}
		}
	}
	return nil
}

// interpolate substitutes variables in s as compose does: $$ is a $; $NAME and
// ${NAME} the value (empty when unset); ${NAME:-default} and ${NAME-default} the
// default when unset or empty (-: unset only); ${NAME:?message} and ${NAME?message}
// an error when unset or empty; ${NAME:+alt} and ${NAME+alt} alt when set. A $
// before anything else stays.
func interpolate(s string, lookup func(string) (string, bool)) (string, error) {
	isName := func(c byte, first bool) bool {
		return c == '_' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || !first && '0' <= c && c <= '9'
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch next := s[i+1]; {
		case next == '$':
			b.WriteByte('$')
			i++
		case isName(next, true):
			j := i + 1
			for j < len(s) && isName(s[j], false) {
				j++
			}
			v, _ := lookup(s[i+1 : j])
			b.WriteString(v)
			i = j - 1
		case next == '{':
			end, depth := -1, 0
			for j := i + 1; j < len(s) && end < 0; j++ {
				switch s[j] {
				case '{':
					depth++
				case '}':
					if depth--; depth == 0 {
						end = j
					}
				}
			}
			if end < 0 {
				return "", fmt.Errorf("%q: unclosed ${", s)
			}
			expr := s[i+2 : end]
			n := 0
			for n < len(expr) && isName(expr[n], n == 0) {
				n++
			}
			name, rest := expr[:n], expr[n:]
			if name == "" {
				return "", fmt.Errorf("%q: invalid ${%s}", s, expr)
			}
			v, set := lookup(name)
			colon := strings.HasPrefix(rest, ":")
			if colon {
				rest = rest[1:]
			}
			present := set && (!colon || v != "")
			switch {
			case rest == "" && !colon:
				b.WriteString(v)
			case strings.HasPrefix(rest, "-") && present:
				b.WriteString(v)
			case strings.HasPrefix(rest, "+") && !present:
			case strings.HasPrefix(rest, "-"), strings.HasPrefix(rest, "+"):
				alt, err := interpolate(rest[1:], lookup)
				if err != nil {
					return "", err
				}
				b.WriteString(alt)
			case strings.HasPrefix(rest, "?"):
				if !present {
					return "", fmt.Errorf("required variable %s is missing a value: %s", name, rest[1:])
				}
				b.WriteString(v)
			default:
				return "", fmt.Errorf("%q: invalid ${%s}", s, expr)
			}
			i = end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), nil
}

// mount is one short-syntax volume of a service.
type mount struct {
	source, target string
	readOnly       bool
	named          bool // a named volume, not a bind mount
}

func parseMount(v string) mount {
	parts := strings.Split(v, ":")
	m := mount{source: parts[0]}
	if len(parts) > 1 {
		m.target = parts[1]
	}
	if len(parts) > 2 {
		m.readOnly = slices.Contains(strings.Split(parts[2], ","), "ro")
	}
	m.named = !strings.ContainsAny(m.source, "/.~")
	return m
}

// hostPath maps a path inside a service's container to the file of the repository
// that a bind mount puts there ("" when no bind mount covers it).
func (s composeService) hostPath(p string) (string, mount) {
	best, bestM := "", mount{}
	for _, v := range s.Volumes {
		m := parseMount(v)
		if m.named {
			continue
		}
		if p == m.target || strings.HasPrefix(p, m.target+"/") {
			if len(m.target) > len(bestM.target) {
				best, bestM = filepath.Join(composeDir, m.source, strings.TrimPrefix(p, m.target)), m
			}
		}
	}
	return best, bestM
}

// mountInto copies the files and directories that the service's bind mounts put in
// its container to the same paths under a temporary directory, and returns the path
// of the container's file p there: a configuration read from it finds its includes
// as in the container.
func (s composeService) mountInto(t *testing.T, p string) string {
	t.Helper()
	root := t.TempDir()
	for _, v := range s.Volumes {
		m := parseMount(v)
		if m.named {
			continue
		}
		src, dst := filepath.Join(composeDir, m.source), filepath.Join(root, m.target)
		fi, err := os.Stat(src)
		if err != nil {
			t.Fatalf("bind mount %s: %v", m.source, err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.IsDir() {
			err = os.CopyFS(dst, os.DirFS(src))
		} else {
			var data []byte
			if data, err = os.ReadFile(src); err == nil {
				err = os.WriteFile(dst, data, 0o644)
			}
		}
		if err != nil {
			t.Fatalf("bind mount %s: %v", m.source, err)
		}
	}
	return filepath.Join(root, p)
}

func (s composeService) exposes(port int) bool {
	return slices.Contains(s.Expose, strconv.Itoa(port))
}

// sluiceServices returns the services that run the sluice binary of the sluice image
// (the image's entrypoint), with their parsed configuration.
func sluiceServices(t *testing.T, c composeFile, ic sluiceImageConfig) map[string]gatewayConfig {
	t.Helper()
	out := map[string]gatewayConfig{}
	for name, s := range c.Services {
		if repo, _ := splitImage(s.Image); repo != sluiceImage || len(s.Entrypoint) > 0 {
			continue
		}
		env := map[string]string{}
		for k, v := range ic.env {
			env[k] = v
		}
		for k, v := range s.Environment {
			env[k] = v
		}
		out[name] = parseSluiceArgs(t, "compose "+name, s.Command, env)
	}
	return out
}

// composeHosts are the names that resolve inside the compose network: services and
// their aliases.
func composeHosts(c composeFile) map[string]string {
	hosts := map[string]string{}
	for name, s := range c.Services {
		hosts[name] = name
		for _, n := range s.Networks {
			for _, a := range n.Aliases {
				hosts[a] = name
			}
		}
	}
	return hosts
}

// listenPort is the port a non-sluice service of compose listens on, from its
// command where it says so.
func (c composeFile) listenPort(t *testing.T, name string) int {
	t.Helper()
	s := c.Services[name]
	if s.Entrypoint != nil && strings.HasSuffix(s.Entrypoint[0], "/sluice-bench") {
		_, p, err := net.SplitHostPort(s.Command[len(s.Command)-1])
		if err != nil {
			t.Fatalf("compose %s: %v", name, err)
		}
		n, _ := strconv.Atoi(p)
		return n
	}
	if repo, _ := splitImage(s.Image); repo == "redis" {
		if i := slices.Index(s.Command, "--port"); i >= 0 {
			n, _ := strconv.Atoi(s.Command[i+1])
			return n
		}
		return 6379
	}
	t.Fatalf("compose %s: listen port unknown", name)
	return 0
}

func hostPort(t *testing.T, where, hp string, defPort int) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		if defPort == 0 {
			t.Fatalf("%s: %q: %v", where, hp, err)
		}
		return hp, defPort
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s: %q: %v", where, hp, err)
	}
	return host, n
}

func urlHostPort(t *testing.T, where, raw string) (string, int) {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		t.Fatalf("%s: %q is not a URL", where, raw)
	}
	def := map[string]int{"http": 80, "https": 443, "redis": 6379, "rediss": 6379, "nats": 4222}[u.Scheme]
	return hostPort(t, where, u.Host, def)
}

// TestCompose checks deploy/compose against the sluice binary and itself: three
// sluice serve replicas whose flags and SLUICE_* variables the binary accepts,
// behind nginx (upstream servers = the replicas' --listen), scraped by Prometheus on
// --admin-listen, sharing the Redis and the three NATS nodes their flags name; the
// rules they load pass the validator and send every queue to a host of the file;
// every bind mount exists; named volumes and networks are declared.
func TestCompose(t *testing.T) {
	c := loadCompose(t)
	ic := loadImageConfig(t)
	gws := sluiceServices(t, c, ic)
	if len(gws) != 3 {
		t.Fatalf("want 3 sluice replicas, got %d", len(gws))
	}
	hosts := composeHosts(c)

	// Everything a service names exists.
	for name, s := range c.Services {
		if s.Image == "" {
			t.Errorf("%s: no image", name)
		}
		for _, v := range s.Volumes {
			m := parseMount(v)
			if m.target == "" || !strings.HasPrefix(m.target, "/") {
				t.Errorf("%s: volume %q: want SOURCE:/TARGET", name, v)
				continue
			}
			if m.named {
				if _, ok := c.Volumes[m.source]; !ok {
					t.Errorf("%s: volume %s is not declared", name, m.source)
				}
			} else if _, err := os.Stat(filepath.Join(composeDir, m.source)); err != nil {
				t.Errorf("%s: bind mount %s: %v", name, m.source, err)
			}
		}
		for n := range s.Networks {
			if _, ok := c.Networks[n]; !ok {
				t.Errorf("%s: network %s is not declared", name, n)
			}
		}
		for _, d := range s.DependsOn {
			if _, ok := c.Services[d]; !ok {
				t.Errorf("%s: depends on unknown service %s", name, d)
			}
		}
		if repo, _ := splitImage(s.Image); repo == sluiceImage && s.Build == nil {
			t.Errorf("%s: the sluice image has no build section: `docker compose up --build` could not build it", name)
		}
	}

	natsNodes := checkComposeNATS(t, c)
	var listenPorts, adminPorts []string
	for name, g := range gws {
		s := c.Services[name]
		if g.cmd != "serve" {
			t.Errorf("%s: sluice %s, want serve", name, g.cmd)
		}
		listen, admin := g.port(t, "listen"), g.port(t, "admin-listen")
		listenPorts = append(listenPorts, net.JoinHostPort(name, strconv.Itoa(listen)))
		adminPorts = append(adminPorts, net.JoinHostPort(name, strconv.Itoa(admin)))
		if !s.exposes(listen) || !s.exposes(admin) {
			t.Errorf("%s: expose %v, but it listens on %d and %d", name, s.Expose, listen, admin)
		}
		if !s.ReadOnly {
			t.Errorf("%s: read_only: with --nats sluice writes nothing", name)
		}
		// Shutdown finishes before Docker's SIGKILL.
		grace := 10 * time.Second
		if s.StopGracePeriod != "" {
			var err error
			if grace, err = time.ParseDuration(s.StopGracePeriod); err != nil {
				t.Errorf("%s: stop_grace_period: %v", name, err)
			}
		}
		if st := g.duration(t, "shutdown-timeout"); grace <= st {
			t.Errorf("%s: stop_grace_period %s is not longer than --shutdown-timeout %s", name, grace, st)
		}

		// Redis and NATS are services of the file, on the ports they listen on.
		redisHost, redisPort := urlHostPort(t, name+" --redis", g.value("redis"))
		if svc, ok := hosts[redisHost]; !ok || c.listenPort(t, svc) != redisPort || !c.Services[svc].exposes(redisPort) {
			t.Errorf("%s: --redis %s: no service listens there", name, g.value("redis"))
		}
		// The replicas share NATS, so they need the one signing key, from the
		// environment of whoever runs compose (never written in the file; that it is
		// required, TestComposeVariables checks).
		if k := g.value("queue-key"); k != composeEnv["SLUICE_QUEUE_KEY"] {
			t.Errorf("%s: --queue-key is not $SLUICE_QUEUE_KEY: every replica needs the one key, from the environment", name)
		}
		// NATS admits only the user sluice of accounts.conf, with its password from
		// the environment.
		sluiceUser := checkNATSClient(t, "compose "+name, g, natsNodes.users)
		var natsURLs []string
		for _, u := range g.list("nats") {
			h, p := urlHostPort(t, name+" --nats", u)
			natsURLs = append(natsURLs, net.JoinHostPort(h, strconv.Itoa(p)))
		}
		slices.Sort(natsURLs)
		if !slices.Equal(natsURLs, natsNodes.clientAddrs) {
			t.Errorf("%s: --nats %v, want every node of the cluster %v", name, natsURLs, natsNodes.clientAddrs)
		}
		if r, _ := strconv.Atoi(g.value("replicas")); r < 1 || r > len(natsNodes.clientAddrs) {
			t.Errorf("%s: --replicas %s with %d NATS nodes", name, g.value("replicas"), len(natsNodes.clientAddrs))
		} else if r != 3 {
			t.Errorf("%s: --replicas %d, want R3 streams on the cluster", name, r)
		}
		for _, dep := range append([]string{redisHost}, natsNodes.services...) {
			if !slices.Contains(s.DependsOn, hosts[dep]) {
				t.Errorf("%s: does not depend on %s", name, dep)
			}
		}
		upHost, upPort := urlHostPort(t, name+" --upstream", g.value("upstream"))
		if svc, ok := hosts[upHost]; !ok || c.listenPort(t, svc) != upPort {
			t.Errorf("%s: --upstream %s: no service listens there", name, g.value("upstream"))
		}

		if set := checkComposeRules(t, name, s, g, c, hosts); set != nil && sluiceUser != nil {
			checkNATSDownstreams(t, "compose "+name, sluiceUser, set)
		}
		checkTrustedProxies(t, name, s, g, c)
	}
	slices.Sort(listenPorts)
	slices.Sort(adminPorts)
	checkNginx(t, c, listenPorts, gws)
	checkComposePrometheus(t, c, adminPorts)

	// The demo API: sluice-bench upstream from the same image.
	modes := benchModes(t)
	for name, s := range c.Services {
		if len(s.Entrypoint) == 0 || !strings.HasSuffix(s.Entrypoint[0], "/sluice-bench") {
			continue
		}
		if !slices.Contains(ic.binaries, s.Entrypoint[0]) {
			t.Errorf("%s: entrypoint %s is not in the image (%v)", name, s.Entrypoint[0], ic.binaries)
		}
		if len(s.Command) != 2 || !slices.Contains(modes, s.Command[0]) {
			t.Errorf("%s: sluice-bench %v: want MODE ADDR with a mode of %v", name, s.Command, modes)
		}
		if p := c.listenPort(t, name); !s.exposes(p) {
			t.Errorf("%s: listens on %d but exposes %v", name, p, s.Expose)
		}
	}
}

// checkComposeRules loads exactly the rules a replica loads (its --rules, through its
// bind mounts) with the real validator, and checks that every queue delivers to a
// host of the compose file on a port it listens on, that every example domain of
// deploy/rules is served, and that rules are mounted read-only. It returns the rules
// (nil when they have problems).
func checkComposeRules(t *testing.T, name string, s composeService, g gatewayConfig, c composeFile, hosts map[string]string) *rules.Set {
	t.Helper()
	var paths []string
	for _, p := range g.list("rules") {
		hp, m := s.hostPath(p)
		if hp == "" {
			t.Errorf("%s: --rules %s is not mounted", name, p)
			continue
		}
		if !m.readOnly {
			t.Errorf("%s: rules mount %s is not read-only", name, m.source)
		}
		paths = append(paths, hp)
	}
	if len(paths) == 0 {
		return nil
	}
	set, err := rules.Load(paths...)
	if err != nil {
		t.Errorf("%s: the rules it loads have problems:\n%v", name, err)
		return nil
	}
	examples, err := rules.Load(rulesDir)
	if err != nil {
		t.Fatalf("deploy/rules: %v", err)
	}
	for _, d := range examples.Domains() {
		if !slices.Contains(set.Domains(), d) {
			t.Errorf("%s: the example domain %s of deploy/rules is not loaded", name, d)
		}
	}
	checkRoutesReachable(t, name, set)
	for _, q := range set.Queues() {
		if q.NATSSubject() != "" {
			continue
		}
		h, p := urlHostPort(t, name+" queue "+q.Name, q.Downstream)
		svc, ok := hosts[h]
		if !ok {
			t.Errorf("%s: queue %s delivers to %s, which is no host of the compose file", name, q.Name, q.Downstream)
			continue
		}
		if c.listenPort(t, svc) != p {
			t.Errorf("%s: queue %s delivers to port %d; %s listens on %d", name, q.Name, p, svc, c.listenPort(t, svc))
		}
	}
	return set
}

// checkRoutesReachable: with every file loaded together, as the replica loads them,
// each route is the one that a request made from its own match gets, so that no
// route of one file is hidden behind the routes of another (the files' comments say
// what their routes do).
func checkRoutesReachable(t *testing.T, name string, set *rules.Set) {
	t.Helper()
	for _, rt := range set.Routes() {
		r := requestFor(rt.Match)
		if got, _ := set.Match(r, netip.MustParseAddr("203.0.113.7"), nil); got != rt {
			gotName := "no route"
			if got != nil {
				gotName = fmt.Sprintf("route %s (%s:%d)", got.Name, filepath.Base(got.File), got.Line)
			}
			t.Errorf("%s: route %s (%s:%d) never applies: %s %s (Host %s) gets %s", name, rt.Name,
				filepath.Base(rt.File), rt.Line, r.Method, r.URL.Path, r.Host, gotName)
		}
	}
}

// requestFor makes a request that m matches: its first method, its host (a
// subdomain for *.domain), its path (a parameter of a pattern is "p"), and its
// headers (present ones with a value).
func requestFor(m rules.RouteMatch) *http.Request {
	method := http.MethodGet
	if len(m.Methods) > 0 {
		method = m.Methods[0]
	}
	host := cmp.Or(m.Host, "example.com")
	if d, ok := strings.CutPrefix(host, "*."); ok {
		host = "a." + d
	}
	path := cmp.Or(m.Path, m.PathPrefix, m.PathPattern, "/")
	path = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(path, "p")
	r := httptest.NewRequest(method, "http://"+host+path, nil)
	for _, h := range m.Headers {
		switch {
		case h.Present == nil:
			r.Header.Set(h.Name, h.Value)
		case *h.Present:
			r.Header.Set(h.Name, "1")
		}
	}
	return r
}

// checkTrustedProxies: the load balancer's address is trusted, on a network shared
// with the replica, and nothing wider than that network is.
func checkTrustedProxies(t *testing.T, name string, s composeService, g gatewayConfig, c composeFile) {
	t.Helper()
	lb, ok := c.Services["lb"]
	if !ok {
		t.Fatal("compose: no lb service")
	}
	var cidrs []*net.IPNet
	for _, p := range g.list("trusted-proxies") {
		_, n, err := net.ParseCIDR(p)
		if err != nil {
			t.Errorf("%s: --trusted-proxies %s: %v", name, p, err)
			continue
		}
		cidrs = append(cidrs, n)
	}
	found := false
	for netName, ln := range lb.Networks {
		if ln.IPv4Address == "" {
			continue
		}
		if _, shared := s.Networks[netName]; !shared {
			continue
		}
		ip := net.ParseIP(ln.IPv4Address)
		var subnet *net.IPNet
		if cn := c.Networks[netName]; cn != nil {
			for _, cfg := range cn.IPAM.Config {
				if _, sn, err := net.ParseCIDR(cfg.Subnet); err == nil && sn.Contains(ip) {
					subnet = sn
				}
			}
		}
		if subnet == nil {
			t.Errorf("lb: %s is in no subnet of network %s", ln.IPv4Address, netName)
			continue
		}
		for _, n := range cidrs {
			if n.Contains(ip) {
				found = true
			}
			ones, _ := n.Mask.Size()
			sOnes, _ := subnet.Mask.Size()
			if !subnet.Contains(n.IP) || ones < sOnes {
				t.Errorf("%s: --trusted-proxies %s reaches beyond network %s (%s)", name, n, netName, subnet)
			}
		}
	}
	if !found {
		t.Errorf("%s: --trusted-proxies %v does not contain the load balancer's fixed address on a shared network", name, g.list("trusted-proxies"))
	}
}

type natsCluster struct {
	services    []string // compose services or pods
	clientAddrs []string // host:port, sorted
	users       map[string]*server.User
}

// loadNATSConfig parses a nats-server configuration file with the real parser of
// the nats-server version sluice embeds, with env set (the variables the file
// refers to), and has the server validate the options.
func loadNATSConfig(t *testing.T, path string, env map[string]string) *server.Options {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return opts
}

var natsImageMin = [2]int{2, 11} // priority groups and consumer pause

func checkNATSImage(t *testing.T, where, image string) {
	t.Helper()
	repo, tag := splitImage(image)
	if repo != "nats" || tag == "" {
		t.Errorf("%s: image %s: want nats:VERSION", where, image)
		return
	}
	v := majorMinor(t, strings.SplitN(tag, "-", 2)[0])
	if versionLess(v, natsImageMin) {
		t.Errorf("%s: %s: sluice needs nats-server 2.11 or later (priority groups, consumer pause)", where, image)
	}
	if embedded := majorMinor(t, goModVersion(t, "github.com/nats-io/nats-server/v2")); v != embedded {
		t.Errorf("%s: %s, but sluice embeds nats-server %d.%d (go.mod): keep them in step", where, image, embedded[0], embedded[1])
	}
}

// checkComposeNATS checks the NATS services: one configuration parsed by the real
// nats-server parser per node (with the files its container mounts, for its
// includes), unique server names, JetStream on a named volume, routes to exactly
// the nodes of the file, ports that match expose and the health check, and
// authentication of clients and routes with passwords from the environment
// (checkNATSAuth), the same users on every node.
func checkComposeNATS(t *testing.T, c composeFile) natsCluster {
	t.Helper()
	var cl natsCluster
	type node struct {
		svc  string
		opts *server.Options
	}
	var nodes []node
	for name, s := range c.Services {
		if repo, _ := splitImage(s.Image); repo != "nats" {
			continue
		}
		checkNATSImage(t, "compose "+name, s.Image)
		cfg := ""
		for i, a := range s.Command {
			if (a == "--config" || a == "-c") && i+1 < len(s.Command) {
				cfg = s.Command[i+1]
			}
		}
		hp, _ := s.hostPath(cfg)
		if hp == "" {
			t.Fatalf("compose %s: --config %q is not mounted", name, cfg)
		}
		opts := loadNATSConfig(t, s.mountInto(t, cfg), s.Environment)
		users := checkNATSAuth(t, "compose "+name, opts, slices.Collect(maps.Values(composeEnv)))
		if why := natsNotDurable(opts); why != "" {
			t.Errorf("%s: %s", "compose "+name, why)
		}
		if cl.users == nil {
			cl.users = users
		} else if !slices.Equal(slices.Sorted(maps.Keys(users)), slices.Sorted(maps.Keys(cl.users))) {
			t.Errorf("compose %s: users %v, other nodes %v", name, slices.Sorted(maps.Keys(users)), slices.Sorted(maps.Keys(cl.users)))
		}
		nodes = append(nodes, node{name, opts})
		cl.services = append(cl.services, name)
		cl.clientAddrs = append(cl.clientAddrs, net.JoinHostPort(name, strconv.Itoa(opts.Port)))
		for _, p := range []int{opts.Port, opts.Cluster.Port, opts.HTTPPort} {
			if !s.exposes(p) {
				t.Errorf("compose %s: listens on %d, exposes %v", name, p, s.Expose)
			}
		}
		if !opts.JetStream {
			t.Errorf("compose %s: JetStream is off", name)
		}
		onVolume := false
		for _, v := range s.Volumes {
			if m := parseMount(v); m.named && (opts.StoreDir == m.target || strings.HasPrefix(opts.StoreDir, m.target+"/")) {
				onVolume = true
			}
		}
		if !onVolume {
			t.Errorf("compose %s: store_dir %s is on no named volume: the streams would not survive the container", name, opts.StoreDir)
		}
		if s.Healthcheck == nil || !strings.Contains(strings.Join(s.Healthcheck.Test, " "), ":"+strconv.Itoa(opts.HTTPPort)+"/healthz") {
			t.Errorf("compose %s: want a health check on the monitoring port %d /healthz", name, opts.HTTPPort)
		}
	}
	slices.Sort(cl.services)
	slices.Sort(cl.clientAddrs)
	if len(nodes) != 3 {
		t.Fatalf("compose: want 3 NATS nodes, got %d", len(nodes))
	}
	names := map[string]bool{}
	for _, n := range nodes {
		if n.opts.ServerName == "" || names[n.opts.ServerName] {
			t.Errorf("compose %s: server_name %q is empty or not unique", n.svc, n.opts.ServerName)
		}
		names[n.opts.ServerName] = true
		if n.opts.Cluster.Name == "" || n.opts.Cluster.Name != nodes[0].opts.Cluster.Name {
			t.Errorf("compose %s: cluster name %q", n.svc, n.opts.Cluster.Name)
		}
		var routes []string
		for _, r := range n.opts.Routes {
			routes = append(routes, r.Host)
		}
		slices.Sort(routes)
		var want []string
		for _, m := range nodes {
			want = append(want, net.JoinHostPort(m.svc, strconv.Itoa(m.opts.Cluster.Port)))
		}
		slices.Sort(want)
		if !slices.Equal(routes, want) {
			t.Errorf("compose %s: routes %v, want %v", n.svc, routes, want)
		}
	}
	return cl
}

var (
	nginxUpstreamRE = regexp.MustCompile(`(?s)upstream\s+(\S+)\s*\{(.*?)\}`)
	nginxServerRE   = regexp.MustCompile(`(?m)^\s*server\s+([^\s;]+)`)
	nginxListenRE   = regexp.MustCompile(`(?m)^\s*listen\s+(?:[^\s;]*:)?(\d+)`)
	nginxPassRE     = regexp.MustCompile(`(?m)^\s*proxy_pass\s+http://([^\s;/]+)`)
	nginxBodyRE     = regexp.MustCompile(`(?m)^\s*client_max_body_size\s+(\d+)([kKmMgG]?)\s*;`)
	nginxHeaderRE   = regexp.MustCompile(`(?m)^\s*proxy_set_header\s+(\S+)\s+(.*);`)
)

// checkNginx: nginx balances over exactly the replicas' front doors, listens on the
// port lb publishes, lets bodies through up to sluice's --max-body, and is the edge
// for the client address (replaces X-Forwarded-For, drops Forwarded).
func checkNginx(t *testing.T, c composeFile, fronts []string, gws map[string]gatewayConfig) {
	t.Helper()
	lb := c.Services["lb"]
	conf := ""
	for _, v := range lb.Volumes {
		if m := parseMount(v); m.target == "/etc/nginx/nginx.conf" {
			conf = filepath.Join(composeDir, m.source)
		}
	}
	if conf == "" {
		t.Fatal("lb: no /etc/nginx/nginx.conf mounted")
	}
	data, err := os.ReadFile(conf)
	if err != nil {
		t.Fatal(err)
	}
	text := regexp.MustCompile(`(?m)#.*$`).ReplaceAllString(string(data), "")
	ups := nginxUpstreamRE.FindAllStringSubmatch(text, -1)
	pass := nginxPassRE.FindStringSubmatch(text)
	if len(ups) != 1 || pass == nil || pass[1] != ups[0][1] {
		t.Fatalf("%s: want one upstream block that proxy_pass uses", conf)
	}
	var servers []string
	for _, m := range nginxServerRE.FindAllStringSubmatch(ups[0][2], -1) {
		servers = append(servers, m[1])
	}
	slices.Sort(servers)
	if !slices.Equal(servers, fronts) {
		t.Errorf("%s: upstream servers %v, want the replicas' front doors %v", conf, servers, fronts)
	}
	listen := nginxListenRE.FindStringSubmatch(text)
	if listen == nil {
		t.Fatalf("%s: no listen", conf)
	}
	published := false
	for _, p := range lb.Ports {
		parts := strings.Split(p, ":")
		if parts[len(parts)-1] == listen[1] {
			published = true
		}
	}
	if !published {
		t.Errorf("lb: ports %v do not publish nginx's port %s", lb.Ports, listen[1])
	}
	body := nginxBodyRE.FindStringSubmatch(text)
	if body == nil {
		t.Errorf("%s: no client_max_body_size (nginx's 1m would answer 413 before sluice's --max-body)", conf)
	} else {
		n, _ := strconv.ParseInt(body[1], 10, 64)
		n <<= map[string]int{"": 0, "k": 10, "m": 20, "g": 30}[strings.ToLower(body[2])]
		for name, g := range gws {
			max := int64(0) // 0: no limit
			if v := g.value("max-body"); v != "0" {
				var err error
				if max, err = rules.ParseSize(v); err != nil {
					t.Errorf("%s: --max-body %q: %v", name, v, err)
				}
			}
			if n < max {
				t.Errorf("%s: client_max_body_size %d bytes is below %s's --max-body %d", conf, n, name, max)
			}
		}
	}
	headers := map[string]string{}
	for _, m := range nginxHeaderRE.FindAllStringSubmatch(text, -1) {
		headers[strings.ToLower(m[1])] = strings.TrimSpace(m[2])
	}
	if h := headers["x-forwarded-for"]; h != "$remote_addr" && h != "$proxy_add_x_forwarded_for" {
		t.Errorf("%s: X-Forwarded-For %q: want the client address nginx sees", conf, h)
	}
	if h, ok := headers["forwarded"]; !ok || (h != `""` && !strings.Contains(h, "$remote_addr")) {
		t.Errorf("%s: a client's own Forwarded header reaches sluice, which reads it if --forwarded-header is ever set to forwarded: clear it", conf)
	}
}

// composePrometheus is the scrape configuration of compose.
type promConfig struct {
	RuleFiles     []string `yaml:"rule_files"`
	ScrapeConfigs []struct {
		JobName       string `yaml:"job_name"`
		MetricsPath   string `yaml:"metrics_path"`
		StaticConfigs []struct {
			Targets []string `yaml:"targets"`
		} `yaml:"static_configs"`
	} `yaml:"scrape_configs"`
}

func loadComposePrometheus(t *testing.T, c composeFile) (promConfig, composeService) {
	t.Helper()
	p, ok := c.Services["prometheus"]
	if !ok {
		t.Fatal("compose: no prometheus service")
	}
	cfg := "/etc/prometheus/prometheus.yml"
	for _, a := range p.Command {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			cfg = v
		}
	}
	hp, _ := p.hostPath(cfg)
	if hp == "" {
		t.Fatalf("prometheus: %s is not mounted", cfg)
	}
	var pc promConfig
	decodeYAMLInto(t, hp, &pc)
	return pc, p
}

// checkComposePrometheus: Prometheus scrapes /metrics on the admin port of every
// replica, and the alert rules it evaluates are mounted.
func checkComposePrometheus(t *testing.T, c composeFile, admins []string) {
	t.Helper()
	pc, p := loadComposePrometheus(t, c)
	var targets []string
	for _, sc := range pc.ScrapeConfigs {
		if sc.MetricsPath != "" && sc.MetricsPath != "/metrics" {
			t.Errorf("prometheus job %s: metrics_path %s", sc.JobName, sc.MetricsPath)
		}
		for _, st := range sc.StaticConfigs {
			targets = append(targets, st.Targets...)
		}
	}
	slices.Sort(targets)
	if !slices.Equal(targets, admins) {
		t.Errorf("prometheus scrapes %v, want the replicas' admin ports %v", targets, admins)
	}
	alertsMounted := false
	for _, rf := range pc.RuleFiles {
		hp, _ := p.hostPath(rf)
		if hp == "" {
			t.Errorf("prometheus: rule file %s is not mounted", rf)
			continue
		}
		if filepath.Clean(hp) == filepath.Clean("prometheus/alerts.yaml") {
			alertsMounted = true
		}
	}
	if !alertsMounted {
		t.Errorf("prometheus does not evaluate deploy/prometheus/alerts.yaml")
	}
}

// scrapeJobs are the job labels sluice's series get: the compose scrape jobs, and
// the Services that the Kubernetes ServiceMonitors select (the operator names the
// job after the Service).
func scrapeJobs(t *testing.T) []string {
	t.Helper()
	pc, _ := loadComposePrometheus(t, loadCompose(t))
	var jobs []string
	for _, sc := range pc.ScrapeConfigs {
		jobs = append(jobs, sc.JobName)
	}
	objs := loadKubernetes(t, k8sDir)
	for _, sm := range objs.ofKind("ServiceMonitor") {
		for _, svc := range objs.ofKind("Service") {
			if sm.Spec.Selector.matches(svc.Metadata.Labels) {
				jobs = append(jobs, svc.Metadata.Name)
			}
		}
	}
	return jobs
}

// TestComposeRulesCopies keeps the compose copies of example rules identical to the
// examples but for their comments, their queues' downstreams and the hosts their
// routes match (compose serves the quick start on a host of its own: see
// compose/rules/quickstart.yaml).
func TestComposeRulesCopies(t *testing.T) {
	copies, err := filepath.Glob(filepath.Join(composeDir, "rules", "*.y*ml"))
	if err != nil || len(copies) == 0 {
		t.Fatalf("no compose rules: %v", err)
	}
	// strip reads a rules file without what a copy may change.
	strip := func(path string) map[string]any {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		if qs, ok := doc["queues"].(map[string]any); ok {
			for _, q := range qs {
				if q, ok := q.(map[string]any); ok {
					delete(q, "downstream")
				}
			}
		}
		if rts, ok := doc["routes"].([]any); ok {
			for _, rt := range rts {
				rt, _ := rt.(map[string]any)
				if m, ok := rt["match"].(map[string]any); ok {
					delete(m, "host")
					if len(m) == 0 {
						delete(rt, "match")
					}
				}
			}
		}
		return doc
	}
	for _, cp := range copies {
		orig := filepath.Join(rulesDir, filepath.Base(cp))
		if _, err := os.Stat(orig); err != nil {
			t.Errorf("%s: no %s to be a copy of", cp, orig)
			continue
		}
		if a, b := strip(cp), strip(orig); !reflect.DeepEqual(a, b) {
			t.Errorf("%s differs from %s in more than its downstreams, route hosts and comments", cp, orig)
		}
		if _, err := rules.Load(cp); err != nil {
			t.Errorf("%s:\n%v", cp, err)
		}
	}
}

// TestComposeVariables: every variable that compose.yaml uses is required
// (${NAME:?…}): no default, so no secret has a value written in the file, and
// `docker compose up` without one stops, naming it. The test gives each a value.
func TestComposeVariables(t *testing.T) {
	_, names, err := readCompose(composeEnv)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"SLUICE_QUEUE_KEY", "NATS_SLUICE_PASSWORD", "NATS_EVENTS_PASSWORD", "NATS_WORKER_PASSWORD", "NATS_ROUTE_PASSWORD"} {
		if !slices.Contains(names, want) {
			t.Errorf("compose.yaml does not use $%s", want)
		}
	}
	for _, name := range names {
		if _, ok := composeEnv[name]; !ok {
			t.Errorf("compose.yaml uses $%s: give it a value in composeEnv", name)
			continue
		}
		env := maps.Clone(composeEnv)
		delete(env, name)
		if _, _, err := readCompose(env); err == nil || !strings.Contains(err.Error(), "required variable "+name) {
			t.Errorf("without $%s compose starts (%v): write ${%s:?how to make one}", name, err, name)
		}
		env[name] = ""
		if _, _, err := readCompose(env); err == nil {
			t.Errorf("with $%s empty compose starts: write ${%s:?…}, with the colon", name, name)
		}
	}
}

// TestComposeInterpolate pins the interpolation that the compose tests read the
// file with to compose's.
func TestComposeInterpolate(t *testing.T) {
	env := map[string]string{"A": "a", "EMPTY": ""}
	lookup := func(n string) (string, bool) { v, ok := env[n]; return v, ok }
	for _, c := range []struct{ in, want, err string }{
		{in: "x$A-${A}y", want: "xa-ay"},
		{in: "$$A $$ $(cmd) 5$", want: "$A $ $(cmd) 5$"},
		{in: "${B:-d} ${EMPTY:-d} ${EMPTY-d} ${B-d$A}", want: "d d  da"},
		{in: "${A:+alt} ${EMPTY:+alt} ${EMPTY+alt} ${B+alt}", want: "alt  alt "},
		{in: "${A:?need A} ${EMPTY?fine}", want: "a "},
		{in: "${B:?export B=$(openssl rand -hex 32)}", err: "required variable B is missing a value: export B=$(openssl rand -hex 32)"},
		{in: "${EMPTY:?need it}", err: "required variable EMPTY"},
		{in: "${A", err: "unclosed"},
		{in: "${}", err: "invalid"},
		{in: "${A#x}", err: "invalid"},
	} {
		got, err := interpolate(c.in, lookup)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("%q: error %v, want %q", c.in, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("%q: %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}
