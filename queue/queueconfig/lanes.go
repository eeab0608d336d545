package queueconfig

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// PriorityMode is how a queue with priority levels shares its outflow among them.
type PriorityMode string

const (
	// Strict: a delivery slot always goes to the highest level with waiting orders.
	// A lower level waits for as long as a higher one has work: it can starve. Use it
	// when higher-level work is bounded by its own limits (a rule's rate), or when
	// starving the lower levels is the intent.
	Strict PriorityMode = "strict"
	// Weighted: each level with waiting orders gets delivery slots in proportion to
	// its weight (smooth weighted round robin). While the set of levels with work
	// stays the same, every window of W consecutive slots (W the sum of the weights of
	// those levels) holds exactly weight slots of each of them: a waiting order of a
	// level is reached at the latest after W − weight slots of the others.
	Weighted PriorityMode = "weighted"
)

// MaxPriorityLevels is the most levels Priorities may declare.
const MaxPriorityLevels = 8

// MaxPriorityWeight is the largest weight of a level.
const MaxPriorityWeight = 1000

// DefaultFairLanes is the number of tenant lanes of a queue with FairBy unless
// FairLanes says otherwise.
const DefaultFairLanes = 16

// MaxFairLanes is the most tenant lanes a queue may have; MaxLanes caps levels ×
// tenant lanes (each lane is a consumer on the server).
const (
	MaxFairLanes = 64
	MaxLanes     = 256
)

// Priorities declares the priority levels of a queue. A route's priority source
// names a level; an order whose value names none (or has no value) gets Default.
type Priorities struct {
	// Levels are the level names, highest first (1–8 of them).
	Levels []string
	// Default is the level of an order without a known level (default: the last,
	// lowest, level).
	Default string
	// Mode is Strict or Weighted (default Weighted).
	Mode PriorityMode
	// Weights gives each level its share in Weighted mode (default 1 each; 1–1000).
	Weights map[string]int
}

// Equal reports whether p and o declare the same levels, default, mode and weights.
func (p Priorities) Equal(o Priorities) bool {
	return slices.Equal(p.Levels, o.Levels) && p.Default == o.Default && p.Mode == o.Mode && maps.Equal(p.Weights, o.Weights)
}

// Enabled reports whether any levels are declared.
func (p Priorities) Enabled() bool { return len(p.Levels) > 0 }

// Level returns the index (0: highest) of the level named name, or of Default when
// name names none.
func (p Priorities) Level(name string) int {
	if i := slices.Index(p.Levels, name); i >= 0 {
		return i
	}
	if i := slices.Index(p.Levels, p.Default); i >= 0 {
		return i
	}
	return max(len(p.Levels)-1, 0)
}

// Weight returns the weight of level i (Weighted mode).
func (p Priorities) Weight(i int) int {
	if i < 0 || i >= len(p.Levels) {
		return 1
	}
	if w, ok := p.Weights[p.Levels[i]]; ok && w > 0 {
		return w
	}
	return 1
}

// Laned reports whether orders of the queue wait in lanes (priorities or fair_by);
// without, the queue is one FIFO as it always was.
func (c Config) Laned() bool { return c.Priorities.Enabled() || c.FairBy != "" }

// LaneCount returns the number of priority levels and tenant lanes of the queue (1
// and 1 for a queue without them).
func (c Config) LaneCount() (levels, tenants int) {
	levels, tenants = max(len(c.Priorities.Levels), 1), 1
	if c.FairBy != "" {
		tenants = c.FairLanes
		if tenants == 0 {
			tenants = DefaultFairLanes
		}
	}
	return levels, tenants
}

func (c Config) lanesWithDefaults() Config {
	p := &c.Priorities
	if p.Enabled() {
		if p.Mode == "" {
			p.Mode = Weighted
		}
		if p.Default == "" {
			p.Default = p.Levels[len(p.Levels)-1]
		}
	}
	if c.FairBy != "" && c.FairLanes == 0 {
		c.FairLanes = DefaultFairLanes
	}
	return c
}

// validateLanes reports the problems of Priorities, FairBy, FairLanes and
// TenantMaxDepth.
func (c Config) validateLanes(bad func(field, format string, args ...any)) {
	p := c.Priorities
	if p.Enabled() || p.Default != "" || p.Mode != "" || len(p.Weights) > 0 {
		switch {
		case len(p.Levels) == 0:
			bad("priorities", "priorities: levels are required (for example [high, normal, low])")
		case len(p.Levels) > MaxPriorityLevels:
			bad("priorities", "priorities: at most %d levels, got %d", MaxPriorityLevels, len(p.Levels))
		}
		for i, l := range p.Levels {
			if !levelNameOK(l) {
				bad("priorities", "priorities: level %q: use 1-32 letters, digits, _ or -", l)
			}
			if slices.Index(p.Levels, l) != i {
				bad("priorities", "priorities: level %q is listed twice", l)
			}
		}
		if p.Default != "" && len(p.Levels) > 0 && !slices.Contains(p.Levels, p.Default) {
			bad("priorities", "priorities: default %q is not one of the levels %v", p.Default, p.Levels)
		}
		if p.Mode != Strict && p.Mode != Weighted {
			bad("priorities", "priorities: mode %q: use strict or weighted", p.Mode)
		}
		if p.Mode == Strict && len(p.Weights) > 0 {
			bad("priorities", "priorities: weights apply to mode weighted only")
		}
		for l, w := range p.Weights {
			if !slices.Contains(p.Levels, l) {
				bad("priorities", "priorities: weight of %q, which is not a level", l)
			}
			if w < 1 || w > MaxPriorityWeight {
				bad("priorities", "priorities: weight of %q must be between 1 and %d, got %d", l, MaxPriorityWeight, w)
			}
		}
	}
	if c.FairBy == "" {
		if c.TenantMaxDepth != 0 {
			bad("tenant_max_depth", "tenant_max_depth needs fair_by")
		}
		if c.FairLanes != 0 {
			bad("fair_lanes", "fair_lanes needs fair_by")
		}
		return
	}
	if err := CheckSource(c.FairBy); err != nil {
		bad("fair_by", "fair_by: %v", err)
	}
	if c.FairLanes < 1 || c.FairLanes > MaxFairLanes {
		bad("fair_lanes", "fair_lanes must be between 1 and %d, got %d", MaxFairLanes, c.FairLanes)
	}
	if levels, tenants := c.LaneCount(); levels*tenants > MaxLanes {
		bad("fair_lanes", "%d priority levels × %d fair_lanes is more than %d lanes", levels, tenants, MaxLanes)
	}
	if c.TenantMaxDepth < 0 {
		bad("tenant_max_depth", "tenant_max_depth must not be negative")
	}
}

func levelNameOK(s string) bool {
	if s == "" || len(s) > 32 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// CheckSource accepts the request sources a queue's FairBy may name: header:NAME,
// query:NAME, client_ip, method or host (path parameters belong to routes). The rules
// package parses the same forms for routes.
func CheckSource(s string) error {
	kind, name, found := strings.Cut(s, ":")
	switch {
	case kind == "header" && found:
		if !ValidHeaderName(name) {
			return fmt.Errorf("%q: header:NAME needs a valid header name", s)
		}
		return nil
	case kind == "query" && found:
		if name == "" {
			return fmt.Errorf("%q: query:NAME needs a parameter name", s)
		}
		return nil
	case !found && (s == "client_ip" || s == "method" || s == "host"):
		return nil
	}
	return fmt.Errorf("%q must be header:NAME, query:NAME, client_ip, method or host", s)
}
