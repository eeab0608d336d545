// Package dispatcher drains sluice queues to their downstreams at a paced, global
// outflow rate, and offers the same pacing to Go programs as an http.RoundTripper.
//
// # Dispatching
//
//	store, _ := queue.Open(ctx, nc, queue.WithSigningKey(key)) // key: shared by every replica
//	store.Declare(ctx, queueconfig.Config{Name: "orders", Outflow: limiter.PerSecond(50), Downstream: "http://orders-api:8080"})
//	d, _ := dispatcher.New(store, dispatcher.WithLogger(log), dispatcher.WithRegisterer(reg))
//	err := d.Run(ctx) // every declared queue, until ctx ends
//
// See Dispatcher for fail-over, retries, pauses and dead letters.
//
// # Global rate: a pinned priority group
//
// All replicas of a queue pull from one durable consumer configured with the pinned
// priority policy. The server delivers to one pull client at a time (the pinned one) and
// moves the pin only when that client has sent no pull request for PinnedTTL. So the
// pinned dispatcher's local Pacer is the queue's global pacer, no shared store is
// involved, and fail-over is automatic. The alternative — every replica taking slots
// from a pacer in Redis — would add a Redis round trip per delivery and a second
// system whose outage stops all queues; the pinned group needs nothing but JetStream.
// A pinned dispatcher can stall while holding orders (SIGSTOP, a paused VM, a long
// stop of its host): past PinnedTTL the server pins a successor, which paces with a
// pacer of its own. So right before a delivery's request leaves, the dispatcher checks
// that the pin cannot have moved yet and will not for one more interval (a pinned TTL
// after the sending of its latest pull request that brought an order, by its own
// clock; queue.Lease.Held) and that its slot is under a second old; otherwise it hands
// the order back untouched. A dispatcher resumed after such a stall therefore starts
// nothing beside its successor (TestStoppedDispatcherStartsNothingBesideItsSuccessor
// stops a dispatcher process for three pinned TTLs while it holds two orders; without
// the check it started both beside its successor). What remains: a stall that falls
// between that check and the request's write (microseconds, or the dial of a new
// connection) lets that delivery start beside the successor's: one start more than the
// bound, once per such stall.
//
// # Pacing
//
// pace.Pacer is a leaking bucket holding one event: in any interval Δt at most
// ceil(rate × Δt) + 1 deliveries start, with no catch-up after a stall. The bound holds
// on the times the pacer grants, by construction; the pace.Pacer type documents the argument.
// Every request that reaches a downstream is one of those starts: a delivery is sent
// through pace.SendOnce, so that the HTTP client never sends it again on its own (net/http
// would, on another connection, for a request dropped unanswered on a reused one); such
// an attempt fails and is retried after the backoff, at a slot of its own.
// Deliveries carry their pacing slot in the request context (DeliveryFrom).
//
// # Library pacing
//
// The Pacer and the pacing http.RoundTripper live in package pace (dispatcher/pace),
// which links neither NATS nor Redis, for programs that only pace their own calls:
//
//	tr, err := pace.NewTransport(nil, limiter.PerSecond(5))
//	client := &http.Client{Transport: tr}
//
// Package pace/redispace shares the rate between processes through Redis.
package dispatcher
