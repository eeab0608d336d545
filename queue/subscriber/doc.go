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
//	                           queue's drop_headers are never kept; the client's
//	                           Idempotency-Key is, as sent: it is both
//	                           Sluice-Idempotency-Key and Sluice-H-Idempotency-Key)
//	Sluice-Delivery-Signature  "v1=" + base64 HMAC-SHA256 of all the above and the
//	                           body, under the queue's delivery key (byte by byte: see
//	                           Signatures, byte by byte)
//
// Other headers (tracing headers, for example) may be present and are not covered by
// the signature. sluice's internal Sluice-Signature and Sluice-Callback never leave it.
//
// Encode writes such a message and Decode reads it (ReadOrder, then Order.Check of its
// shape); sluice parks and forwards its orders with the same two, so there is one wire
// format, and Decode(Encode(o)) is o (FuzzEncodeDecode).
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
// # Signatures, byte by byte
//
// A worker in any language checks orders and signs results from this section alone
// (testdata/verify.py does, and TestSignaturesFromTheSpecification runs it). Every
// signature is an HMAC-SHA256 over a list of byte strings, the first a domain label,
// each written as its length in 8 bytes (unsigned, big endian) and then its bytes:
//
//	MAC(key, domain, f1, …, fn) = HMAC-SHA256(key, u64be(len(domain)) ‖ domain ‖ u64be(len(f1)) ‖ f1 ‖ … ‖ u64be(len(fn)) ‖ fn)
//
// A signature header's value is "v1=" and the standard base64 (with padding) of the 32
// bytes; compare in constant time.
//
// The delivery key of queue Q is MAC(signingKey, "sluice delivery key", Q): 32 bytes,
// which `sluice queue delivery-key Q` prints in standard base64.
//
// Sluice-Delivery-Signature = MAC(deliveryKey, "sluice delivery", fields…), the fields,
// in this order, the values of the headers of the delivered message (UTF-8 bytes as
// received; an absent header is the empty string, except as noted):
//
//	Sluice-Ticket, Sluice-Queue, Sluice-Rule, Sluice-Method, Sluice-Path, Sluice-Query,
//	Sluice-Received-At (absent: "0001-01-01T00:00:00Z"), Sluice-Client,
//	Sluice-Idempotency-Key, Sluice-Fingerprint,
//	then the kept headers: u64be(count of names) as an 8-byte field, then for each name
//	in byte order: the name (the part after "Sluice-H-"), u64be(count of its values)
//	as an 8-byte field, and each value in the order received,
//	then the message data (the body).
//
// (sluice writes Sluice-Received-At in UTC with the fewest fractional digits, as Go's
// RFC 3339 with nanoseconds does, and kept header names in Go's canonical form, so the
// received bytes are what it signed.) The subject is not covered.
//
// Sluice-Result-Signature = MAC(deliveryKey, "sluice result", Q, ticket, status in
// decimal, "true" when truncated (the header Sluice-Result-Truncated: true) else "false"
// (the header absent: sluice refuses any other value), the result's headers encoded as
// the kept headers above (names after "Sluice-Result-H-"), the body).
//
// A worked example, with the signing key the 32 bytes 00 01 02 … 1f and queue "orders":
//
//	delivery key   6e1288ba6fa11e0c26e563a50d711eabea37157e30e399832b4d82a097bcd069 (hex)
//	order headers  Sluice-Ticket: abcdefghijklmnopqrstuvwxyz
//	               Sluice-Queue: orders
//	               Sluice-Rule: create-order
//	               Sluice-Method: POST
//	               Sluice-Path: /v1/orders
//	               Sluice-Query: n=1
//	               Sluice-Received-At: 2026-12-01T09:30:00.5Z
//	               Sluice-Client: c1
//	               Sluice-Fingerprint: ff
//	               Sluice-H-Content-Type: application/json
//	body           {"n":1}
//	MAC input      000000000000000f "sluice delivery" 000000000000001a "abcdefghijklmnopqrstuvwxyz"
//	               0000000000000006 "orders" 000000000000000c "create-order" 0000000000000004 "POST"
//	               000000000000000a "/v1/orders" 0000000000000003 "n=1"
//	               0000000000000016 "2026-12-01T09:30:00.5Z" 0000000000000002 "c1"
//	               0000000000000000 (no idempotency key) 0000000000000002 "ff"
//	               0000000000000008 0000000000000001 (one header name)
//	               000000000000000c "Content-Type" 0000000000000008 0000000000000001 (one value)
//	               0000000000000010 "application/json" 0000000000000007 {"n":1}
//	signature      v1=ic73x5csh8JoxZg+B+teIUC6iQwI0aeJ27LThtDsfT0=
//	result         status 201, Location: /orders/1, body "ok", not truncated
//	its signature  v1=n1qQmG8DVMioon8KFDZVeYTqxFP8iTF7z21UIhWYFDg=
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
// On a NATS server with permissions, a consumer of queue Q whose subject a stream S
// captures needs: publish on sluice.result.Q.> (results), $JS.API.STREAM.INFO.S,
// $JS.API.CONSUMER.CREATE.S.>, $JS.API.CONSUMER.INFO.S.>, $JS.API.CONSUMER.MSG.NEXT.S.>
// and $JS.ACK.S.> (a durable pull consumer), and subscribe on its reply prefix (or on
// the subject itself, for a core subscription). The user worker of
// deploy/nats/accounts.conf has exactly these for the queues of deploy/, with the reply
// prefix _INBOX_worker (nats.CustomInboxPrefix): in sluice's account _INBOX.> carries
// sluice's own replies, pulled parked orders among them.
package subscriber
