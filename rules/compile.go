package rules

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"

	"go.yaml.in/yaml/v3"
)

// File is the content of one rules file, for Parse.
type File struct {
	// Name is how problems refer to the file (its path, usually).
	Name string
	Data []byte
}

// Parse validates and compiles rules files given by content. Each file is one domain. It
// returns every problem at once as Problems (which match ErrInvalid), and no Set then.
func Parse(files ...File) (*Set, error) {
	return ParseWith(files)
}

// Option changes how files are loaded (Parse, Load and their With forms).
type Option func(*loadConfig)

type loadConfig struct {
	merge bool
}

// MergeDomains lets several files share a domain, as Envoy's service does with
// MERGE_DOMAIN_CONFIG: their descriptors join one tree (a descriptor repeated across
// the files is a problem, as within one file), their routes and `replaces` see each
// other. Without it a domain written in two files is a problem.
func MergeDomains() Option { return func(c *loadConfig) { c.merge = true } }

func newLoadConfig(opts []Option) loadConfig {
	var c loadConfig
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// ParseWith is Parse with options.
func ParseWith(files []File, opts ...Option) (*Set, error) {
	if len(files) == 0 {
		return nil, ErrNoPaths
	}
	var probs problemList
	s := compile(files, &probs, newLoadConfig(opts))
	if err := probs.result(); err != nil {
		return nil, err
	}
	return s, nil
}

type compiler struct {
	// reach bounds the work of the reachability check over all routes: on a huge set it
	// stops checking rather than take quadratic time.
	reach   int
	probs   *problemList
	set     *Set
	queues  map[string]*Queue
	qNodes  map[string]*yaml.Node
	routeNm map[string]*Route
}

func (c *compiler) errf(file string, n *yaml.Node, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	c.probs.add(file, line, col, format, args...)
}

func compile(files []File, probs *problemList, cfg loadConfig) *Set {
	c := &compiler{
		reach:   4_000_000,
		probs:   probs,
		set:     &Set{domains: map[string]*domain{}, queues: map[string]*Queue{}},
		queues:  map[string]*Queue{},
		qNodes:  map[string]*yaml.Node{},
		routeNm: map[string]*Route{},
	}
	s := c.set
	defs := c.parseFiles(files)
	// Queues first: descriptors refer to them from any file.
	for _, fd := range defs {
		for _, qd := range fd.queues {
			c.queue(fd, qd)
		}
	}
	// Domains next, each with the files that define it (several only when merging).
	order, members, of := c.groupDomains(defs, cfg.merge)
	for _, d := range order {
		fds := members[d]
		markDynamicKeys(d, fds)
		for _, fd := range fds {
			c.descriptors(fd, d, d.root, fd.descriptors, nil)
		}
		for _, fd := range fds {
			c.replaces(fd, d)
		}
	}
	// Routes last, in file order (their order breaks ties), once every tree is whole.
	c.routes(defs, of)
	slices.Sort(s.domainNames)
	for name := range c.queues {
		s.queueNames = append(s.queueNames, name)
	}
	slices.Sort(s.queueNames)
	s.queues = c.queues
	s.table = buildTable(s.routes)
	s.choosing = choosingHeaders(s.routes)
	s.hosts = slices.ContainsFunc(s.routes, (*Route).readsHost)
	s.clientAddrs = slices.ContainsFunc(s.routes, func(rt *Route) bool { return rt.clientIP })
	return s
}

// parseFiles parses every file, records its name and the set's version (a hash of
// every file's name and content), and returns the definitions of the files that
// parse.
func (c *compiler) parseFiles(files []File) []*fileDef {
	s := c.set
	h := sha256.New()
	var defs []*fileDef
	for _, f := range files {
		fmt.Fprintf(h, "%d:%s%d:", len(f.Name), f.Name, len(f.Data))
		h.Write(f.Data)
		s.files = append(s.files, f.Name)
		if fd := parseFile(f.Name, f.Data, c.probs); fd != nil {
			defs = append(defs, fd)
		}
	}
	s.version = hex.EncodeToString(h.Sum(nil))
	return defs
}

// groupDomains makes the domains of the files, in the order of their first file,
// with the files that define each (several only when merging) and the domain of each
// file; a second file of a domain without merge is an error.
func (c *compiler) groupDomains(defs []*fileDef, merge bool) (order []*domain, members map[*domain][]*fileDef, of map[*fileDef]*domain) {
	s := c.set
	members = map[*domain][]*fileDef{}
	of = map[*fileDef]*domain{}
	for _, fd := range defs {
		if fd.domain == "" {
			continue
		}
		d := s.domains[fd.domain]
		switch {
		case d != nil && !merge:
			c.errf(fd.path, fd.domainNode, "domain %q is already defined in %s (to merge files of one domain, as Envoy's MERGE_DOMAIN_CONFIG, use --merge-domains)", fd.domain, d.file)
			continue
		case d == nil:
			d = &domain{name: fd.domain, file: fd.path, root: &node{}, byName: map[string][]*Rule{}, dynamicKeys: map[string]bool{}}
			s.domains[d.name] = d
			s.domainNames = append(s.domainNames, d.name)
			order = append(order, d)
		}
		members[d] = append(members[d], fd)
		of[fd] = d
	}
	return order, members, of
}

// markDynamicKeys marks the keys of d that a route of any of its files fds fills from
// requests (headers, query, client IP, path segments): rule names hide their values.
// The method and the host are no secrets and stay visible.
func markDynamicKeys(d *domain, fds []*fileDef) {
	for _, fd := range fds {
		for _, rd := range fd.routes {
			for _, list := range rd.descs {
				for _, e := range list {
					if e.from != "" && !slices.Contains([]string{"method", "host"}, e.from) {
						d.dynamicKeys[e.key] = true
					}
				}
			}
		}
	}
}

// routes compiles the routes of every file of a domain (of) in file order, which
// breaks their ties, into the set.
func (c *compiler) routes(defs []*fileDef, of map[*fileDef]*domain) {
	s := c.set
	for _, fd := range defs {
		d := of[fd]
		if d == nil {
			continue
		}
		for _, rd := range fd.routes {
			if rt := c.route(fd, d, rd); rt != nil {
				rt.order = len(s.routes)
				s.routes = append(s.routes, rt)
			}
		}
	}
}
