package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Load reads, validates and compiles the rules files at paths. A directory loads every
// *.yaml and *.yml file directly in it (not in subdirectories; names starting with a dot
// are skipped, which also skips Kubernetes' ..data entries), in name order; a file is
// loaded whatever its name. Each file is one domain. Every problem of every file is
// reported at once, as Problems (errors.Is(err, ErrInvalid)); a set with any problem is
// never returned.
func Load(paths ...string) (*Set, error) {
	return LoadWith(paths)
}

// LoadWith is Load with options (MergeDomains).
func LoadWith(paths []string, opts ...Option) (*Set, error) {
	if len(paths) == 0 {
		return nil, ErrNoPaths
	}
	var probs problemList
	files := readPaths(paths, &probs)
	// Unreadable files do not stop the others from being checked: every problem at once.
	s := compile(files, &probs, newLoadConfig(opts))
	if err := probs.result(); err != nil {
		return nil, err
	}
	return s, nil
}

// ReadFiles reads the files that paths name, as Load does (a directory gives its *.yaml
// and *.yml files), without parsing them: what a watcher compares with the active
// set's Version (see FilesVersion) before it parses anything. It returns every file it
// could read, and Problems for those it could not.
func ReadFiles(paths ...string) ([]File, error) {
	if len(paths) == 0 {
		return nil, ErrNoPaths
	}
	var probs problemList
	files := readPaths(paths, &probs)
	return files, probs.result()
}

// FilesVersion is the Version of a set parsed from files: a hash of their names and
// contents, in order (compile computes the same hash as it reads the files).
func FilesVersion(files []File) string {
	h := sha256.New()
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// readPaths reads the files that paths name, reporting unreadable ones.
func readPaths(paths []string, probs *problemList) []File {
	var files []File
	seen := map[string]bool{}
	read := func(name string) {
		if seen[name] {
			return
		}
		seen[name] = true
		data, err := readFile(name)
		if err != nil {
			probs.add(name, 0, 0, "%v", err)
			return
		}
		files = append(files, File{Name: name, Data: data})
	}
	for _, p := range paths {
		p = filepath.Clean(p) // dir/x.yaml and dir//x.yaml are one file
		st, err := os.Stat(p)
		if err != nil {
			probs.add(p, 0, 0, "cannot read: %v", unwrapPathError(err))
			continue
		}
		if !st.IsDir() {
			read(p)
			continue
		}
		names, err := rulesFilesIn(p)
		if err != nil {
			probs.add(p, 0, 0, "cannot read directory: %v", unwrapPathError(err))
			continue
		}
		if len(names) == 0 {
			probs.add(p, 0, 0, "no *.yaml or *.yml files in this directory")
		}
		for _, n := range names {
			read(n)
		}
	}
	return files
}

func rulesFilesIn(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		full := filepath.Join(dir, n)
		// Stat follows symlinks: ConfigMap files are links into ..data.
		if st, err := os.Stat(full); err == nil && st.Mode().IsRegular() {
			names = append(names, full)
		}
	}
	slices.Sort(names)
	return names, nil
}

func readFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, unwrapPathError(err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, unwrapPathError(err)
	}
	if len(data) > MaxFileSize {
		return nil, fmt.Errorf("file is larger than %d MiB", MaxFileSize>>20)
	}
	return data, nil
}

// unwrapPathError drops the path that the problem's location already shows.
func unwrapPathError(err error) error {
	if pe := (*os.PathError)(nil); errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// Version identifies the set's content: a hex SHA-256 over its files' names and bytes.
func (s *Set) Version() string { return s.version }

// Files lists the files the set was loaded from, in load order.
func (s *Set) Files() []string { return slices.Clone(s.files) }

// Domains lists the domains, sorted.
func (s *Set) Domains() []string { return slices.Clone(s.domainNames) }

// Routes lists the routes in precedence order for ties (file order). The routes are
// shared: do not modify them.
func (s *Set) Routes() []*Route { return slices.Clone(s.routes) }

// Route returns the route named name, or nil.
func (s *Set) Route(name string) *Route {
	for _, rt := range s.routes {
		if rt.Name == name {
			return rt
		}
	}
	return nil
}

// Rules lists every rule in file order. The rules are shared: do not modify them.
func (s *Set) Rules() []*Rule { return slices.Clone(s.rules) }

// Queue returns the queue named name, or nil.
func (s *Set) Queue(name string) *Queue { return s.queues[name] }

// Queues lists the queues sorted by name.
func (s *Set) Queues() []*Queue {
	out := make([]*Queue, 0, len(s.queueNames))
	for _, n := range s.queueNames {
		out = append(out, s.queues[n])
	}
	return out
}

// Summary counts the set's domains, descriptors, rules, routes and queues.
func (s *Set) Summary() Summary {
	sum := Summary{Domains: len(s.domains), Rules: len(s.rules), Routes: len(s.routes), Queues: len(s.queues)}
	for _, d := range s.domains {
		sum.Descriptors += d.nodes
	}
	return sum
}

// Explanation tells how a request was matched, for `sluice rules check --explain` and
// admin pages. Unlike Check keys and rule names it shows request values as they are:
// it is for operators debugging their own requests.
type Explanation struct {
	// Route is the matched route; nil when none matches.
	Route *Route
	// Descriptors has one result per descriptor list of the route.
	Descriptors []DescriptorResult
	// Checks are what Match returns.
	Checks []Check
	// Repeated is what Set.Repeated reports: when not nil, the front door refuses
	// the request (400) and decides none of the checks.
	Repeated error
}

// DescriptorResult is what became of one descriptor list of the route.
type DescriptorResult struct {
	// Entries are the list's key/value pairs as built from the request.
	Entries []Entry
	// Missing names the source that had no value (`header:X-User-ID`); the list was
	// skipped.
	Missing string
	// Rule is the rule the list reached; nil when it reached none.
	Rule *Rule
	// Check is the list's check when it is among the checks.
	Check *Check
	// ReplacedBy is the name of the rule that replaced this one.
	ReplacedBy string
	// Duplicate is set when an earlier list reached the same rule with the same values.
	Duplicate bool
}

// Explain matches r as Match does and tells how each descriptor list fared.
func (s *Set) Explain(r *http.Request, clientIP netip.Addr) Explanation {
	var ex Explanation
	ex.Route, ex.Checks = s.Match(r, clientIP, nil)
	ex.Repeated = s.Repeated(r, ex.Route)
	rt := ex.Route
	if rt == nil {
		return ex
	}
	p, host := cleanPath(r.URL.Path), requestHost(r)
	var t ipText
	t.set(clientIP)
	all := make([]Check, 0, len(rt.descs))
	for i := range rt.descs {
		cd := &rt.descs[i]
		var res DescriptorResult
		vals := make([]val, len(cd.entries))
		for j := range cd.entries {
			e := &cd.entries[j]
			if !e.get(r, &t, p, host, &vals[j]) {
				res.Missing = rt.Descriptors[cd.index][j].source()
				break
			}
			v := vals[j].s
			if vals[j].ip {
				v = string(t.b[:t.n])
			}
			res.Entries = append(res.Entries, Entry{Key: e.key, Value: v})
		}
		if res.Missing == "" {
			var hb hashBuf
			if rule, hashed := rt.dom.walk(vals, &t, &hb); rule != nil {
				res.Rule = rule
				all = append(all, makeCheck(rule, cd.index, hashed, &hb))
			}
		}
		ex.Descriptors = append(ex.Descriptors, res)
	}
	for i := range ex.Checks {
		c := &ex.Checks[i]
		ex.Descriptors[c.Descriptor].Check = c
	}
	for i := range ex.Descriptors {
		res := &ex.Descriptors[i]
		if res.Rule == nil || res.Check != nil {
			continue
		}
		for _, c := range all {
			if res.Rule.envoyName != "" && slices.Contains(c.Rule.Replaces, res.Rule.envoyName) {
				res.ReplacedBy = c.Rule.Name
				break
			}
		}
		res.Duplicate = res.ReplacedBy == ""
	}
	return ex
}
