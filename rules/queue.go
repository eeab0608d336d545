package rules

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
)

// outflow reads a queue's outflow: `50/s`, `{rate: 50/s}`, `{unit: second,
// requests_per_unit: 50}` or `{window: 10s, requests_per_unit: 500}`.
func (w *walker) outflow(n *yaml.Node) (limiter.Rate, bool) {
	if n.Kind == yaml.ScalarNode {
		return w.rate(n)
	}
	var (
		r                limiter.Rate
		ok               = true
		rateN, rpuN, per *yaml.Node
	)
	w.fields(n, "outflow", outflowFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "rate":
			rateN = v
			r, ok = w.rate(v)
		case "unit":
			per = v
			s, _ := w.str(v, "unit")
			d, known := limiter.UnitPeriod(s)
			if !known {
				w.errf(v, "unknown unit %q (known: second, minute, hour, day, week, month, year)", s)
				ok = false
			}
			r.Period = d
		case "window":
			per = v
			d, dok := w.duration(v, "window")
			ok = ok && dok
			r.Period = d
		case "requests_per_unit":
			rpuN = v
			r.Count = w.positive(v, "requests_per_unit")
			ok = ok && r.Count > 0
		}
	})
	switch {
	case rateN != nil && (rpuN != nil || per != nil):
		w.errf(n, "outflow: give either rate or unit and requests_per_unit, not both")
		return limiter.Rate{}, false
	case rateN == nil && (rpuN == nil || per == nil):
		w.errf(n, "outflow needs rate (like 50/s) or unit and requests_per_unit")
		return limiter.Rate{}, false
	}
	return r, ok
}

// rate reads N/UNIT where UNIT is a unit name (s, second, m, min, minute, h, hour, d,
// day) or a duration (3000/10m).
func (w *walker) rate(n *yaml.Node) (limiter.Rate, bool) {
	s, ok := w.str(n, "rate")
	if !ok {
		return limiter.Rate{}, false
	}
	r, err := limiter.ParseRate(s)
	if err != nil {
		w.errf(n, "%v", err)
		return limiter.Rate{}, false
	}
	return r, true
}

// size reads a byte count: a whole number or a number with a unit (KB, MB, GB, KiB,
// MiB, GiB).
func (w *walker) size(v *yaml.Node, what string) int64 {
	if v.Kind == yaml.ScalarNode && v.Tag == "!!int" {
		return w.positive(v, what)
	}
	s, ok := w.str(v, what)
	if !ok {
		return 0
	}
	n, err := ParseSize(s)
	if err != nil {
		w.errf(v, "%s: %v", what, err)
		return 0
	}
	return n
}

// ParseSize reads a byte count as rules files write it: a whole number of at least 1,
// optionally with a unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB; any case). The sluice
// command reads its size flags with it too.
func ParseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil || n < 1 {
		return 0, fmt.Errorf("%q is not a size like 512MiB or 1GB", s)
	}
	units := map[string]int64{"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
		"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}
	m, ok := units[strings.ToLower(strings.TrimSpace(t[i:]))]
	if !ok {
		return 0, fmt.Errorf("%q: unknown size unit (use KB, MB, GB, KiB, MiB or GiB)", s)
	}
	if n > (1<<62)/m {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return n * m, nil
}

// downstream reads `http://…`, `https://…` or `nats:SUBJECT`.
func (w *walker) downstream(v *yaml.Node) (string, bool) {
	s, ok := w.str(v, "downstream")
	if !ok {
		return "", false
	}
	d, err := parseDownstream(s)
	if err != nil {
		w.errf(v, "downstream: %v", err)
		return "", false
	}
	return d, true
}

func parseDownstream(s string) (string, error) {
	if subj, ok := strings.CutPrefix(s, "nats:"); ok {
		if err := checkSubject(subj); err != nil {
			return "", err
		}
		return "nats:" + subj, nil
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", fmt.Errorf("invalid URL %q", s)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return "", fmt.Errorf("%q must be an http:// or https:// URL or nats:SUBJECT", s)
	case u.Host == "" || u.Hostname() == "":
		return "", fmt.Errorf("URL %q has no host", s)
	case u.User != nil:
		// Downstream URLs appear in logs and admin pages.
		return "", fmt.Errorf("URL %q must not carry credentials", u.Redacted())
	case u.Fragment != "":
		return "", fmt.Errorf("URL %q must not have a #fragment", s)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return "", fmt.Errorf("URL %q has an invalid port", s)
		}
	}
	return u.String(), nil
}

// checkSubject accepts a literal NATS subject to publish on: dot-separated non-empty
// tokens, no wildcards, no white space.
func checkSubject(s string) error {
	if s == "" {
		return fmt.Errorf("nats: needs a subject, like nats:orders.paced")
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch {
		case tok == "":
			return fmt.Errorf("NATS subject %q has an empty token", s)
		case tok == "*" || tok == ">":
			return fmt.Errorf("NATS subject %q has a wildcard; work is published on a literal subject", s)
		case strings.ContainsAny(tok, " \t\r\n\x00"):
			return fmt.Errorf("NATS subject %q contains white space", s)
		}
	}
	return nil
}
