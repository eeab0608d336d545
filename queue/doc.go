// Package queue parks deferred requests durably in NATS JetStream and keeps their
// tickets: the storage half of sluice's "defer instead of drop". The dispatcher package
// drains the queues.
//
// # JetStream layout
//
//	stream  SLUICE_Q_{queue}      subjects sluice.q.{queue}.{ticket} and, in a laned
//	                              queue, sluice.q.{queue}.{lane}.{ticket} (ReadySubject);
//	                              work-queue retention,
//	                              file storage, MaxMsgs/MaxBytes with discard-new
//	                              (a full queue refuses: ErrFull; nothing queued is ever
//	                              trimmed), duplicate window, replicas from queueconfig.Config,
//	                              atomic batch publish allowed (see Group commit); a queue
//	                              with schedules also sluice.s.{queue}.{ticket} (see
//	                              Scheduled delivery)
//	consumer dispatch             durable pull consumer of the dispatchers (see dispatcher),
//	                              filtered on the ready subjects; in a laned queue on the
//	                              unlaned orders and the lanes without a consumer
//	consumer dispatch_p{L}t{T}    one per lane of a laned queue (see Priorities and fairness)
//	stream  SLUICE_DEAD           dead letters of every queue on sluice.dlq.{queue}.{ticket}
//	                              (limits retention: listed, re-queued, purged on demand;
//	                              each expires after its queue's DeadLetterMaxAge, a
//	                              per-message TTL)
//	kv      sluice_tickets        ticket → Record (status, attempts, result); per-key TTL
//	kv      sluice_idempotency    {client hash}.{key hash} → ticket and payload fingerprint;
//	                              written when the order becomes final (while it waits,
//	                              its message is the record: see Store.Park); byte cap
//	stream  SLUICE_KEYS_{queue}   one slot per accepted key on sluice.keys.{queue}.{client
//	                              hash}, MaxIdempotencyKeys per subject (discard-new per
//	                              subject), per-message TTL IdempotencyTTL; atomic batches
//	subject sluice.done.{queue}   Event per order that reached done or failed
//	subject sluice.dead.{queue}   Event per dead-lettered order
//
// Because every parked message has a subject of its own, a ticket's message is found
// with one direct get, which is how Status answers for tickets the dispatcher has not
// written a record for yet, and how Park knows whether an idempotent repeat's message
// exists. The message data is the request body; everything else travels as NATS
// headers (see HeaderTicket for the mapping).
//
// # Priorities and fairness
//
// A queue with priorities (queueconfig.Priorities) or fair_by (queueconfig.Config.FairBy)
// is laned: an order waits in the lane p{L}t{T} of its level L (0 is the highest; the
// route's priority source names the level, an unknown or missing value is the default
// level) and of its tenant lane T (the fair_by value hashed with the signing key to one
// of FairLanes lanes: never raw client input in a subject, and a client cannot aim at a
// lane it knows). The lane is a signed header (HeaderLane) and part of the subject, so
// an order cannot be moved to a better lane without the key. Each lane has a durable
// consumer; the scheduler of the one dispatcher that leads the queue gives each delivery
// slot, paced at the queue's one outflow, to a lane:
//
//   - levels, strict: the highest level with waiting orders. A lower level waits as
//     long as a higher one has work; it can starve. That is the point of strict (bound
//     the higher levels with their rules' limits, or use weighted); no aging is done,
//     because an aged order would take slots strict promises to the higher level.
//   - levels, weighted: smooth weighted round robin over the levels with waiting
//     orders. While the same levels have work, every W consecutive slots (W the sum of
//     their weights) hold exactly w of a level of weight w, so a waiting order of a
//     level reaches the head of its level within W − w slots of other levels (8/2/1:
//     a low order waits at most 10 slots, see TestPriorityWeighted).
//   - tenants: within a level, round robin over the tenant lanes with waiting orders,
//     one order per turn: with k tenant lanes busy, each gets every k-th slot of its
//     level, however deep the others are (TestFairByFlood: a tenant's 3 orders parked
//     behind a flood of 1,000 of another are delivered in slots 1, 3 and 5). Tenants
//     whose values hash to the same lane share its turns (raise fair_lanes).
//
// Orders of a queue that became laned, parked before, wait on the unlaned subject and
// are drained as one more lane of the default level. A lane that left the
// configuration (fewer levels or lanes) keeps its consumer and is drained as a lane of
// the nearest level. When a queue stops being laned its lane consumers are deleted and
// the queue's consumer takes every subject again, laned orders included. An order can
// wait in a lane that has no consumer: a lane the queue had before it lost its lanes,
// or one it never had, when the order's lane was fixed under another configuration (a
// dead letter re-queued into its lane, which is signed; a scheduled order, whose target
// is set when it is parked; an order parked by a replica still on another
// configuration). So in a laned queue the queue's consumer takes, beside the unlaned
// orders, every lane of the 512 (MaxPriorityLevels × MaxFairLanes) that has no consumer
// of its own, and such orders are drained with the unlaned ones: every ready subject
// is taken by exactly one consumer. Its filter shrinks by an update when a lane gets a
// consumer; it never grows by one (an update keeps the consumer's ack floor, which may
// have passed orders of the subject added): when it must take more, it is made anew
// (see Consumer.Ensure). A lane the queue's consumer took gets its own consumer only
// once the orders of the lane it handed out are settled: it redelivers those whatever
// its filter, and the lane's consumer would hand them out beside it. On a queue where
// some always are, it waits at most ConsumerConfig.MaxLaneHold (5 minutes), then gives
// the lane its consumer anyway: the orders held then may go out twice (same
// Idempotency-Key), which a warning says.
//
// The lead: the lanes are several consumers, which a pinned priority group cannot keep
// with one dispatcher, so a laned queue is led through a key (leader.{queue}) in the
// tickets bucket with the pinned TTL: the dispatcher holding it fetches, the others
// wait, and another one takes over when it expires (or at once when the leader stops:
// Consumer.Unpin releases it). Pausing the queue's consumer (Queue.Pause, a downstream's
// 429) pauses the lanes: the scheduler reads the pause with the lanes' depths, at most
// ConsumerConfig.LaneRefresh (default 100ms) old, which is also how long an order in a
// lane that was empty may wait before the scheduler sees it. Each refresh lists the
// queue's consumers (one request). MaxInFlight caps each lane's handed-out orders.
//
// TenantMaxDepth caps the waiting and handed-out orders of a tenant lane: past it Park
// refuses with a *FullError (Lane set, Limit "tenant_max_depth"), as a full queue does
// (Limit "max_depth" or "max_bytes"). The count is read from
// the lane's consumer before the publish, and the server counts a write there a moment
// after it confirms it, so parks racing or following each other closely can overshoot
// the cap by their number.
// # Group commit
//
// Park writes to two streams: an order without a key is one write; a keyed order takes
// its key slot, then stores the order (its key is recorded only when the order becomes
// final; while it waits, its message is the key's record). Each stream has one writer
// per Store. A single-replica key stream is not synced and takes no batches (see
// Store.ensureKeyStream): what follows is about the synced writes.
// While few of its writes are in flight, each goes out at once as a plain synchronous
// publish; the writes that arrive beyond that are gathered and go as one JetStream
// atomic batch (Nats-Batch-Id, Nats-Batch-Sequence, Nats-Batch-Commit; up to 256
// messages), which the server stores whole or not at all, as one proposal on a
// replicated stream and with one disk sync on a file store that syncs every write:
// concurrent Parks share a write instead of queueing for one each. "Few" is one write
// on a replicated stream (or one in memory) and 16 on a single-replica file stream
// (the embedded server's), where nats-server stages each batch in a file store of its
// own, which costs more than the syncs of a small batch save (see fileDirectWrites).
//
// Every caller still waits for the acknowledgement of the batch its own write was in,
// so nothing below changes: "accepted" is said only for what is stored, in the same
// order of writes. When JetStream refuses a batch (a message repeats a stored
// Nats-Msg-Id, a client is over its key cap, the queue is full…) nothing of it was
// stored, and each of its messages is published again on its own, to get the answer a
// plain publish gets. Messages written in a batch keep the batch headers; nothing
// reads them. The streams Park writes allow atomic batches (AllowAtomicPublish); on a
// server older than 2.12 they are not asked for, and every write is a plain publish
// (MinServerVersion, and Supported NATS servers in deploy/README.md, say what each
// server version gives).
//
// # Guarantees
//
// Park returns a receipt only after JetStream acknowledged the publish (on the embedded
// server every write is synced to disk first; on a cluster an R3 stream acknowledges
// after a quorum stored it). Any failure — NATS unreachable, no acknowledgement within
// the publish timeout, a full queue — returns an error and the caller must not tell its
// client the request was accepted. The reverse cannot be ruled out (a message stored
// whose acknowledgement was lost): the client then retries, and with an Idempotency-Key
// the retry maps to the stored message.
//
// Lifetimes: an idempotency key is remembered from its order's acceptance (by the
// waiting message, found through the ticket the key names in its queue) until the
// order is final, then for the queue's IdempotencyTTL in the key-value bucket (default
// 24h, at least MaxAge; see Lease); a ticket record for IdempotencyTTL after its last change. A message waits in the queue until it is delivered; with MaxAge set, a
// dispatcher dead-letters the messages older than that instead of delivering them (the
// stream itself has no age limit, which would delete them unseen).
//
// # Durability: what a client can tell
//
// A cluster's acknowledgement means a quorum holds the write, not that any disk does:
// that depends on each server's sync_interval (nats-server's default syncs every two
// minutes; a power cut of the cluster, or one node's OS crash while another is paused
// or cut off, then loses acknowledged orders). CheckDurability reads what a client is
// told: the server's version and cluster, the servers the connection knows of, the
// account's JetStream domain, and the configuration of sluice's streams that exist
// (memory storage, one replica on a cluster), besides the replicas the caller is
// about to declare. Never known from a client of a JetStream account: the servers'
// sync setting (only the system account, which has no JetStream, may ask a server's
// configuration; each server's monitoring port shows it: /varz,
// jetstream.config.sync_always), whether a disk or its controller acknowledges a sync
// it has not done, and whether the servers' hosts share a power supply. sluice serve --nats logs the
// problems once, or refuses to start with --require-durable.
//
// # A stuck server
//
// Direct gets (AllowDirect on every stream and bucket) are answered by any replica:
// reads of keys, ticket records and parked messages go to one of them at random. A
// replica on a server that stopped answering with its connections up (SIGSTOP, a
// stuck host, a partition that drops packets) keeps its share until the cluster's
// routes notice, minutes later. So a read waits directWait (1 s) for a direct get and
// then asks the stream's leader (its message API), which a stuck follower cannot
// hold up; a stuck leader is replaced by an election. Clients' own connections to such
// a server are the caller's to bound: sluice pings every 2 s and leaves a server after
// 2 unanswered pings.
//
// # Scheduled delivery
//
// An order may wait for a time of its own before it joins the queue's outflow: the
// client's Request.NotBefore (the Sluice-Not-Before request header), at most the queue's
// MaxDelay after receipt (else ErrSchedule), or the queue's fixed Delay; the later of
// the two counts, rounded up to a whole second. Such an order is parked as a JetStream
// message schedule (ADR-51, nats-server 2.12 and later: on an older server Declare
// refuses the queue, see MinScheduleServerVersion): the same message, headers and
// body, on sluice.s.{queue}.{ticket} with "Nats-Schedule: @at {due, RFC 3339}" and
// "Nats-Schedule-Target: sluice.q.{queue}.{ticket}". When it falls due the server
// stores a copy on the target, in the same stream, and purges the schedule message; the
// copy carries every Sluice-* header (JetStream strips only its own Nats-Msg-Id and
// scheduling headers), so it verifies as parked. The dispatch consumer is filtered on
// the ready subjects, so it sees the copy only: due orders join the one paced outflow in
// the order they fell due, behind what was queued before. Until then Status says
// StatusScheduled with the due time (Record.NotBefore), and Cancel writes the cancelled
// record and deletes the schedule message (a copy fired in that instant is dropped by
// the dispatcher that fetches it, which reads the record first).
//
// The schedules live in the stream, on disk, like any message: a crash or restart of
// sluice or of NATS loses none, and one that is past due when the server comes back
// fires then. The server keeps a timer wheel of the pending schedules in memory (see
// BenchmarkScheduled100k for the cost of 100,000).
//
// JetStream refuses schedules on a discard-new stream (a due order could find no room
// and be lost), so the stream of a queue with MaxDelay or Delay has neither MaxMsgs nor
// MaxBytes: Park keeps both caps itself from stream info at most 100ms old (the
// scheduled orders count), which concurrent parks can overshoot by what arrives in that
// time; once accepted, an order always finds room when it falls due. Such a stream also
// allows roll-ups (schedules need them). JetStream cannot turn schedules off again: a
// queue that once had them keeps the scheduled stream whatever its configuration says.
// A queue's Depth counts its scheduled orders, and a queued order's Position counts
// those stored before it.
//
// # Signatures
//
// Every parked message carries an HMAC-SHA256 (HeaderSignature) by the Store's signing
// key (WithSigningKey) over everything that decides its delivery, a scheduled order's
// due time included (HeaderNotBefore); ticket and
// idempotency records are stored sealed with the same key. Store.Verify tells a genuine
// message from a forged one (ErrForged); records that do not verify are treated as
// absent. Whoever can publish on sluice.q.> or write the buckets without the key can
// therefore have nothing delivered and no genuine order skipped. (They can still delete
// or purge; NATS permissions guard that.)
//
// Tickets are 128-bit random values; knowing one is what lets a caller read its status
// (the ingress does not scope status reads by client).
//
// # Queues and dispatchers
//
// The JetStream layout is above; the dispatchers are package dispatcher's. Each queue is a file-backed work-queue stream with `max_depth` / `max_bytes` and
// discard-new (a full queue refuses; nothing queued is trimmed; orders older than
// `max_age` are dead-lettered by the dispatcher, not deleted by JetStream), a
// duplicate window on `Nats-Msg-Id`, and 1 replica embedded or 3 on a cluster. The
// embedded server syncs every write to disk before acknowledging it.
//
// Dispatchers pull from one durable consumer per queue in small batches. The consumer is a
// pinned priority group: the server delivers to one dispatcher at a time and moves the
// pin when it stops pulling, so that dispatcher's local pacer is the queue's global pacer
// and fail-over needs no other system. Pacing is an even leaking bucket: in any interval
// Δt at most ceil(rate × Δt) + 1 deliveries start, with no catch-up after a stall.
// Delivery is acknowledged only after a 2xx (or a NATS publish acknowledgement). 429 or
// 503 with `Retry-After` (seconds or HTTP-date) pauses the whole queue on every replica
// (`PauseConsumer`) and retries without counting a failed attempt; 5xx, timeouts and
// network errors back off exponentially with jitter; other 4xx fail for good. After
// `max_attempts` the order goes to the dead-letter stream with an event on
// `sluice.dead.{queue}`; completions are published on `sluice.done.{queue}`. Each dead
// letter carries its queue's `dead_letter_max_age` (default 14 days) as a JetStream
// per-message TTL, so queues sharing `SLUICE_DEAD` keep theirs for different times; a
// `SLUICE_DEAD` made by an earlier sluice is updated to allow TTLs (its dead letters,
// written without one, stay until requeued or purged; a sluice before this one can no
// longer open it).
//
// # Scheduled delivery
//
// A client asks that its order be delivered not before a time with
// `Sluice-Not-Before: <HTTP-date>` or `Sluice-Not-Before: <seconds from now>`. On a route
// whose rule defers into a queue with `max_delay`, such a request is parked whether or not
// it is over the limit (its limiter token is still spent), and answered `202` with
// `"status":"scheduled"`, `"not_before"` and `estimated_delivery` at that time (rounded up
// to a whole second). A time beyond `max_delay`, a queue without `max_delay`, a malformed
// value, a route without a queue or a request no rule applies to are `400` problems that
// say why. A queue's
// `delay` holds back every order that long; the later of the two counts. The header is
// sluice's: the downstream never sees it.
//
// The ticket's monitor says `scheduled` with `not_before` and `due_in` (seconds) until
// then; `DELETE` cancels it while it waits. When it falls due, the order joins the queue's
// paced outflow (in its lane, see below) behind what is already queued, in due-time
// order. Scheduled orders are JetStream message schedules (nats-server's own, ADR-51)
// stored on disk in the queue's own stream on `sluice.s.{queue}.{ticket}`, so a `kill -9`
// of sluice or a restart of NATS loses none (`TestScheduledSurvivesKill`: 25 orders,
// sluice killed before any was due, all delivered once and none early); one past due at
// restart fires then. The due time is signed with the order, so nobody without the key
// can move it, and a copy replayed early onto the ready subject is refused as forged.
//
// Cost (`go test -run '^$' -bench BenchmarkScheduled100k -benchtime 1x ./queue/`, on the
// loaded 2-core machine): 100,000 waiting orders take about 96 MiB of memory and 0.5% of
// a core; 100,000 falling due in the same second took 210 s of single-node disk writes
// (about 480/s) and a temporary ~300 MiB (`BenchmarkScheduledFire100k`). Spread due times
// when you can. JetStream refuses schedules on a discard-new stream, so a queue with
// scheduling keeps `max_depth`/`max_bytes` itself, from stream information at most 100 ms
// old (concurrent parks may overshoot by what arrives in that time), and once enabled a
// queue's stream keeps scheduling for good. A route-level `delay` is not built; an
// idempotent repeat with another `Sluice-Not-Before` gets the first order's ticket and
// due time.
//
// # Priorities and fairness inside a queue
//
// A queue can share its one outflow between priority levels and between tenants
// (`priorities`, `fair_by`, `fair_lanes`, `tenant_max_depth` in the annotated example
// above; a route names the level with `priority:`). `strict` always serves the highest
// level with waiting orders (lower levels can starve; bound the higher levels with their
// rules' limits); `weighted` gives each busy level its weight's share by smooth weighted
// round robin: with 8/2/1 a low order waits at most 10 deliveries. Within a level, tenant
// lanes with waiting orders take turns, one order each, so one tenant's flood delays
// another tenant's orders by a slot each instead of by the whole flood:
//
// Columns: go test -count=1 -v -run 'TestFairByFlood|TestPriorityWeighted' ./queue/, result.
//
//   - tenant A floods 1,000 orders, 5 delivered, then tenant B parks 3 — with `fair_by`: B delivered at positions 1, 3, 5
//   - the same without `fair_by` (one FIFO): B delivered at positions 996, 997, 998
//   - weighted 8/2/1, every level busy: longest wait of a low order: 10 slots (the bound); every 11-slot window holds 8/2/1
//   - through two dispatchers at 100/s (`TestFairByDispatch`): B at positions 5–13 (the 100 ms lane refresh and the prefetch)
//
// An order waits in the lane `sluice.q.{queue}.p{L}t{T}.{ticket}` of its level and of its
// tenant lane: the `fair_by` value hashed with the signing key into `fair_lanes` lanes, so
// no client input appears in a subject and no client can aim at a lane. The lane is
// signed. `fair_by` reads whatever the request carries: a header or query value is the
// client's to choose, so use a header your authenticating proxy sets (and strips from
// clients), or `client_ip`. Tenants sharing a lane share its turns and its `tenant_max_depth` (a soft cap:
// the lane's consumer counts an order a moment after its write is confirmed, so parks
// racing or closely following each other can overshoot it by their number). Each lane has a durable consumer;
// one dispatcher leads a laned queue at a time through a key in the tickets bucket with
// the pinned TTL, so the outflow stays global, and another takes over when it stops. The
// scheduler notices a newly busy lane or a pause within 100 ms. `max_in_flight` applies
// per lane. A queue without `priorities` and `fair_by` is one FIFO as before; adding them
// keeps its waiting orders, which are delivered as part of the default level. A lane the
// configuration drops keeps its consumer and is drained as a lane of the nearest level;
// an order waiting in a lane that has no consumer (a dead letter re-queued, or a
// scheduled order falling due, into a lane of an earlier configuration; an order parked
// by a replica still on another one) is delivered with the orders of the default level.
// A lane added to the configuration whose orders were parked before the dispatchers
// took the new configuration (they went with the default level meanwhile) gets its own
// consumer once the orders of it that are being delivered are settled, or after at most
// 5 minutes: orders of it in flight at that moment may then be delivered twice, with
// the same `Idempotency-Key` (a warning says so).
//
// # Flow keys
//
// A queue with `flow_by` (queueconfig.FlowBy) gives each value of a request source its
// own rate and max_in_flight inside the queue's; package dispatcher documents how
// they are kept. Park stores only a keyed hash of the value, 32 hex digits of an HMAC
// with the signing key (Message.FlowKey, header Sluice-Flow-Key, part of the
// signature: an order cannot be moved to another key), so the stream, logs and
// metrics never hold a merchant's id; orders whose request has no value share one
// key. Queue.SetFlow and Queue.ChangeFlow keep an operator's pause or pinned rate of a
// key, named by its value, in the bucket sluice_flows (made by the first setting; at
// most MaxFlowControls keys per queue; each entry sealed like ticket records, so one
// written without the key is ignored; each change a read-modify-write checked against
// the entry's revision, so concurrent changes from two replicas both hold), and
// Queue.Flows lists them by hash.
// Lease.Postpone hands an order back until its key's turn without counting an attempt.
// The queue's consumer hands out max_in_flight + FlowPending orders (see
// dispatcher.FlowPending) and the dispatcher keeps max_in_flight for the whole queue
// itself (in a laned queue too, where it is otherwise per lane).
//
// Depth and rate per key: the orders' subjects do not name their key, so the stream
// cannot count a key's orders without reading them all. The dispatcher that leads the
// queue counts them instead, the orders of each key it holds (delivering, or handed
// back until the key's turn or the end of its pause) and its starts over the last
// FlowRateWindow, and publishes them every 2 s (Queue.PublishFlowStats, the bucket
// FlowStatsBucket: about 19 bytes a key, one value per dispatcher and queue, none once
// it holds nothing); Queue.FlowStats sums the reports. Orders it has not fetched yet
// (past the first FlowPending, or behind a paused queue), waiting for a retry or
// scheduled are in the queue's depth only. Measured with 10,000 keys (go test -run X
// -bench FlowStats ./queue/, 2 cores shared): a report of 190 kB, written in about
// 10 ms and read in about 4.4 ms.
//
// # Memory
//
// The front door reads a deferred body only as far as its queue can store it, into a
// budget of `--defer-memory` (64 MiB). The embedded NATS server's max payload follows
// the largest `max_body` of the queues at start (room for it, 64 KiB of request headers
// and sluice's own; with `--nats`, raise `max_payload` on the servers: a queue whose
// `max_body` the server cannot carry is logged at start and its bodies are limited to
// what fits). While a body is stored, the embedded server holds a copy too, and each
// delivery under way holds its order's body; so that the garbage of large bodies does not
// pile up, `serve` and `ingress` set the Go memory limit (soft) to 2 × `--defer-memory` +
// 64 MiB, plus `max_in_flight` × `max_body` of each queue when they dispatch; `GOMEMLIMIT`
// overrides it. Measured by `TestDeferredBodiesBoundedMemory`: three bursts of 60
// concurrent 7–9 MiB bodies to a queue with `max_body: 8MiB` leave `sluice serve` at a
// peak of 240–250 MB resident (1.03 GB before).
//
// # Signed orders
//
// Whoever can publish on `sluice.q.>` or write the `sluice_tickets` bucket (a client of an
// open `--nats-listen`, a user of a shared cluster) must not be able to have an order
// delivered or a real one skipped. So every parked message carries
// `Sluice-Signature: v1=<base64>`: HMAC-SHA256, keyed by the queue key, over a
// length-prefixed encoding of the ticket, queue, rule, method, path, query, received-at
// time, client hash, idempotency key, payload fingerprint, every stored request header
// (sorted names, all values), the body and, when set, the lane, the callback URL, the due
// time and the park's trace context (`Sluice-Traceparent`/`Sluice-Tracestate`; appended
// only when set, so orders parked by an older sluice still verify). `v1` names the encoding, so it can change
// without ambiguity. Before anything else, the dispatcher checks the signature and that
// the message sits on its own queue's and ticket's subject; a missing or wrong one is
// dead-lettered with reason `forged: …` and never delivered; so is an unsigned message
// that names a ticket and a queue but has no order's shape (no method, a path such as
// `@evil.example/x`), read with the same decoder as the `nats:` consumers' (package
// queue/subscriber). Only a message without a ticket's shape or a valid queue name, which
// no dead letter could hold, is terminated. A forged message does not
// touch the ticket record nor publish an event (its ticket may be a genuine order's).
// A signed order without a method, whose path does not start with a single `/`, is
// badly escaped, or whose query holds spaces, control characters or `#` is
// dead-lettered as `invalid: …`, never sent.
// The delivery URL is the downstream's scheme and host with its path followed by the
// parked escaped path and query, assembled from `url.URL` fields, so no parked path
// (`@host/x`, `//host/x`, `http://host/x`) can change the host. Both count in
// `sluice_queue_dead_total` and in `sluice_queue_rejected_total{reason="forged"|"invalid"}`.
// `sluice dlq list` shows the reason; dead letters and `sluice dlq requeue` keep the
// signature, so a genuine order re-queued verifies again and a forged one is dead again.
//
// Ticket records and idempotency records are stored as `{"sig":"v1=…","record":{…}}`,
// signed over the record kind, its key and the record's exact bytes. A record that does
// not verify is ignored: the dispatcher and the monitor (`GET /sluice/v1/deferred/…`)
// treat the ticket as having no record (the queue says where it is), and a forged
// idempotency record is replaced.
//
// The key. With `--nats`, give every process (`serve`, `ingress`, `dispatch`, `dlq`)
// the same `--queue-key` / `SLUICE_QUEUE_KEY`; without it they refuse to start (exit 2).
// With the embedded server and no `--queue-key`, sluice generates 32 random bytes on the
// first start and keeps them, base64, in `DATA_DIR/queue.key` (mode 0600, written to a
// temporary file and linked into place, never overwritten); a restart on the same data
// directory reuses it, and `sluice dlq --data-dir` reads it. A key file readable by group
// or others, not a regular file, or not a key stops the start with a message naming it.
// To run `sluice dispatch` or `sluice dlq --nats` against an embedded server's
// `--nats-listen`, pass them the content of its key file as `SLUICE_QUEUE_KEY` (or give
// the embedded process the same `--queue-key`).
//
// Changing the key (rotation, or a new data directory with old streams): there is
// one key at a time. Orders parked and records written under the old key no longer
// verify: parked orders are dead-lettered as `forged` instead of being delivered, and
// their ticket records are ignored. Drain the queues (depth 0) before changing it; orders
// caught by a change stay in the dead letters, where `sluice dlq requeue` will not help
// (they stay forged under the new key) — restore the old key to deliver them. The same
// holds for orders parked by a sluice older than signatures.
//
// # NATS downstreams
//
// `downstream: nats:SUBJECT` publishes each order on SUBJECT, paced like HTTP deliveries.
// By default (`delivery: at_least_once`) the publish goes through JetStream: a stream that
// captures the subject must exist when the queue is declared (at start and at each
// reload; otherwise the declaration fails with the subject named), and the order is done
// when that stream acknowledged it. A stream deleted later makes the downstream "down"
// (circuit above): orders wait, attempts unchanged. `delivery: at_most_once` is a core
// NATS publish, done as soon as the server has it, whether or not anyone is subscribed.
// `deploy/` creates the stream of its example (`NOTIFICATIONS`, subjects
// `notifications.>`); by hand: `nats stream add NAME --subjects 'SUBJECT' --defaults`.
//
// The message contract for subscribers: the data is the request body; the request travels
// in headers.
//
// Columns: header, value.
//
//   - `Nats-Msg-Id`: the ticket: a republish within the stream's duplicate window is dropped
//   - `Sluice-Ticket`: the ticket (26 characters, base32)
//   - `Sluice-Queue`: queue name
//   - `Sluice-Rule`: the rule that deferred the request
//   - `Sluice-Method`, `Sluice-Path`, `Sluice-Query`: method, escaped path, raw query (no `?`)
//   - `Sluice-Received-At`: when sluice received the request, RFC 3339 with nanoseconds
//   - `Sluice-Idempotency-Key`: the client's `Idempotency-Key`, when it sent one
//   - `Sluice-Client`: a hash of the client identity (never a key or an address)
//   - `Sluice-Fingerprint`: hex SHA-256 of the payload (method, path, query, content type and encoding, body)
//   - `Sluice-H-{Name}`: each kept request header, every value in order (not hop-by-hop headers, `Host`, `Content-Length`, `Expect` or the queue's `drop_headers`). The client's `Idempotency-Key` is kept as sent, so it travels twice: `Sluice-Idempotency-Key` and `Sluice-H-Idempotency-Key`
//   - `Sluice-Not-Before`, `Sluice-Lane`: a scheduled order's due time; a laned order's lane
//   - `traceparent`, `tracestate`: the delivery's W3C trace context, when sluice traces (see Tracing (deploy/README.md))
//   - `Sluice-Delivery-Signature`: HMAC-SHA256 of the `Sluice-*` fields above but `Sluice-Not-Before` and `Sluice-Lane` (not covered), the kept headers and the body, with the queue's delivery key (specified byte by byte, with a worked example, in `go doc ./queue/subscriber`; `queue/subscriber/testdata/verify.py` implements it with Python's standard library)
//
// Acknowledgements: sluice's order is done when the stream stored the message; what the
// subscriber acknowledges is between it and its stream (a durable consumer with explicit
// acks redelivers what it did not acknowledge). A subscriber may see an order twice (sluice
// redelivers when it crashed after the publish but before its own acknowledgement, past
// the duplicate window): deduplicate on `Sluice-Ticket`. Orders arrive in queue order at
// the queue's outflow; several workers or redeliveries can reorder them (MaxAckPending 1
// when order matters).
//
// Verifying and replying. Consumers check orders with their queue's delivery key,
// `HMAC-SHA256(signing key, "sluice delivery key" ‖ queue)`:
// `SLUICE_QUEUE_KEY=… sluice queue delivery-key orders` prints it (with the embedded NATS,
// `SLUICE_QUEUE_KEY` is the contents of `sluice-data/queue.key`). It lets a consumer check
// that queue's orders and sign that queue's results, nothing else: it cannot be turned
// into another queue's key or the signing key, so it forges nothing sluice stores and no
// other queue's orders. (An asymmetric signature would stop consumers forging orders of
// their own queue, but their replies need a key of their own anyway; one derived secret
// per queue serves both directions.) The Go package
// `queue/subscriber` (queue/subscriber) (the NATS client only: no server, no Prometheus)
// decodes, verifies and replies; `Verifier.Handle` runs one message the way the contract
// asks — decode, verify (terminate a forgery), work, reply, acknowledge, or nak with a
// delay when the work or the reply fails. `go run ./queue/subscriber/example/worker
// --nats URL --queue orders --stream NOTIFICATIONS` (key in `SLUICE_DELIVERY_KEY`) is a
// complete worker; `Example` in the package runs one against an embedded server.
//
// A reply (status 100–599, headers, body up to 64 KiB, truncated and flagged beyond)
// goes to `sluice.result.{queue}.{ticket}`, stored in the stream `SLUICE_RESULTS`
// (work-queue, 24 h, 64 MiB). A dispatcher of a `nats:` queue writes it into the ticket,
// so `GET /sluice/v1/deferred/{ticket}` shows `done` with that status, the body and the
// headers the queue keeps in results (`result_headers`; never `Set-Cookie`). Only the
// first reply counts, only for a done ticket of a `nats:` queue, and only when it verifies
// under that queue's key; others are refused and logged. On a shared cluster, import the
// SLUICE account's service `sluice.result.{queue}.>` into the workers' account
// (`deploy/nats/accounts.conf` exports it; `TestSubscriberReplyLandsInTicket` runs a
// worker in another account through the binary).
package queue
