// Package ingress is sluice's HTTP front door: middleware that checks each request
// against the active rules and either lets it through, rejects it with 429 and the
// headers that say when to come back, or hands it to a queue; and the reverse proxy and
// admin endpoints that `sluice serve` is made of.
//
// # Ingress
//
//   - Headers on every response of a limited route: `X-Ratelimit-Limit`,
//     `X-Ratelimit-Remaining`, and the IETF fields of draft-ietf-httpapi-ratelimit-headers-11,
//     `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=42;t=17`, written by
//     `limiter/ratelimitheader`, the codec `dispatcher/pace` reads them with. When several limits apply they describe the one closest to
//     running out (fewest remaining, then longest wait). Policy names are rule names, never
//     request values.
//   - 429: `Retry-After` and `X-Ratelimit-Retry-After` in whole seconds, rounded up,
//     `Cache-Control: no-store`, and an `application/problem+json` body (RFC 9457) of type
//     `https://iana.org/assignments/http-problem-types#quota-exceeded` with
//     `violated-policies`, `limit` and `retry-after`.
//   - Most restrictive wins: every check of the route is decided; any rejecting rule
//     over its limit rejects; otherwise a deferring rule over its limit defers; shadow rules
//     are only counted and logged. (Every limit of every check is charged, as Envoy's rate
//     limit service does, so a request rejected by one limit still used quota of the others.)
//     One engine, package ingress/decide, makes these decisions for the front door, the
//     check endpoint and both Envoy services (ingress/envoy).
//   - Client identity: the connection's peer address (on a connection from a
//     `--proxy-protocol` load balancer, the address its PROXY header names), unless it
//     is a trusted proxy (`--trusted-proxies`); only then is the header those proxies write read
//     (`--forwarded-header`: `X-Forwarded-For` by default, or `Forwarded`, RFC 7239, quoted
//     IPv6 included), right to left, and the first address that is not a trusted proxy is
//     the client. The other header is never read: a proxy that appends to one passes a
//     client's own copy of the other through, and believing it would let the client pick
//     its address (a fresh limit per request). A forged header from an untrusted peer
//     changes nothing. The same holds on the HTTP check and Envoy's ext_authz. IPv6
//     clients are grouped by `--ipv6-prefix` (default /64). Logs name clients by a hash.
//   - Upstream: `sluice serve` forwards allowed requests to `--upstream` over its own
//     pool of keep-alive HTTP/1.1 connections (`ingress.NewProxy`; the middleware stays a
//     plain `http.Handler` for library users). Bodies are streamed both ways: request bodies
//     go to the upstream as they arrive (still capped by `--max-body`, 413 beyond), responses
//     reach the client as the upstream sends them (a 64 MiB response is never held whole).
//     Hop-by-hop headers are dropped both ways; `X-Forwarded-For`, `-Host` and `-Proto` are
//     set from the real connection (a trusted proxy's chain is kept, from the header
//     `--forwarded-header` names: with `forwarded`, its `for=` addresses, `unknown` for a
//     hop that names none), a client's `Forwarded` and `Sluice-Ticket` are dropped (only
//     deliveries of parked orders carry a `Sluice-Ticket`, the dispatcher's), and the Host
//     header is the client's. Trailers and `Expect: 100-continue` pass through (a refused body is never
//     read); WebSocket and other `Upgrade` requests are proxied through
//     `httputil.ReverseProxy`, but an offer of `h2c` never reaches the upstream (which could
//     switch the connection to HTTP/2 and carry requests no rule decided): a request
//     offering only it is proxied as an ordinary HTTP/1.1 request, without `Upgrade` and
//     `HTTP2-Settings`, as a server without h2c answers it (RFC 9113 deprecated the
//     upgrade). A client that goes away cancels the upstream request. The upstream has
//     60 s to begin its response (504 after); an unreachable one is 502, both as
//     `application/problem+json`. A connection goes back to the pool only when the response just read
//     ended exactly where its framing says, nothing is buffered beyond it, and nothing
//     arrives while it idles (a read watches each idle connection, and a request is never
//     written on one with unread bytes). Responses whose end cannot be checked never have
//     another request follow on their connection: HTTP/1.0 ones, `Connection: close`,
//     bodies that end with the connection, and a HEAD, 204 or 304 announcing a length.
//     `Content-Length` with `Transfer-Encoding` (RFC 9112 §6.3), differing lengths,
//     transfer codings other than chunked, malformed chunks or header lines, a response
//     head over `--max-upstream-header` and an unasked-for 101 are 502, the connection
//     closed. An upstream seen sending bytes nobody asked for has no connection kept alive
//     for a minute. The one case no check catches by default is a stray response arriving
//     after the next request was already written on that connection: it looks like that
//     request's answer to any HTTP/1.1 client. In `TestDifferentialHostileUpstreams` (8
//     clients, 96 requests, strays 5 to 50 ms after a response) sluice misdelivered 8 to 12
//     of those against net/http's 53 to 59 (2026-12-01), and none in every other hostile
//     case; with `--upstream-reuse-after 1s`, none. A request that may be repeated is
//     retried once on a fresh connection when the upstream closed a kept-alive one; one
//     held in the front door longer than `--upstream-max-hold` is never sent. HTTPS upstreams are spoken over
//     HTTP/1.1; 1xx responses other than 100 are dropped.
//   - Defer: the request (method, path, query, headers without hop-by-hop ones and the
//     queue's `drop_headers`, body) is published to its queue; only after JetStream's acknowledgement does the
//     client get 202, `Location: /sluice/v1/deferred/{ticket}` and `{ticket, queue, status,
//     position, estimated_delivery}`. `Idempotency-Key` (a structured-field string, or a bare
//     token) is scoped per caller: the client's address group and a hash of its
//     credentials (the route's `idempotency_scope`, by default `Authorization` and `Cookie`;
//     only the hash is stored). Same caller, key and payload → the same ticket, delivered
//     once, and the answer says the order's status (`queued`, `done`…); other payload → 422;
//     malformed → 400. Other callers behind one address never share a ticket, see each
//     other's results, or block each other's keys. A key is taken only by an accepted
//     order: a request refused with 400, 413, 422, 429 or 503 leaves nothing, so the key works
//     again. A keyed order's ticket is derived from the key (an HMAC with the signing key),
//     its key slot is taken (in the NATS servers' memory, never waiting for a disk: a slot
//     only counts the key against the cap below, so a restart of the servers, a crash or
//     a power cut included, only lets the callers start their counts afresh — every
//     accepted order and its key are kept; a server without memory streams keeps the slots
//     on file, with a warning), then the order is written and synced; while the order waits its message
//     is the key's record, and the key is written to the key-value bucket when the order
//     becomes final. While it waits, a repeat finds it in the queue it was parked in: a
//     route with defer rules into two queues that sends the repeat to the other one parks
//     it there too; and a client that uses a key again after it expired gets the same
//     ticket for the new order. Key lifetime: from acceptance until the order is final (done, failed or
//     dead), then for the queue's idempotency TTL (24 h, at least its `max_age`) — a key is
//     never forgotten while its order waits. Ticket records live the idempotency TTL after
//     their last change. Caps: per caller and queue, at most `max_idempotency_keys` keys
//     accepted within the idempotency TTL (each slot frees that long after its key was
//     accepted; counted afresh after a restart of the NATS servers, see above); past it 429
//     with `Retry-After` and a problem body naming the cap. All keys together:
//     `--idempotency-max-bytes` (default 256 MiB, about 370 bytes a key; each queue's slots
//     also hold at most that much of each NATS server's memory, 640 bytes a slot); new keys
//     past 90% of it get 503 with `Retry-After` and nothing is accepted (the rest is kept for
//     refreshing existing keys). Requests without a key are not affected by either cap. A
//     full queue → 429 with `Retry-After` from its depth and outflow, naming the limit:
//     `max_depth`, `max_bytes`, or `tenant_max_depth` for one tenant's lane (other
//     tenants' orders are still taken); NATS unreachable or no
//     acknowledgement in time → 503 with `Retry-After`, never a 202. Deferred requests carry
//     the forwarding headers a proxied one gets: `X-Forwarded-For` from the connection (a
//     trusted proxy's chain kept, from the `--forwarded-header`), `X-Forwarded-Host`/`-Proto`
//     from the request; a client's `Forwarded`, forged `X-Forwarded-*` and `Sluice-Ticket`
//     are dropped (the delivery's `Sluice-Ticket` is the dispatcher's).
//     On a route that can defer, a request within its limits whose key names an order
//     accepted in the route's deferring queue (that of its first defer rule whose queue
//     has a `max_delay`, else of its first defer rule) is answered as a repeat of it (202 with the same ticket and `"duplicate": true`, or 422 for another
//     payload) and is not proxied, so that the downstream never gets one order by two
//     paths. It is proxied when the order is in another queue, when its body is chunked
//     or larger than that queue takes or does not fit in `--defer-memory`, and while NATS
//     cannot be asked; a key no order holds is proxied too, and the upstream sees the
//     client's key. So "once" means once per `Idempotency-Key` as the downstream can tell:
//     a redelivery after a crash carries the same key.
//   - Ticket status: `GET /sluice/v1/deferred/{ticket}` → `queued`, `delivering`,
//     `done`, `failed`, `dead` or `cancelled`, `attempts` (the delivery attempts tried,
//     the last included: 1 for an order delivered at its first; pauses on 429/503 or an
//     open circuit, attempts that reached no downstream and redeliveries after a crash do
//     not count; the same in events and callbacks), last error (the kind of
//     failure, such as `delivery failed: connection refused`, never the downstream's URL or
//     address: those go to the dispatcher's log with the ticket), `Retry-After` while not final,
//     and once done the downstream's status, allow-listed headers (`result_headers`) and body
//     (64 KiB at most). The ticket
//     (128 random bits) is the capability to read it; unknown tickets are 404.
//   - Waiting for the result: with `Prefer: wait=30` (RFC 7240) the ticket status is
//     answered as soon as it is final, or after 30 s (at most `--max-wait-preference`)
//     with the status then and `Retry-After`, and carries `Preference-Applied: wait=30`.
//     With `Accept: text/event-stream` it is a stream of server-sent events:
//     `retry: 1000`, then one `status` event per change (`id:` the status, `data:` the
//     status JSON) until the final one, after which the stream closes; an EventSource
//     that reconnects with the final status as `Last-Event-ID` gets 204 and stops. The
//     202 says both are offered (`"monitor_wait": 60, "monitor_events": true`). Each
//     client may have `--max-waits-per-client` open (100; all clients together
//     `--max-waits`); past it a wait is answered at once without `Preference-Applied` and
//     a stream is 429. Waiting costs NATS nothing per client: a ticket with waiters is
//     read when its record changes (one watch of the ticket records per process) and
//     every 5 to 30 s otherwise, its waiters sharing the reads; 1,000 waiters cost about
//     40 kB each (RSS, TestThousandWaitersThroughTheBinary). A shutdown answers open
//     waits at once; `sluice_ticket_waits` counts the open ones. Go programs use
//     `ticket.Wait(ctx, base+monitor)` from package ingress/ticket (standard library
//     only).
//   - Cancel: `DELETE /sluice/v1/deferred/{ticket}` on the front door. While the order
//     is `queued`: 204, it is removed from its queue, never delivered, and its status says
//     `cancelled` (an event goes to `sluice.done.{queue}`); again: 204. `delivering` or
//     final: 409; unknown: 404. A dispatcher that took the order in the same instant decides
//     with a compare-and-set on the ticket record: if that is not settled within 5 s the
//     answer is 503 with `Retry-After: 1`, and asking again gives 204 or 409. The ticket is
//     the capability, as for its status; an idempotent repeat of a cancelled order gets
//     the cancelled ticket back.
//   - Bad input: a body over `--max-body` is 413 with a problem body, also when it
//     arrives chunked; a deferred body over what its queue can store (the smallest of
//     `--max-body`, the queue's `max_body`, its `max_bytes` and the NATS server's max
//     payload, less the request's headers) is 413 naming the limit, before a byte is read
//     when `Content-Length` says so, else as soon as the body passes it (a body that can
//     never fit in `max_bytes` is 413, not 429). A deferred request whose headers as
//     stored (each name prefixed `Sluice-H-`, plus sluice's own) exceed JetStream's 64 KiB
//     header limit, the NATS server's max payload or the queue's `max_bytes` gets 431
//     naming the limit, before its body is read, and nothing is stored. Neither the 413
//     nor the 431 carries `Retry-After`: the same request can never be stored. The same
//     holds on Envoy's ext_authz. Deferred bodies held at once are capped by
//     `--defer-memory` (503 with `Retry-After` past it, nothing accepted). The answer is
//     sent at once; the rest of the body is then read and discarded (up to `--max-body`),
//     so that a client still sending it sees the answer instead of a reset connection; header values that select a counter are hashed into keys, never
//     stored; the memory store's key cap bounds a flood of distinct keys.
//   - Operations on `--admin-listen`: `/metrics` (below), `/healthz` (the process
//     runs), `/readyz`, `/sluice/v1/rules` (the active rules as JSON) and
//     `/sluice/v1/status`, the queue API (deploy/README.md) and `/sluice/v1/openapi.json`,
//     all but `/healthz` behind `--admin-token` when set (401 without it; 429 with
//     `Retry-After` for an address, or an IPv6 /64, that keeps guessing it: 10 wrong tokens, then one every 6 s;
//     the scheme `Bearer` is read without case). Server
//     timeouts are all set; SIGINT/SIGTERM turn `/readyz` to 503 at once, finish the
//     requests under way and the deliveries under way, and close the admin listener last.
//   - `/readyz` is about this replica only: 200 while its rules are loaded, its
//     listeners are up and it is not shutting down; 503 otherwise (`{"ready":false,
//     "failures":{…}}`). Redis and NATS are not part of it: their outage is every
//     replica's at once, and the front door still serves (limits fall back per
//     `failure_mode`, defers answer 503), so it must not take every endpoint out.
//   - `GET /sluice/v1/status`: the shared dependencies as this process sees them, each
//     checked when asked (a round is reused for 1 s) and bounded by a 2 s timeout, also
//     when the server hangs:
//
// ```json
// {"ready": true,
// "dependencies": {
// "redis": {"state": "down", "since": "2026-11-30T08:10:02Z", "checked_at": "2026-11-30T08:10:09Z",
// "last_error": "context deadline exceeded", "last_error_at": "2026-11-30T08:10:09Z",
// "detail": {"limiter_fallback": true, "fallback_decisions": 412,
// "failure_modes": {"local": 3, "closed": 1}}},
// "nats":  {"state": "up", "since": "…", "checked_at": "…",
// "detail": {"server": "nats://10.0.0.5:4222", "embedded": false, "queues_declared": true}}}}
// ```
//
// `state` is `up`, `degraded` (answers, but not everything works: Redis answers while
// the limiter still decides without it until its next probe; NATS connected while
// JetStream does not answer or the queues are not all declared) or `down` (no answer
// within the timeout, not connected); `since` is when that state was first seen;
// `last_error` (passwords of the flags masked) stays after recovery. For Redis,
// `limiter_fallback` says whether decisions are being made without it, and
// `failure_modes` how many limits of the rules fall back `local`, `open` or `closed`.
// `ready` is what `/readyz` says. Each state change is logged once.
//
// Metrics (base units, bounded labels; never keys or addresses):
// `sluice_decisions_total{rule,outcome}` (allowed, rejected: answered 429, deferred:
// parked, so a defer rule over its limit on an entry point that cannot park counts
// rejected; shadow_rejected, error, and quota_exhausted: a `quota_mode` rule over its limit on a request another
// quota still had room for, only quota rules have it; waited: an `on_limit: wait` rule
// held the request, then let it go, only wait rules have it; every rule's series start at 0),
// `sluice_decision_duration_seconds`,
// `sluice_limiter_fallback_total{mode}`, `sluice_rules_reload_total{result}`,
// `sluice_dependency_up{dependency}` (1 while `redis` / `nats` is up, checked at each
// scrape like `/sluice/v1/status`) and `sluice_dependency_state{dependency,state}`,
// `sluice_upstream_requests_total{class}`, `sluice_upstream_duration_seconds{class}`,
// and the queue and dispatcher metrics below.
//
// As a library: `mw, err := ingress.New(rulesSource, limiter, opts…)`, then
// `mw.Wrap(next)`, is `net/http` middleware; `ingress.NewProxy(upstreamURL, …)` the
// reverse proxy it fronts. Constructors refuse bad option values with an error (never a
// panic, never a silent default); several middlewares, proxies and Envoy services may
// register on one Prometheus registry and then share its series. To defer, add
// `ingress.WithDeferrer(deferral.New(store, deferral.WithLogger(log)))` (package
// `ingress/deferral`, on a `queue.Store`) and serve its `StatusHandler` and
// `CancelHandler` under `deferral.Path`. Without it the middleware links no NATS: a
// program of the middleware on the memory store, rules loaded once (`rules.Load`), is
// 13.1 MiB (9.0 MiB with `-ldflags=-s -w`), against 12.1 MiB (8.3 MiB) for the same
// handler on `x/time/rate` with client_golang (`go test -run TestLightMiddleware -v
// ./ingress`). Runnable examples: `go doc` the `Example` functions of `limiter`,
// `ingress`, `dispatcher` and `queue`.
package ingress
