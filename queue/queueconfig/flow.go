package queueconfig

import "github.com/sluicehq/sluice/limiter"

// FlowBy gives each key of a queue (a merchant, an account of a paid API) its own
// outflow and parallelism inside the queue's global Outflow and MaxInFlight: an order
// starts only when the queue's pacer, its key's Rate and its key's MaxInFlight all let
// it. The zero value (From empty) turns it off.
//
// From names the request source whose value is the key (the forms of FairBy:
// header:NAME, query:NAME, client_ip, method or host). The value is captured when
// the order is parked and stored only as a keyed hash (queue.Message.FlowKey); an
// order whose request has no value shares the key of every other such order. As with
// FairBy, a client that chooses the value (a header it sets) can spread its orders
// over many keys: name a source the client cannot choose when the per-key rate is a
// limit rather than a courtesy.
type FlowBy struct {
	From string
	// Rate is each key's outflow (zero: none beyond the queue's). Starts of one key are
	// paced evenly: in any interval Δt at most ceil(Rate × Δt) + 1 of them.
	Rate limiter.Rate
	// MaxInFlight caps the deliveries of one key running at once (0: none beyond the
	// queue's MaxInFlight).
	MaxInFlight int
}

// Enabled reports whether the queue has flow control per key.
func (f FlowBy) Enabled() bool { return f.From != "" }

// Limit is the limit each key's starts are checked against (FlowBy.Rate set): a leaky
// bucket that holds one start, so that starts of a key are one interval apart.
func (f FlowBy) Limit() limiter.Limit {
	return limiter.Limit{Algorithm: limiter.LeakyBucket, Rate: f.Rate.Count, Period: f.Rate.Period, Burst: 1}
}

// validateFlow reports the problems of FlowBy.
func (c Config) validateFlow(bad func(field, format string, args ...any)) {
	f := c.FlowBy
	if !f.Enabled() {
		if !f.Rate.IsZero() || f.MaxInFlight != 0 {
			bad("flow_by", "flow_by needs from (like from: header:X-Merchant)")
		}
		return
	}
	if err := CheckSource(f.From); err != nil {
		bad("flow_by", "flow_by from: %v", err)
	}
	switch {
	case f.Rate.IsZero() && f.MaxInFlight == 0:
		bad("flow_by", "flow_by needs a rate (like rate: 5/s), a max_in_flight, or both")
	case !f.Rate.IsZero():
		if err := f.Limit().Validate(); err != nil {
			bad("flow_by", "flow_by rate %s: %v", f.Rate, err)
		}
	}
	if f.MaxInFlight < 0 {
		bad("flow_by", "flow_by max_in_flight must be at least 1, got %d", f.MaxInFlight)
	}
	if f.MaxInFlight > c.MaxInFlight {
		bad("flow_by", "flow_by max_in_flight %d is more than the queue's max_in_flight %d (which caps every key too)", f.MaxInFlight, c.MaxInFlight)
	}
}
