package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strings"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/rules"
)

const rulesHelp = `Usage:
  sluice rules check [flags] FILE_OR_DIR...

Checks rules files, and explains how a request matches them (sluice rules check
--explain METHOD PATH).
`

const rulesCheckHelp = `Usage:
  sluice rules check [flags] FILE_OR_DIR...

Validates rules files (a directory: every *.yaml and *.yml in it). Prints every problem
as FILE:LINE:COL: message and exits 1 when there is any; otherwise prints a one-line
summary and exits 0. Usage errors exit 2. Flags may come anywhere among the paths.

--explain METHOD PATH shows which route a request matches and which descriptors,
limits and keys apply (PATH may carry a ?query); its two words may also be given as
one, --explain 'POST /v1/orders'. -H adds request headers to it (Host sets the host),
--ip the client address.
`

// mergeDomainsUsage is the help of --merge-domains, on every command that loads rules.
const mergeDomainsUsage = "let several rules files share a domain: their descriptors join one tree, as Envoy's MERGE_DOMAIN_CONFIG (a descriptor repeated across them is an error)"

// rulesCommand is sluice rules and its subcommand check.
func rulesCommand(stdout, stderr io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "rules",
		Short: "check rules files and explain how a request matches them",
		Long:  rulesHelp,
		Args: func(c *cobra.Command, args []string) error {
			if len(args) > 0 {
				return unknownCommand(c, args[0])
			}
			return nil
		},
		RunE: func(c *cobra.Command, _ []string) error {
			// sluice rules alone: the usage, as an error (a script missed the subcommand).
			c.SetOut(stderr)
			c.HelpFunc()(c, nil)
			return exitStatus(exitUsage)
		},
	}
	c.AddCommand(rulesCheckCommand(stdout, stderr))
	return c
}

// rulesCheckFlags are the flags of sluice rules check.
type rulesCheckFlags struct {
	explain      string
	headers      []string
	ip           string
	mergeDomains bool
}

func rulesCheckCommand(stdout, stderr io.Writer) *cobra.Command {
	var f rulesCheckFlags
	c := withEnv(&cobra.Command{
		Use:   "check",
		Short: "check rules files, or explain how a request matches them",
		Long:  rulesCheckHelp,
		Args:  cobra.ArbitraryArgs,
		RunE: func(c *cobra.Command, paths []string) error {
			if _, ok := loadFlags(c.Flags(), stderr); !ok {
				return exitStatus(exitUsage)
			}
			return status(runRulesCheck(c.Context(), &f, paths, stdout, stderr))
		},
	})
	fs := c.Flags()
	fs.StringVar(&f.explain, "explain", "", "show how the request `METHOD PATH` matches the rules (two words, or one quoted)")
	fs.StringArrayVarP(&f.headers, "header", "H", nil, "a request header `'Name: value'` for --explain (repeatable; Host sets the host)")
	fs.StringVar(&f.ip, "ip", "", "the client `address` for --explain")
	fs.BoolVar(&f.mergeDomains, "merge-domains", false, "let files share a domain (as sluice serve --merge-domains)")
	return c
}

type explainRequest struct {
	method, target string
	headers        []string
	ip             string
}

func runRulesCheck(ctx context.Context, f *rulesCheckFlags, paths []string, stdout, stderr io.Writer) int {
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "sluice rules check: "+format+"\nRun 'sluice rules check -h' for usage.\n", a...)
		return exitUsage
	}
	var opts []rules.Option
	if f.mergeDomains {
		opts = append(opts, rules.MergeDomains())
	}
	if len(paths) == 0 {
		return usageErr("no rules files or directories given")
	}
	explain := strings.TrimSpace(f.explain)
	if explain == "" && (len(f.headers) > 0 || f.ip != "") {
		return usageErr("-H and --ip are used only with --explain")
	}
	var req *http.Request
	var addr netip.Addr
	if explain != "" {
		method, target, ok := strings.Cut(explain, " ")
		if !ok {
			return usageErr("--explain needs METHOD and PATH")
		}
		ex := &explainRequest{method: method, target: strings.TrimSpace(target), headers: f.headers, ip: f.ip}
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
	if ex.Repeated != nil {
		fmt.Fprintf(w, "refused with 400: %v; no limit is decided\n", ex.Repeated)
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
			if rule.Parks() {
				q := rule.Queue
				over = fmt.Sprintf("defer to queue %s (outflow %s, to %s)", q.Name, q.Outflow, q.Downstream)
			}
			if rule.OnLimit == rules.Wait {
				over = fmt.Sprintf("wait for a slot every %s, at most %s and %d held at once, else %s",
					rule.Pace().Interval, rule.MaxWait, rule.MaxWaiting, over)
			}
			fmt.Fprintf(w, "  over the limit: %s\n", over)
		}
		if rule.Shadow {
			fmt.Fprintln(w, "  shadow mode: counted and logged, never enforced")
		}
		if rule.Quota {
			fmt.Fprintln(w, "  quota mode: over the limit, denies only when every quota-mode rule of the request is over its limit")
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
