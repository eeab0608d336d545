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
	// Unset fields take the queue package's defaults (max_bytes and max_age: none).
	q := &Queue{
		Config: queueconfig.Config{
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
		}.WithDefaults(),
		Domain: fd.domain,
		File:   file,
		Line:   qd.nameNode.Line,
	}
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
	for _, h := range qd.resultHdrs {
		q.ResultHeaders = append(q.ResultHeaders, http.CanonicalHeaderKey(h.name))
	}
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
	if q.FairBy != "" && queueconfig.CheckSource(q.FairBy) == nil {
		e := RouteEntry{Key: "fair_by"}
		if err := parseFrom(&e, q.FairBy, &Route{}); err == nil {
			q.fairBy = compileDesc(0, []RouteEntry{e}, nil).entries
		}
	}
	if q.FlowBy.Enabled() && queueconfig.CheckSource(q.FlowBy.From) == nil {
		e := RouteEntry{Key: "flow_by"}
		if err := parseFrom(&e, q.FlowBy.From, &Route{}); err == nil {
			q.flowBy = compileDesc(0, []RouteEntry{e}, nil).entries
		}
	}
	c.queues[q.Name] = q
	c.qNodes[q.Name] = qd.nameNode
}
