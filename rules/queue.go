package rules

import (
	"fmt"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
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

func (w *walker) queue(name string, nameNode, n *yaml.Node) *queueDef {
	q := &queueDef{node: n, name: name, nameNode: nameNode, nodes: map[string]*yaml.Node{}}
	w.fields(n, "queue "+name, queueFields, func(key string, k, v *yaml.Node) {
		q.nodes[key] = v
		switch key {
		case "outflow":
			q.outflow, q.hasOutflow = w.outflow(v)
			q.outflowNode = v
		case "max_depth":
			q.maxDepth = w.positive(v, key)
		case "max_bytes":
			q.maxBytes = w.size(v, key)
		case "max_age":
			field(v, key, w.duration, &q.maxAge, nil)
		case "max_attempts":
			q.maxAttempts = w.positive(v, key)
		case "max_in_flight":
			q.maxInFlight = w.positive(v, key)
		case "backoff":
			w.fields(v, "backoff", backoffFields, func(key string, k, v *yaml.Node) {
				d, _ := w.duration(v, "backoff "+key)
				if key == "initial" {
					q.backoff.Initial = d
				} else {
					q.backoff.Max = d
				}
			})
		case "downstream":
			q.downstream, q.hasDown = w.downstream(v)
			q.downNode = v
		case "result_headers":
			q.resultHdrs = w.names(v, key)
		case "max_idempotency_keys":
			q.maxIdemKeys = w.positive(v, key)
		case "max_body":
			q.maxBody = w.size(v, key)
		case "drop_headers":
			for _, hn := range w.items(v, key) {
				if h, ok := w.str(hn, "header name"); ok {
					q.dropHeaders = append(q.dropHeaders, h)
				}
			}
		case "dead_letter_max_age":
			field(v, key, w.duration, &q.deadMaxAge, nil)
		case "max_delay":
			field(v, key, w.duration, &q.maxDelay, nil)
		case "delay":
			field(v, key, w.duration, &q.delay, nil)
		case "delivery":
			d, _ := w.str(v, key)
			q.delivery = queueconfig.Delivery(d)
		case "callback_hosts":
			for _, h := range w.names(v, key) {
				q.callbackHosts = append(q.callbackHosts, h.name)
			}
		case "callback_private":
			q.callbackPrivate, _ = w.boolean(v, key)
		case "callback_secret":
			q.callbackSecret = w.secret(v, key)
		case "priorities":
			w.priorities(v, &q.priorities)
		case "fair_by":
			q.fairBy, _ = w.str(v, key)
		case "fair_lanes":
			q.fairLanes = w.positive(v, key)
		case "flow_by":
			// A problem reported here (the value's shape, a field's) is not reported
			// again by the queue package's validator.
			before := len(w.probs.list) + w.probs.dropped
			defer func() { q.flowBad = len(w.probs.list)+w.probs.dropped > before }()
			w.fields(v, "flow_by", flowFields, func(key string, k, v *yaml.Node) {
				switch key {
				case "from":
					q.flowBy.From, _ = w.str(v, "flow_by from")
				case "rate":
					q.flowBy.Rate, _ = w.rate(v)
				case "max_in_flight":
					q.flowBy.MaxInFlight = int(min(w.positive(v, "flow_by max_in_flight"), 1_000_000))
				}
			})
		case "tenant_max_depth":
			q.tenantMax = w.positive(v, key)
		}
	})
	return q
}

// priorities reads a queue's priorities: {levels: [..], default: L, mode: M, weights: {L: N}}.
func (w *walker) priorities(n *yaml.Node, p *queueconfig.Priorities) {
	w.fields(n, "priorities", priorityFields, func(key string, k, v *yaml.Node) {
		switch key {
		case "levels":
			for _, ref := range w.names(v, "priorities levels") {
				p.Levels = append(p.Levels, ref.name)
			}
		case "default":
			p.Default, _ = w.str(v, "priorities default")
		case "mode":
			m, _ := w.str(v, "priorities mode")
			p.Mode = queueconfig.PriorityMode(m)
		case "weights":
			if v = w.resolve(v); v == nil {
				return
			}
			if v.Kind != yaml.MappingNode {
				w.errf(v, "priorities weights must map levels to weights, like {high: 8, normal: 2, low: 1}, got %s", kindName(v))
				return
			}
			p.Weights = map[string]int{}
			for i := 0; i+1 < len(v.Content); i += 2 {
				level, ok := w.str(v.Content[i], "a priority level")
				n, nok := w.integer(v.Content[i+1], "weight of "+level)
				if ok && nok {
					p.Weights[level] = int(max(min(n, queueconfig.MaxPriorityWeight+1), 0))
				}
			}
		}
	})
}
