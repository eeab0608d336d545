// Package queue parks deferred requests durably in NATS JetStream and keeps their
// tickets: the storage half of sluice's "defer instead of drop". The dispatcher package
// drains the queues.
//
// # JetStream layout
//
//	stream  SLUICE_Q_{queue}      subjects sluice.q.{queue}.{ticket}; work-queue retention,
//	                              file storage, MaxMsgs/MaxBytes with discard-new
//	                              (a full queue refuses: ErrFull; nothing queued is ever
//	                              trimmed), duplicate window, replicas from queueconfig.Config;
//	                              a queue with schedules also sluice.s.{queue}.{ticket}
//	                              (see Scheduled delivery)
//	consumer dispatch             durable pull consumer of the dispatchers (see dispatcher),
//	                              filtered on sluice.q.{queue}.*
//	stream  SLUICE_DEAD           dead letters of every queue on sluice.dlq.{queue}.{ticket}
//	                              (limits retention: listed, re-queued, purged on demand;
//	                              each expires after its queue's DeadLetterMaxAge, a
//	                              per-message TTL)
//	kv      sluice_tickets        ticket → Record (status, attempts, result); per-key TTL
//	kv      sluice_idempotency    {client hash}.{key hash} → ticket and payload fingerprint;
//	                              create-if-absent after the order is stored; byte cap
//	stream  SLUICE_KEYS_{queue}   one slot per accepted key on sluice.keys.{queue}.{client
//	                              hash}, MaxIdempotencyKeys per subject (discard-new per
//	                              subject), per-message TTL IdempotencyTTL
//	subject sluice.done.{queue}   Event per order that reached done or failed
//	subject sluice.dead.{queue}   Event per dead-lettered order
//
// Because every parked message has a subject of its own, a ticket's message is found
// with one direct get, which is how Status answers for tickets the dispatcher has not
// written a record for yet, and how Park knows whether an idempotent repeat's message
// exists. The message data is the request body; everything else travels as NATS
// headers (see HeaderTicket for the mapping).
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
// Lifetimes: an idempotency key is remembered from its order's acceptance until the
// order is final, then for the queue's IdempotencyTTL (default 24h, at least MaxAge;
// see Store.KeepKey); a ticket record for IdempotencyTTL after its last change. A message waits in the queue until it is delivered; with MaxAge set, a
// dispatcher dead-letters the messages older than that instead of delivering them (the
// stream itself has no age limit, which would delete them unseen).
//
// # Scheduled delivery
//
// An order may wait for a time of its own before it joins the queue's outflow: the
// client's Request.NotBefore (the Sluice-Not-Before request header), at most the queue's
// MaxDelay after receipt (else ErrSchedule), or the queue's fixed Delay; the later of
// the two counts, rounded up to a whole second. Such an order is parked as a JetStream
// message schedule (ADR-51, nats-server 2.12 and later): the same message, headers and
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
package queue
