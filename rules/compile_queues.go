package rules

import (
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

func (c *compiler) knownQueues() string {
	if len(c.queues) == 0 {
		return " (no queues are defined)"
	}
	names := make([]string, 0, len(c.queues))
	for n := range c.queues {
		names = append(names, n)
	}
	slices.Sort(names)
	return " (known: " + strings.Join(names, ", ") + ")"
}

func (c *compiler) queue(fd *fileDef, qd *queueDef) {
	file := fd.path
	if !queueconfig.ValidName(qd.name) {
		c.errf(file, qd.nameNode, "queue name %q: use 1 to 64 letters, digits, _ or - (it names a JetStream stream and NATS subjects)", qd.name)
		return
	}
	if prev := c.qNodes[qd.name]; prev != nil {
		c.errf(file, qd.nameNode, "queue %q is already defined in %s", qd.name, c.queues[qd.name].File)
		return
	}
	q := &Queue{
		Config: queueConfig(qd),
		Domain: fd.domain,
		File:   file,
		Line:   qd.nameNode.Line,
	}
	for _, h := range qd.resultHdrs {
		q.ResultHeaders = append(q.ResultHeaders, http.CanonicalHeaderKey(h.name))
	}
	c.validateQueue(file, qd, q)
	if q.FairBy != "" {
		q.fairBy = sourceEntries("fair_by", q.FairBy)
	}
	if q.FlowBy.Enabled() {
		q.flowBy = sourceEntries("flow_by", q.FlowBy.From)
	}
	c.queues[q.Name] = q
	c.qNodes[q.Name] = qd.nameNode
}

// validateQueue reports the problems of q that the queue package's validator finds,
// at their position in qd, but those already reported while reading qd.
func (c *compiler) validateQueue(file string, qd *queueDef, q *Queue) {
	// Fields already reported while reading them (missing, of the wrong type or form)
	// are not reported again by the queue package's validator.
	reported := map[string]bool{"name": true} // checked above, with the file's words
	switch {
	case qd.outflowNode == nil:
		c.errf(file, qd.nameNode, "queue %q needs an outflow (like outflow: {rate: 50/s})", qd.name)
		reported["outflow"] = true
	case !qd.hasOutflow:
		reported["outflow"] = true
	default:
		if err := (limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: q.Outflow.Count, Period: q.Outflow.Period}).Validate(); err != nil {
			c.errf(file, qd.outflowNode, "outflow: %v", err)
			reported["outflow"] = true
		}
	}
	if qd.downNode == nil {
		c.errf(file, qd.nameNode, "queue %q needs a downstream (an http:// or https:// URL, or nats:SUBJECT)", qd.name)
	}
	reported["downstream"] = !qd.hasDown
	reported["flow_by"] = qd.flowBad
	// The queue package's validator decides what a valid queue is (what rules check,
	// a reload and the start accept is what the queue package declares); the problems
	// are reported here with their position.
	var invalid interface{ Unwrap() []error }
	if err := q.Config.Validate(); errors.As(err, &invalid) {
		for _, e := range invalid.Unwrap() {
			var ce *queueconfig.ConfigError
			if !errors.As(e, &ce) || reported[ce.Field] {
				continue
			}
			n := qd.nodes[ce.Field]
			if n == nil {
				n = qd.nameNode
			}
			c.errf(file, n, "%s", ce.Problem)
		}
	}
}

// sourceEntries compiles the source from (fair_by, flow_by: key) into the entries a
// request is read with; nil when from is not a valid source (the validator reports
// it).
func sourceEntries(key, from string) []compiledEntry {
	if queueconfig.CheckSource(from) != nil {
		return nil
	}
	e := RouteEntry{Key: key}
	if err := parseFrom(&e, from, &Route{}); err != nil {
		return nil
	}
	return compileDesc(0, []RouteEntry{e}, nil).entries
}

// queueConfig is the queue configuration of qd; unset fields take the queue package's
// defaults (max_bytes and max_age: none).
func queueConfig(qd *queueDef) queueconfig.Config {
	return queueconfig.Config{
		Name:               qd.name,
		Outflow:            qd.outflow,
		MaxDepth:           qd.maxDepth,
		MaxBytes:           qd.maxBytes,
		MaxAge:             qd.maxAge,
		MaxAttempts:        int(min(qd.maxAttempts, 1_000_000)),
		MaxInFlight:        int(min(qd.maxInFlight, 1_000_000)),
		Backoff:            queueconfig.Backoff{Initial: qd.backoff.Initial, Max: qd.backoff.Max},
		Downstream:         qd.downstream,
		MaxIdempotencyKeys: int(min(qd.maxIdemKeys, queueconfig.MaxIdempotencyKeysLimit+1)),
		MaxBody:            qd.maxBody,
		DropHeaders:        qd.dropHeaders,
		// 0 (unset or unreadable) takes the default.
		DeadLetterMaxAge: qd.deadMaxAge,
		Delivery:         qd.delivery,
		CallbackHosts:    qd.callbackHosts,
		CallbackPrivate:  qd.callbackPrivate,
		CallbackSecret:   qd.callbackSecret,
		Priorities:       qd.priorities,
		FairBy:           qd.fairBy,
		FairLanes:        int(min(qd.fairLanes, queueconfig.MaxFairLanes+1)),
		FlowBy:           qd.flowBy,
		TenantMaxDepth:   qd.tenantMax,
		MaxDelay:         qd.maxDelay,
		Delay:            qd.delay,
	}.WithDefaults()
}
