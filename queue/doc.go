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
//	                              per-message TTL; one made by an older sluice is
//	                              updated to allow them, its dead letters kept)
//	kv      sluice_tickets        ticket → Record (status, attempts, result); per-key TTL
//	kv      sluice_idempotency    {client hash}.{key hash} → ticket and payload fingerprint;
//	                              written when the order becomes final (while it waits,
//	                              its message is the record: see Store.Park); byte cap
//	stream  SLUICE_SLOTS_{queue}  one slot per accepted key on sluice.keys.{queue}.slot.
//	                              {client hash}, MaxIdempotencyKeys per subject (discard-new
//	                              per subject), per-message TTL IdempotencyTTL; memory
//	                              storage (on file where the server refuses memory: see
//	                              Store.keyStream); atomic batches. SLUICE_KEYS_{queue} on
//	                              sluice.keys.{queue}.{client hash} is an earlier
//	                              sluice's, on file: left to expire, deleted by Retire
//	stream  SLUICE_CALLBACKS      completion callback jobs on sluice.cb.{queue}.{ticket}
//	                              (CallbackStream; work-queue retention, CallbackMaxAge)
//	kv      sluice_flows          {queue}.{flow key hash} → an operator's FlowControl
//	                              (FlowsBucket, see Flow keys)
//	kv      sluice_flow_stats     {queue}.{dispatcher} → its report of the flow keys it
//	                              holds (FlowStatsBucket; memory storage, FlowStatsTTL)
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
// Orders of a queue that became laned, parked before, are drained as one more lane of
// the default level; a lane that left the configuration keeps its consumer and is
// drained as a lane of the nearest level; an order waiting in a lane without a consumer
// (its lane fixed under another configuration) is the queue's consumer's, which takes
// every such lane: every ready subject is taken by exactly one consumer. How the
// consumers' filters change without losing an order is Consumer.Ensure's.
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
//
// Measured: deploy/figures/README.md, "Priorities and fairness".
//
// fair_by reads whatever the request carries: a header or query value is the client's to
// choose, so use a header an authenticating proxy sets (and strips from clients), or
// client_ip. Tenants sharing a lane share its turns and its tenant_max_depth.
//
// # Group commit
//
// Park writes to two streams: an order without a key is one write; a keyed order takes
// its key slot (at once with its lookup), then stores the order (its key is recorded
// only when the order becomes final; while it waits, its message is the key's
// record). Each stream has one writer per Store; the key stream is in memory (see
// Store.keyStream; on file, where memory is refused, a single-replica one is not synced
// and takes no batches: see Store.ensureSlots). While few synced writes are
// in flight each goes out at once; those beyond are gathered into one JetStream atomic
// batch (up to 256 messages, see jsproto.PublishBatch), stored whole or not at all, as
// one proposal on a replicated stream and one disk sync on a file store: concurrent
// Parks share a write. "Few" is one on a replicated stream (or in memory) and 16 on a
// single-replica file stream, where nats-server stages each batch in a file store of
// its own (fileDirectWrites).
// Every caller still waits for the acknowledgement of its own write's batch: "accepted"
// is said only for what is stored. A refused batch (a repeated Nats-Msg-Id, a client
// over its key cap, a full queue…) stored nothing, and each of its messages is
// published again on its own to get a plain publish's answer. Stored messages keep the
// batch headers; nothing reads them. Below nats-server 2.12 every write is a plain
// publish (Supported NATS servers in deploy/README.md says what each version gives).
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
// Lifetimes: an idempotency key is remembered from its order's acceptance (by the
// waiting message, found through the ticket the key names in its queue) until the
// order is final, then for the queue's IdempotencyTTL in the key-value bucket (default
// 24h, at least MaxAge; see Lease); a ticket record for IdempotencyTTL after its last
// change. A message waits in the queue until it is delivered; with MaxAge set, a
// dispatcher dead-letters the messages older than that instead of delivering them (the
// stream itself has no age limit, which would delete them unseen).
//
// # Durability: what a client can tell
//
// A cluster's acknowledgement means a quorum holds the write, not that any disk does:
// that depends on each server's sync_interval (nats-server's default syncs every two
// minutes; a power cut of the cluster, or one node's OS crash while another is paused
// or cut off, then loses acknowledged orders). CheckDurability reports what a client is
// told; never known from a client of a JetStream account: the servers' sync setting
// (each server's monitoring port shows it: /varz, jetstream.config.sync_always),
// whether a disk acknowledges a sync it has not done, and whether the servers' hosts
// share a power supply. sluice serve --nats logs the problems once, or refuses to start
// with --require-durable.
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
// fires then. The server keeps a timer wheel of the pending schedules in memory.
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
// A client schedules with Sluice-Not-Before (an HTTP-date or seconds from now) on a
// route deferring into a queue with max_delay: parked even within the limit (its token
// is still spent) and answered 202 "scheduled"; a bad or too late time is a 400; the
// downstream never sees the header; an idempotent repeat gets the first order's due
// time. TestScheduledSurvivesKill: 25 orders, sluice killed before any was due, all
// delivered once and none early. BenchmarkScheduled100k, BenchmarkScheduledFire100k
// (the loaded 2-core machine): 100,000 waiting orders take about 96 MiB and 0.5% of a
// core; 100,000 falling due in one second took 210 s of single-node disk writes (about
// 480/s) and a temporary ~300 MiB: spread due times.
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
// # Signed orders
//
// Every parked message carries an HMAC-SHA256 (HeaderSignature) by the Store's signing
// key (WithSigningKey) over everything that decides its delivery; ticket and idempotency
// records are stored sealed with the same key. Store.Verify tells a genuine message from
// a forged one (ErrForged); records that do not verify are treated as absent. Whoever
// can publish on sluice.q.> or write the buckets without the key can have nothing
// delivered and no genuine order skipped (they can still delete or purge; NATS
// permissions guard that). Tickets are 128-bit random values; knowing one is what lets a
// caller read its status (the ingress does not scope status reads by client).
//
// The signature is `Sluice-Signature: v1=<base64>`, over a length-prefixed encoding of
// the ticket, queue, rule, method, path, query, received-at time, client hash,
// idempotency key, payload fingerprint, every stored request header (sorted names, all
// values), the body and, when set, the lane, the callback URL, the due time and the
// park's trace context (appended only when set, so orders parked by an older sluice
// still verify); `v1` names the encoding. Before anything else, the
// dispatcher checks the signature and that the message sits on its own queue's and
// ticket's subject: a missing or wrong one is dead-lettered as `forged: …`, never
// delivered, and touches neither the ticket record nor the events (its ticket may be a
// genuine order's); so is an unsigned message with a ticket and a queue but no order's
// shape (read with the `nats:` consumers' decoder, package queue/subscriber). Only a
// message no dead letter could hold (no ticket's shape or valid queue name) is
// terminated. A signed order without a method, whose path does not start with a single
// `/`, is badly escaped, or whose query holds spaces, control characters or `#` is
// dead-lettered as `invalid: …`; the delivery URL is assembled from `url.URL` fields,
// so no parked path (`@host/x`, `//host/x`) can change the host. Both count in
// `sluice_queue_dead_total` and `sluice_queue_rejected_total{reason}`. Dead letters and
// `sluice dlq requeue` keep the signature: a genuine order re-queued verifies again, a
// forged one is dead again.
//
// Ticket records and idempotency records are stored as `{"sig":"v1=…","record":{…}}`,
// signed over the record kind, its key and the record's exact bytes. A record that does
// not verify is ignored: the dispatcher and the monitor (`GET /sluice/v1/deferred/…`)
// treat the ticket as having no record (the queue says where it is), and a forged
// idempotency record is replaced. The key's setup and rotation (one key at a time:
// drain the queues before changing it) are in Security model (deploy/README.md).
//
// # NATS downstreams
//
// `downstream: nats:SUBJECT` publishes each order on SUBJECT, paced like HTTP deliveries
// (Store.Forward). By default (`delivery: at_least_once`) through JetStream: a stream
// capturing the subject must exist when the queue is declared (else Declare fails with
// ErrNoStream, the subject named), and the order is done once that stream acknowledged
// it; a stream deleted later makes the downstream "down" (orders wait, attempts
// unchanged). `delivery: at_most_once` is a core NATS publish, done once the server has
// it. `deploy/` creates the stream of its example (`NOTIFICATIONS`, `notifications.>`).
//
// The message contract for subscribers (the headers, the delivery signature byte by
// byte, acknowledgements and duplicates, the reply on sluice.result.{queue}.{ticket}) is
// package queue/subscriber's, which decodes, verifies and replies. Consumers check
// orders with their queue's delivery key (Store.DeliveryKey; `sluice queue delivery-key
// QUEUE` prints it), which checks and signs that queue's orders and results and nothing
// else. A dispatcher of a `nats:` queue writes the first reply that verifies, for a done
// ticket, into its record (ResultConsumer; body up to MaxResultBody, the queue's
// result_headers, never Set-Cookie); others are refused and logged.
package queue
