// Package subscriber is for the consumers of sluice queues whose downstream is
// nats:SUBJECT: it decodes a delivered order, checks that sluice sent it, and sends
// back a result that sluice keeps in the order's ticket. It needs only the NATS client
// (nats.go and its jetstream package), never the NATS server or sluice's queue
// internals.
//
// # Delivery
//
// A dispatcher delivers each order of such a queue by publishing it to SUBJECT, at the
// queue's outflow rate:
//
//   - delivery at_least_once (the default): through JetStream. A stream must capture
//     SUBJECT (sluice refuses to declare the queue otherwise); the order is done once
//     that stream stored it. Read it with a durable JetStream consumer.
//   - delivery at_most_once: a core NATS publish and a flush. The order is done once
//     the server has it, whether or not anyone is subscribed; lost if nobody is.
//
// The message data is the client's request body. The headers:
//
//	Nats-Msg-Id                the ticket: the capturing stream drops a republish of
//	                           the same order within its duplicate window
//	Sluice-Ticket              the ticket: 26 characters, base32 lower case
//	Sluice-Queue               the queue name
//	Sluice-Rule                the rule that deferred the request (if any)
//	Sluice-Method              the HTTP method of the client's request
//	Sluice-Path                its escaped path, starting with a single "/"
//	Sluice-Query               its raw query, without "?" (absent when empty)
//	Sluice-Received-At         when sluice received it, RFC 3339 with nanoseconds, UTC
//	Sluice-Client              a hash of the client's identity (never a raw key or address)
//	Sluice-Idempotency-Key     the client's Idempotency-Key (absent when none)
//	Sluice-Fingerprint         hex SHA-256 payload fingerprint (method, path, query,
//	                           Content-Type, Content-Encoding, body)
//	Sluice-H-{Name}            each request header sluice kept, every value in order
//	                           (hop-by-hop headers, Host, Content-Length, Expect and the
//	                           queue's drop_headers are never kept)
//	Sluice-Delivery-Signature  "v1=" + base64 HMAC-SHA256 of all the above (as Decode
//	                           reads them) and the body, under the queue's delivery key
//
// Other headers (tracing headers, for example) may be present and are not covered by
// the signature. sluice's internal Sluice-Signature and Sluice-Callback never leave it.
//
// # Authenticity
//
// Each queue has a delivery key, derived from sluice's signing key (--queue-key):
// DeliveryKey(signingKey, queue) = HMAC-SHA256(signingKey, "sluice delivery key" ‖
// queue). Operators print it with `sluice queue delivery-key QUEUE` and give it to
// that queue's consumers only. With it a consumer checks that an order was sent by
// sluice for that queue (Verifier.Verify) and signs the results of that queue — and
// nothing else: HMAC keys derived for other queues, and the signing key itself, cannot
// be computed from it, so a consumer of queue A can neither forge orders nor results
// of queue B, nor touch what sluice keeps (parked orders, ticket and idempotency
// records are signed with the signing key). A holder of A's key can forge orders of A
// — only to A's own consumers, which trust it anyway. (Asymmetric signatures would
// spare the consumers even that, but results must be signed by the consumer, which
// would need a second per-queue key pair to configure; one derived secret per queue
// does both.)
//
// A genuine order may be published again by anyone allowed on SUBJECT: consumers must
// be idempotent on the ticket (they must be anyway: see below).
//
// # Consuming: acknowledgement, redelivery, ordering
//
// At least once means a consumer may see an order more than once: sluice republishes
// an order whose publish it could not confirm (a dispatcher crash, a lost
// acknowledgement); the stream's duplicate window (Nats-Msg-Id) hides most repeats, and
// a JetStream consumer redelivers what it did not acknowledge within its AckWait.
// Deduplicate by Order.Ticket. The expected handling, with an explicit-ack consumer:
//
//  1. Decode and Verify; Term a message that fails (it is never going to verify).
//  2. Do the work, idempotently on the ticket.
//  3. Reply with the result (optional), then Ack. If the reply fails, Nak (with a
//     delay) rather than Ack, so that the order comes back and the reply is retried.
//
// Orders reach SUBJECT in the queue's delivery order (parking order, retries aside)
// at the queue's outflow rate; a consumer with several workers, or redeliveries, can
// reorder them. A queue whose orders depend on one another should be consumed by one
// worker with MaxAckPending 1.
//
// sluice marks the order done as soon as the publish was stored (at least once) or
// flushed (at most once), whatever the consumer does next: a consumer failing is not
// retried by sluice. sluice's ticket status says "done"; the result says what the
// consumer made of it.
//
// # Results
//
// A consumer may answer an order with a Result: an HTTP-like status (100–599), a few
// headers and a body. Verifier.Reply publishes it through JetStream on
//
//	sluice.result.{queue}.{ticket}
//
// with Nats-Msg-Id "result.{ticket}", Sluice-Result-Status, Sluice-Result-Truncated
// ("true" when the body was cut), Sluice-Result-H-{Name} for each header value, the body
// as data, and Sluice-Result-Signature ("v1=" + base64 HMAC-SHA256 under the delivery
// key of the queue, over queue, ticket, status, truncation, headers and body). The
// bounds: MaxResultBody body bytes (Reply cuts a longer body and marks it truncated),
// MaxResultHeaderValues header values of MaxResultHeaderBytes bytes in all, canonical
// header names, no CR, LF or NUL in values.
//
// sluice's dispatchers keep these in the stream SLUICE_RESULTS (created when a
// dispatcher of a nats: queue starts; until then Reply fails with no stream) and write
// each into its ticket's record: GET /sluice/v1/deferred/{ticket} then shows status
// "done" with the result's status code, the headers the queue keeps in results
// (Content-Type, Content-Length, Location, Etag, Retry-After and its result_headers;
// never Set-Cookie) and the body. A result is written only if it verifies under its
// queue's delivery key, its queue is a nats: queue, and its ticket is done after its
// delivery; the first result of a ticket stays, later ones are dropped (and the stream
// refuses a second one while the first waits). A result that comes before the ticket's
// done record is retried for about twenty seconds. The result stream keeps a result at
// most 24 hours.
//
// On a NATS server with permissions, a consumer of queue Q needs publish on
// sluice.result.Q.> and $JS.API.> answers on _INBOX.> (see deploy/nats/accounts.conf).
package subscriber
