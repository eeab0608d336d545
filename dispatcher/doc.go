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
// # Flow control per key
//
// A queue with flow_by (queueconfig.FlowBy) gives each value of a request source (a
// merchant, an account of a paid API) its own rate and parallelism inside the queue's
// outflow and max_in_flight:
//
//	queues:
//	  payouts:
//	    outflow: {rate: 100/s}
//	    max_in_flight: 16
//	    flow_by: {from: "header:X-Merchant", rate: 5/s, max_in_flight: 2}
//
// The value is read when the order is parked and stored only as a keyed hash
// (queue.Message.FlowKey, header Sluice-Flow-Key, signed). Before a delivery starts,
// the dispatcher waits for the queue's own slot (without taking it), then asks the
// key: fewer than max_in_flight of its deliveries running, and a free slot of its
// leaky bucket of one start at the key's rate (a limiter.Limiter, memory by default;
// WithFlowLimiter gives a Redis one to keep the pace across a fail-over, as sluice
// does with --redis; max_in_flight per key is counted in memory, see WithFlowLimiter). Only then
// does it take the queue's slot, so each key's starts keep ceil(rate × Δt) + 1 in any
// Δt as the queue's do. An order whose key has no turn is handed back (a delayed NAK,
// queue.Lease.Postpone: not an attempt) for the key's wait plus one interval for each
// order of the key already waiting, so a key's backlog returns spread over its turns
// (each order fetched about twice) and the next order, of any key, is fetched at
// once. Idle keys cost nothing: a key's bucket expires once idle, its running count
// and its waiting list exist only while it has orders there.
//
// Head-of-line blocking. A handed-back order stays unsettled on the server until it
// comes back; with MaxAckPending = max_in_flight, a flooding key's handed-back orders
// would fill it and every other key's orders would wait behind them (measured: B's
// 10 orders after A's 100 all came after A's flood, 20 s, before the change below).
// So the consumer of a queue with flow_by hands out max_in_flight + FlowPending
// (10,000) orders, and the dispatcher keeps max_in_flight itself, counting its
// running deliveries (the pinned dispatcher is the only one starting orders; at a
// fail-over the old one's last deliveries may run beside the new one's). A key with
// more than FlowPending orders waiting at once fills the room again: past that, other
// keys' orders wait for the flood's turns. The pull batch stays 1: the fetch loop asks
// for the next order while one is being checked, so a refused order costs a fetch
// and a NAK, no pacing slot.
//
// Operators pause a key, or pin its rate, on every replica: queue.Queue.SetFlow, the
// admin API's /sluice/v1/queues/{q}/flows/{key}/… and `sluice queue flow`. The
// settings live signed in the key-value bucket sluice_flows; each dispatcher reads
// them every 2 s (sluice_queue_flow_keys_paused shows what it read) and hands a
// paused key's orders back for at most 5 s at a time. Each dispatcher also publishes, every 2 s
// while it holds any, the depth of each flow key (its orders held here: delivering, or
// handed back until the key's turn or pause ends) and its starts per second over the
// last 10 s (queue.Queue.PublishFlowStats), which the flows API and `sluice queue flow
// list|show` read; a key leaves the report once idle for 10 s. Orders of one key are not kept
// in strict order: a new order may take a turn a handed-back one waited for.
//
// Measured (go test -race -count=1 -v -run 'TestFlowBy' ./dispatcher/, 2 cores shared
// with other work, load ≈ 20): two keys at 5/s, A's 100 orders parked before B's 10:
// B's 10 delivered in 2.8 s while 11 of A's were, each key's fullest window within
// ceil(5 × Δt) + 1 (with A's flood at 1,000 orders, the same test gave 2.2 s and 11); max_in_flight 2 per key with 150 ms deliveries: at most 2 running
// per key, 4 in all; 10,000 keys with one order each (rate 1/s, max_in_flight 1 per
// key, outflow 1000/s): all delivered in 77 s under -race, the flow limiter holding
// 211 keys at the end (idle ones gone; a later run at load 25: 2m39s, the reports of
// flow keys holding at most 1,307 keys, those started within 10 s, read in 51 ms on
// average under -race); a paused key held while the others' orders were delivered,
// and a pinned rate of 2/s kept its bound.
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
//
// # Completion callbacks
//
// A client can ask to be told when its deferred order ends: `Sluice-Callback: URL` on the
// request. The queue must allow the URL's host in `callback_hosts` (`host` or `host:port`
// allows https only; `http://host[:port]` allows plain http too; hosts compare without
// case, no wildcards); anything else is refused with 400 before the body is read. The
// queue signs its callbacks with `callback_secret`, a Standard Webhooks (https://www.standardwebhooks.com/)
// key `whsec_<base64>` (24 to 64 bytes), best given as `env:NAME` so the rules file holds
// no secret:
//
//	queues:
//	  orders:
//	    outflow: 50/s
//	    downstream: http://orders-api:8080
//	    callback_hosts: [hooks.shop.example, "http://10.0.0.7:9000"]
//	    callback_secret: env:ORDERS_CALLBACK_SECRET   # whsec_ + 32 random bytes, base64
//
// When the order is done, failed or dead, sluice POSTs
// `{"type":"order.done","timestamp":…,"data":{"ticket":…,"queue":…,"status":"done","downstream_status":201,"attempts":1,…}}`
// with `webhook-id` (`evt_{ticket}_{status}`, the same on every retry), `webhook-timestamp`
// and `webhook-signature: v1,<base64 HMAC-SHA256 of id.timestamp.body>`. The job is stored
// in the stream `SLUICE_CALLBACKS` before the order's message is acknowledged, so a crash
// loses no callback; every dispatcher sends them with 8 senders, at most 2 at once to one
// receiver (host:port), 10 s per attempt, no redirects followed, retrying after anything
// but 2xx from 5 s doubling to 2 h (a longer `Retry-After` on 429/503 wins) for 20
// attempts, then gives up. A failed callback waits for its retry as a stored job, not in
// a sender, so a receiver that fails or never answers delays no other receiver's
// callbacks; after 5 failures in a row a receiver cools down (its callbacks wait untried
// on the backoff schedule, then one probes it). A callback never holds up its queue.
// `sluice_callbacks_total{queue,outcome}` counts delivered, retried, failed (given up),
// deferred (handed back untried: its receiver busy or cooling down) and dropped (forged
// jobs, or a host the queue no longer lists);
// `sluice_callbacks_lost_total` counts jobs that could not be stored. The secret is never
// written to stream metadata, admin answers or logs; a queue adopted from its stream alone
// (it left the rules) has no secret, so sends no callbacks.
//
// A host listed by name in `callback_hosts` is resolved by sluice and each address it
// dials is checked: loopback, link-local (169.254/16, fe80::/10), private (RFC 1918,
// fc00::/7), shared (CGNAT, 100.64/10), multicast, unspecified and reserved or
// documentation ranges are refused, also in IPv4-mapped, NAT64 and 6to4 form, and the
// refusal is logged: a listed name whose DNS points inside the network must not turn
// callbacks into requests to it. A host listed as an IP literal is reached as written
// (the operator named that very address); `callback_private: true` lets a queue's named
// hosts reach any address.
//
// Receivers verify with `queue/webhook` (standard library only; its example is a
// complete receiver that drops repeats by `webhook-id`):
//
//	id, err := webhook.Verify(r.Header, body, time.Now(), 0, secret) // secret from webhook.ParseSecret
//
// # Pacing client
//
// Package `dispatcher/pace` paces a Go program's own calls to a rate-limited API. It links
// neither NATS nor Redis: a client paced with it builds to 8.2 MiB, against 8.2 MiB for the
// same client on `golang.org/x/time/rate` (14.1 MiB when the pacer lived in `dispatcher`;
// `go test -run TestLightPacer -v ./dispatcher/pace/` builds both and holds the ratio
// under 1.5×).
//
//	p, err := pace.New(limiter.PerSecond(20)) // even pacing, no catch-up after a stall
//	err = p.Wait(ctx)                         // like rate.Limiter.Wait with burst 1
//
//	tr, err := pace.NewTransport(http.DefaultTransport, limiter.PerSecond(5))
//	client := &http.Client{Transport: tr}
//
// The transport spaces requests evenly (in any interval Δt at most ceil(rate × Δt) + 1
// starts) and adapts to what the API answers:
//
//   - `RateLimit: "name";r=REMAINING;t=SECONDS` (draft-ietf-httpapi-ratelimit-headers-11; a
//     missing `t` takes `w` of the same-named `RateLimit-Policy` item) and
//     `X-RateLimit-Remaining` + `X-RateLimit-Reset` (seconds from now below 10⁹, a Unix time
//     in seconds below 10¹², else in milliseconds): with nothing remaining every request
//     waits for the reset; with fewer remaining than the rate would spend before the reset,
//     the remaining requests are spread evenly until then. The tightest reported quota wins.
//     Requests already in flight are not subtracted, so at high concurrency the last call
//     of a window can still meet a 429.
//   - 429 / 503 with `Retry-After` (seconds or HTTP-date; default 1 s, capped at 1 h): every
//     request pauses until then, and the request is retried if its body can be replayed.
//
// To share the rate between replicas, keep the schedule in Redis (a separate package, so
// the plain program links no Redis client):
//
//	sched, err := redispace.New(rdb, "pace:{partner-api}")
//	tr, err := pace.NewTransport(nil, limiter.PerSecond(5), pace.WithShared(sched))
//
// Starts are handed out atomically on Redis server time; a pause seen by one replica holds
// for all; if Redis is unreachable the request fails and nothing is sent.
package dispatcher
