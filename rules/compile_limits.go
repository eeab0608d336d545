package rules

import (
	"cmp"
	"math"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
)

// hasExtensions reports whether a rate_limit or its descriptor uses sluice's fields:
// then requests_per_unit 0 is a mistake, not Envoy's block list.
func hasExtensions(dd *descDef, rl *limitDef) bool {
	o := rl.opts
	return rl.winNode != nil || o.algNode != nil || o.burstNode != nil || o.failureNode != nil ||
		o.forgiveNode != nil || len(dd.extensions) > 0
}

// period checks a limit's unit or window and returns its period.
func (c *compiler) period(file string, ld *limitDef) (period int64, ok bool) {
	switch {
	case ld.unitNode != nil && ld.winNode != nil:
		c.errf(file, ld.winNode, "give either unit or window, not both")
	case ld.multNode != nil && ld.unitNode == nil:
		c.errf(file, ld.multNode, "unit_multiplier goes with unit (a window is written whole: window: 5m)")
	case ld.unitNode != nil:
		d, known := limiter.UnitPeriod(ld.unit)
		if !known {
			c.errf(file, ld.unitNode, "unknown unit %q (known: %s; or use window: 30s)", ld.unit, strings.Join(limiter.UnitNames(), ", "))
			return 0, false
		}
		if ld.multNode != nil {
			if ld.mult < 1 {
				return 0, false // reported while parsing
			}
			if int64(d) > math.MaxInt64/ld.mult {
				c.errf(file, ld.multNode, "unit_multiplier %d makes the period too long", ld.mult)
				return 0, false
			}
			d *= time.Duration(ld.mult)
		}
		return int64(d), true
	case ld.winNode != nil:
		return int64(ld.window), ld.window > 0
	default:
		c.errf(file, ld.node, "rate limit needs a unit (second, minute, hour, day) or a window (like 30s)")
	}
	return 0, false
}

func (c *compiler) limit(file string, dd *descDef, ld *limitDef) (limiter.Limit, bool) {
	p, ok := c.period(file, ld)
	switch {
	case ld.rpuNode == nil:
		c.errf(file, ld.node, "rate limit needs requests_per_unit")
		ok = false
	case ld.rpu == 0:
		c.errf(file, ld.rpuNode, "requests_per_unit must be at least 1 (0, Envoy's block list, works only in a plain rate_limit without sluice fields)")
		ok = false
	case ld.rpu < 0:
		ok = false // reported while parsing
	}
	if !ok {
		return limiter.Limit{}, false
	}
	o := ld.opts
	l := limiter.Limit{
		Algorithm:       cmp.Or(o.algorithm, dd.opts.algorithm, limiter.FixedWindow),
		Rate:            ld.rpu,
		Period:          time.Duration(p),
		Burst:           max(o.burst, 0),
		ForgiveRejected: o.forgive || (o.forgiveNode == nil && dd.opts.forgive),
		FailureMode:     cmp.Or(o.failure, dd.opts.failure, limiter.FailLocal),
	}
	if o.burstNode == nil {
		l.Burst = max(dd.opts.burst, 0)
	}
	if !l.Algorithm.Valid() {
		return limiter.Limit{}, false // reported while parsing
	}
	if l.Algorithm != limiter.TokenBucket && l.Algorithm != limiter.LeakyBucket {
		l.Burst = 0
	}
	if err := l.Validate(); err != nil {
		c.errf(file, ld.node, "%v", err)
		return limiter.Limit{}, false
	}
	return l, true
}
