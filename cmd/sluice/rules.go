package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"

	"github.com/sluicehq/sluice/rules"
)

const rulesUsage = `Usage:
  sluice rules check [flags] FILE_OR_DIR...

Validates rules files (a directory: every *.yaml and *.yml in it). Prints every problem
as FILE:LINE:COL: message and exits 1 when there is any; otherwise prints a one-line
summary and exits 0. Usage errors exit 2.

Flags (anywhere among the paths):
  --explain METHOD PATH   show which route a request matches and which descriptors,
                          limits and keys apply (PATH may carry a ?query)
  -H, --header 'Name: value'
                          a request header for --explain (repeatable; Host sets the host)
  --ip ADDR               the client address for --explain
  --merge-domains         let files share a domain (as sluice serve --merge-domains)
  -h, --help              show this help
`

// mergeDomainsUsage is the help of --merge-domains, on every command that loads rules.
const mergeDomainsUsage = "let several rules files share a domain: their descriptors join one tree, as Envoy's MERGE_DOMAIN_CONFIG (a descriptor repeated across them is an error)"

// runRules runs `sluice rules ...`; args are the arguments after "rules".
func runRules(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, rulesUsage)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, rulesUsage)
		return exitOK
	case "check":
		return runRulesCheck(ctx, args[1:], stdout, stderr)
	}
	fmt.Fprintf(stderr, "sluice rules: unknown command %q\n\n%s", args[0], rulesUsage)
	return exitUsage
}

type explainRequest struct {
	method, target string
	headers        []string
	ip             string
}

func runRulesCheck(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	var (
		paths   []string
		ex      *explainRequest
		headers []string
		ip      string
		opts    []rules.Option
	)
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice rules check: "+format+"\nRun 'sluice rules check -h' for usage.\n", a...)
		return exitUsage
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		// Accept --flag=value as well as --flag value.
		name, inline, hasInline := strings.Cut(a, "=")
		if !strings.HasPrefix(a, "-") || a == "-" {
			paths = append(paths, a)
			continue
		}
		if a == "--" {
			paths = append(paths, args[i+1:]...)
			break
		}
		value := func() (string, bool) {
			if hasInline {
				return inline, true
			}
			if i+1 < len(args) {
				i++
				return args[i], true
			}
			return "", false
		}
		switch strings.TrimLeft(name, "-") {
		case "h", "help":
			fmt.Fprint(stdout, rulesUsage)
			return exitOK
		case "explain":
			if hasInline || i+2 >= len(args) {
				return usageErr("--explain needs METHOD and PATH")
			}
			ex = &explainRequest{method: args[i+1], target: args[i+2]}
			i += 2
		case "H", "header":
			v, ok := value()
			if !ok {
				return usageErr("%s needs 'Name: value'", name)
			}
			headers = append(headers, v)
		case "ip":
			v, ok := value()
			if !ok {
				return usageErr("--ip needs an address")
			}
			ip = v
		case "merge-domains":
			if hasInline && inline != "true" {
				if inline != "false" {
					return usageErr("--merge-domains takes true or false")
				}
				continue
			}
			opts = append(opts, rules.MergeDomains())
		default:
			return usageErr("unknown flag %s", a)
		}
	}
	if len(paths) == 0 {
		return usageErr("no rules files or directories given")
	}
	if ex == nil && (len(headers) > 0 || ip != "") {
		return usageErr("-H and --ip are used only with --explain")
	}
	var req *http.Request
	var addr netip.Addr
	if ex != nil {
		ex.headers, ex.ip = headers, ip
		var err error
		if req, addr, err = ex.build(ctx); err != nil {
			return usageErr("%v", err)
		}
	}

	set, err := rules.LoadWith(paths, opts...)
	var probs rules.Problems
	switch {
	case errors.As(err, &probs):
		for _, p := range probs {
			fmt.Fprintln(stdout, p)
		}
		fmt.Fprintf(stderr, "%d problem%s\n", len(probs), map[bool]string{true: "", false: "s"}[len(probs) == 1])
		return exitFailure
	case err != nil:
		fmt.Fprintf(stderr, "sluice rules check: %v\n", err)
		return exitFailure
	}
	if req == nil {
		fmt.Fprintf(stdout, "ok: %s\n", set.Summary())
		return exitOK
	}
	printExplanation(stdout, set, req, addr)
	return exitOK
}

func (e *explainRequest) build(ctx context.Context) (*http.Request, netip.Addr, error) {
	return rules.NewExplainRequest(ctx, e.method, e.target, e.headers, e.ip)
}

func printExplanation(w io.Writer, set *rules.Set, r *http.Request, addr netip.Addr) {
	host, ip := r.Host, "none (use --ip)"
	if host == "" {
		host = "none"
	}
	if addr.IsValid() {
		ip = addr.String()
	}
	fmt.Fprintf(w, "request: %s %s (host %s, client ip %s)\n", r.Method, r.URL.RequestURI(), host, ip)
	ex := set.Explain(r, addr)
	rt := ex.Route
	if rt == nil {
		fmt.Fprintln(w, "route: none matches; the request is not limited")
		return
	}
	fmt.Fprintf(w, "route: %s (%s:%d), domain %s\n", rt.Name, rt.File, rt.Line, rt.Domain)
	if m := describeMatch(rt.Match); m != "" {
		fmt.Fprintf(w, "  match: %s\n", m)
	}
	for i, d := range ex.Descriptors {
		fmt.Fprintf(w, "descriptor %d: %s\n", i+1, formatRouteEntries(rt.Descriptors[i]))
		if d.Missing != "" {
			fmt.Fprintf(w, "  skipped: the request has no %s\n", d.Missing)
			continue
		}
		fmt.Fprintf(w, "  values: %s\n", formatEntries(d.Entries))
		if d.Rule == nil {
			fmt.Fprintf(w, "  no descriptor of domain %s matches: not limited by this list\n", rt.Domain)
			continue
		}
		rule := d.Rule
		fmt.Fprintf(w, "  rule: %s (descriptor %s, %s:%d)\n", rule.Name, rule.Descriptor, rule.File, rule.Line)
		switch {
		case d.ReplacedBy != "":
			fmt.Fprintf(w, "  dropped: replaced by %s\n", d.ReplacedBy)
			continue
		case d.Duplicate:
			fmt.Fprintln(w, "  dropped: an earlier list counts the same rule and values")
			continue
		}
		switch {
		case rule.Unlimited:
			fmt.Fprintln(w, "  unlimited: always allowed")
		case rule.Deny:
			fmt.Fprintln(w, "  requests_per_unit 0: never allowed")
		default:
			for j, l := range rule.Limits {
				fmt.Fprintf(w, "  limit: %s  key %s\n", rules.DescribeLimit(l), d.Check.Key(j))
			}
		}
		if !rule.Unlimited {
			over := "reject with 429"
			if rule.OnLimit == rules.Defer {
				q := rule.Queue
				over = fmt.Sprintf("defer to queue %s (outflow %s, to %s)", q.Name, q.Outflow, q.Downstream)
			}
			fmt.Fprintf(w, "  over the limit: %s\n", over)
		}
		if rule.Shadow {
			fmt.Fprintln(w, "  shadow mode: counted and logged, never enforced")
		}
	}
}

func describeMatch(m rules.RouteMatch) string {
	var parts []string
	if len(m.Methods) > 0 {
		parts = append(parts, "method "+strings.Join(m.Methods, "|"))
	}
	if m.Host != "" {
		parts = append(parts, "host "+m.Host)
	}
	switch {
	case m.Path != "":
		parts = append(parts, "path "+m.Path)
	case m.PathPrefix != "":
		parts = append(parts, "path_prefix "+m.PathPrefix)
	case m.PathPattern != "":
		parts = append(parts, "path_pattern "+m.PathPattern)
	}
	for _, h := range m.Headers {
		switch {
		case h.Present == nil:
			parts = append(parts, fmt.Sprintf("header %s = %q", h.Name, h.Value))
		case *h.Present:
			parts = append(parts, "header "+h.Name+" present")
		default:
			parts = append(parts, "header "+h.Name+" absent")
		}
	}
	return strings.Join(parts, ", ")
}

func formatRouteEntries(es []rules.RouteEntry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.String()
	}
	return "[" + strings.Join(parts, ", ") + "]"
}

func formatEntries(es []rules.Entry) string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Key + "=" + e.Value
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
