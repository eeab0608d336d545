package rules

import (
	"fmt"
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

// downstream reads `http://…`, `https://…` or `nats:SUBJECT`; the queue package
// validates it (see queueconfig.Config.Validate).
func (w *walker) downstream(v *yaml.Node) (string, bool) {
	return w.str(v, "downstream")
}
