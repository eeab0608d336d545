// Package rules is sluice's rules model: it parses and validates rules files, compiles
// them for the request path, matches HTTP requests to routes and descriptors, and keeps
// the active set current as files change.
//
// A rules file is YAML in the format of the Envoy / Lyft rate limit service (domain,
// nested descriptors of key and optional value, wildcard values with * anywhere,
// rate_limit with unit, unit_multiplier and requests_per_unit, unlimited, name,
// replaces, shadow_mode, quota_mode, detailed_metric, value_to_metric,
// share_threshold, metadata), which loads unchanged and means the same (Differences
// from envoyproxy/ratelimit, below, lists what still differs), plus sluice's
// extensions: per-descriptor algorithm, burst, window, several limits (rate_limits),
// on_limit reject, defer or wait (see Waiting), queue and failure_mode; routes that
// turn requests into descriptors; and queues. The sections below document every field
// and default.
//
// Load (or Parse) returns an immutable *Set, or every problem at once as Problems.
// Set.Match gives the route a request takes and the Checks it must pass, each with its
// rule (limits, on_limit, queue, shadow mode) and its limiter keys. A watch.Watcher
// (package rules/watch) keeps the current Set of some files and swaps in valid new
// versions atomically.
//
// # Quota mode
//
// A descriptor with `quota_mode: true` (Rule.Quota) is one of several quotas a
// request may use, as in Envoy's rate limit service: over its limit it does not deny
// the request by itself. The request is denied when every quota-mode rule it reaches
// is over its limit, or when any rule without quota mode is; otherwise it passes,
// even with some of its quotas exhausted. For three requests reaching a quota of 1
// per minute and one of 2 per minute (envoyproxy/ratelimit's example file): the
// first passes with both counted, the second passes on the second quota (the first
// is exhausted), the third is denied. Each quota rule reached is decided, and
// charged, exactly as a rule without quota mode; only how its decision combines
// with the others differs.
//
// What an exhausted quota reports: over gRPC (package ingress/envoy) its
// descriptor's status is OVER_LIMIT with limit_remaining 0 while the overall code is
// OK; over HTTP (the front door, the checks for nginx and Traefik, ext_authz) the
// rate-limit headers describe the limit closest to running out, so an exhausted quota
// shows X-Ratelimit-Remaining: 0 on a request that passed. The decision metrics count
// it with the outcome quota_exhausted. When every quota is exhausted, each counts as
// rejected (or deferred, for a defer rule; shadow_rejected under --shadow), the 429
// names them all in violated-policies, and Retry-After is the shortest of their
// waits, since the request passes again once any one of them has room (and only
// once every rule without quota mode allows it: the longest of theirs).
//
// Rules that Envoy leaves out of the count are left out here: unlimited ones (Rule.Quota
// is false), a descriptor reaching no rule, and a rule another replaces. A quota rule
// in shadow mode is never exhausted (Envoy reports it OK), so while a request reaches
// one, its quotas never deny it. A `limit` override sent in an RLS request is counted
// without quota mode, as Envoy counts it. quota_mode on a descriptor without a
// rate_limit has no effect (as shadow_mode there). The service-wide switch of Envoy
// (QUOTA_MODE, every descriptor in quota mode) has no counterpart.
//
// # Waiting
//
// A descriptor with `on_limit: wait` shapes rather than refuses, as nginx's
// `limit_req burst=N` without `nodelay` does, but shared by every replica: a request
// is held until its paced slot comes and then forwarded. The rule's one limit gives
// the pace: a leaking bucket with a slot every period/requests_per_unit (10 per
// second: every 100ms), per rule and key. Each request reserves the next free slot
// (GCRA's theoretical arrival time, limiter.Reserver): one that is free now passes
// at once, a later one is held until it starts, so requests of one key leave in the
// order they reserved (two whose slots are closer than the timers' lateness may
// swap) and at most ceil(rate × Δt) + 1 of them start in any interval Δt. Fields:
//
//   - max_wait (required, positive, at most 30s: a held request's body is read after
//     the hold, within the front door's read timeout): the longest a request is
//     held. A request whose slot would start later takes no slot and falls back to
//     then at once.
//   - then: reject (the default: 429, Retry-After the time until a slot is within
//     max_wait) or defer (parked in queue, 202, as a defer rule; it needs a queue).
//   - max_waiting (default 1000): the most requests the rule holds at once in one
//     process; past it the fallback comes at once, without taking a slot. It is
//     counted per replica, also with --redis (the slots are shared, this count is
//     not): N replicas hold up to N × max_waiting requests of the rule. A count
//     shared through Redis would cost a write when a request is held and another
//     when it leaves, and a replica that dies holding requests would leave its
//     count behind; the memory it guards is per process anyway. With --redis the
//     requests held for one key are bounded cluster-wide all the same, by max_wait:
//     at most max_wait/interval + 1 slots of the key lie ahead.
//
// One limit only, no burst and no quota_mode: the slots are even, and max_wait bounds
// how many wait (max_wait/interval + 1 per key). The other rules decide first; a slot
// is reserved only for a request that they all allow. A request that reaches several
// wait rules takes a slot of each and leaves at the latest of them, so the pace and
// order guarantees hold for one wait rule per request: give a route one. A request
// that passed a wait rule carries `Sluice-Waited` in its response: the seconds it was
// held to the millisecond ("0.84"; "0" for none), the wait the store computed when
// the slot was reserved (on the Redis server's clock with --redis, so replicas
// agree), not a measurement. Its actual start is later by the time to read the
// store's answer and the timer's lateness (a millisecond or so on an idle machine). A
// client that goes away while held frees its place, and gives its slot back: when no
// later slot has been reserved the next request takes it; otherwise it stays taken
// and is skipped (the outflow has a gap of one interval), since giving it again could
// put two requests in one slot. A held request's body is not read while it waits: it
// stays in the connection and is streamed to the upstream (or read into the
// deferred-body memory budget by then: defer), so holding costs a goroutine and a
// timer, not the body. With --redis the buckets live in Redis (one script per
// reservation, the server's TIME, hash-tagged keys with a TTL until the last slot),
// so every replica paces one outflow; without it each process paces its own. When
// Redis fails, the rule's failure_mode applies (local: reserve in memory; open: pass
// at once; closed: then).
//
// The check endpoints (the HTTP check for nginx and Traefik, Envoy's ext_authz)
// cannot hold the request they are asked about (the proxy's own timeout would pass
// first): a request whose slot is free passes, one that would wait is answered 429
// with Retry-After the wait rounded up to whole seconds, its slot given back, and one
// that cannot wait gets then. Envoy's rate limit service (gRPC) has no way to say
// "wait" and decides the rule as its limit would (OVER_LIMIT past it). In shadow
// mode, or on a limiter store that cannot reserve, a wait rule decides with its limit
// and never holds (over it: shadow_rejected, or then). Decisions count with the
// outcome waited (held, then forwarded), allowed (slot free), rejected or deferred
// (the fallback).
//
// # One value per limit key
//
// A descriptor whose value comes from a header or a query parameter takes exactly
// one value, and so does a header that a route's match compares with a value (it
// chooses the route, and with it the limits). Set.Repeated reports a request that
// gives more, and the front door (HTTP middleware, the HTTP check for nginx and
// Traefik, Envoy's ext_authz) refuses it with a 400 problem naming the header or
// parameter, deciding nothing: a header sent on more than one field line, a header
// whose value holds a comma (a list in one line, and how Envoy's ext_authz reports a
// header sent twice), except the headers whose one value has commas by its syntax
// (User-Agent, Authorization, Proxy-Authorization, Cookie, Date, If-Modified-Since,
// If-Unmodified-Since, If-Range) and a match header compared with a value holding a
// comma, and a query parameter present more than once, empty occurrences included.
// Combining the values into one key was the alternative, and it is refused: a client
// that sends a random value and then the victim's would still be counted on a fresh
// key on every request, while an upstream that reads the last value, or all of them,
// serves the victim. Refusing costs nothing to a client that sends one value.
//
// # Rules
//
// Rules say who may do what, how often, and what happens over the limit. They are YAML
// files: each file is one domain; `sluice` loads a list of files and directories (a
// directory: every `*.yaml` / `*.yml` directly in it, in name order, names starting with a
// dot skipped). A rules file written for the Envoy / Lyft rate limit service loads
// unchanged and means the same thing; sluice adds limit algorithms, several limits per
// descriptor, deferral into queues, and `routes` that turn HTTP requests into descriptors.
//
//	sluice rules check deploy/rules                 # every problem as FILE:LINE:COL: message; exit 1 if any
//	sluice rules check deploy/rules --explain POST /v1/orders -H 'X-User-ID: 42' --ip 203.0.113.7
//
// # A complete annotated example
//
// Every field, with its default. Only `domain` is required; an Envoy file uses `domain`,
// `descriptors`, `key`, `value`, `rate_limit` (`unit`, `unit_multiplier`,
// `requests_per_unit`, `unlimited`, `name`, `replaces`), `shadow_mode`, `detailed_metric`,
// `value_to_metric`, `share_threshold` and `metadata`, and nothing else. What still
// differs from envoyproxy/ratelimit is listed in
// Differences from envoyproxy/ratelimit.
//
//	domain: shop                 # required, unique across the loaded files (unless
//	                             # --merge-domains); namespaces keys
//	shadow_mode: false           # true is refused: Envoy ignores it here and enforces every
//	                             # rule. Shadow each descriptor, or run with --shadow
//
//	descriptors:                 # the Envoy descriptor tree
//	  - key: route               # required
//	    value: orders            # optional. Absent: matches every value, each value with its
//	                             # own counter. With *: a pattern, each * any run of
//	                             # characters (none included): foo*, bar*b, *.example.com,
//	                             # /api/*/action; each matching value has its own counter
//	                             # unless share_threshold (below)
//	    descriptors:             # nested: the next entry of a request's descriptor list
//	      - key: user
//	        rate_limit:          # one limit, Envoy style
//	          unit: second       # second | minute | hour | day (Envoy also: week, month = 30
//	                             # days, year = 365 days; any case), or instead of unit
//	                             # window: 30s (any duration: 250ms, 10m, 1h30m, 7d)
//	          unit_multiplier: 1 # the period is this many units (Envoy; at least 1)
//	          requests_per_unit: 5   # the limit per unit; 0 lets nothing through (Envoy's
//	                             # block list; only without sluice's fields)
//	          name: orders_per_user  # optional: what replaces refers to, and the rule's name
//	                             # in logs, metrics and RateLimit-Policy
//	          unlimited: false   # true: always allowed (then no unit)
//	        # sluice's fields, all optional:
//	        algorithm: token_bucket  # default fixed_window, as Envoy counts. Also
//	                             # leaky_bucket, sliding_window_log, sliding_window_counter
//	        burst: 20            # bucket size of token_bucket / leaky_bucket (default:
//	                             # requests_per_unit); an error on the window algorithms
//	        failure_mode: local  # when the shared store (Redis) fails: local (decide in memory
//	                             # with the same limit; default), open (allow), closed (reject)
//	        on_limit: defer      # over the limit: reject (429 with Retry-After; default) or
//	                             # defer (park in queue, answer 202 Accepted, deliver later)
//	        queue: orders        # required with defer and only with defer
//	        shadow_mode: false   # true: computed, counted and logged, never enforced
//	        detailed_metric: false  # accepted for Envoy; sluice never puts request values in
//	                             # metric labels, so it only marks the rule (Rule.DetailedMetric)
//	        value_to_metric: false  # accepted for Envoy (there: the request's value in the
//	                             # stat name); no effect here, labels stay rule names
//	        metadata: {backend: orders-a}  # Envoy's per-descriptor metadata (a mapping of any
//	                             # YAML values), which Envoy's service returns when the
//	                             # descriptor is under its limit; kept on the rule
//	                             # (Rule.Metadata) for the gRPC service, never in logs or labels
//	        quota_mode: false    # Envoy's quota mode: over its limit this descriptor alone
//	                             # does not deny; the request is denied when every quota-mode
//	                             # descriptor it reaches is over its limit (or any other rule is)
//
//	  - key: plan
//	    value: gold
//	    descriptors:
//	      - key: user
//	        rate_limit:
//	          unit: second
//	          requests_per_unit: 50
//	          replaces:          # when this rule and orders_per_user both match one
//	            - name: orders_per_user   # request, orders_per_user is not checked
//	        on_limit: defer
//	        queue: orders
//
//	  - key: route
//	    value: files/*
//	    share_threshold: true    # every value this wildcard matches counts on ONE counter
//	                             # (Envoy's share_threshold; only on a value with *)
//	    rate_limit: {unit: minute, requests_per_unit: 100}
//
//	  - key: client_ip
//	    name: per_ip             # name and replaces may also sit on the descriptor beside
//	                             # rate_limits or sluice's fields; beside a plain Envoy
//	                             # rate_limit they are refused (Envoy ignores them there)
//	    rate_limits:             # several limits on one descriptor: all must allow
//	      - {unit: second, requests_per_unit: 20, algorithm: sliding_window_log, forgive_rejected: true}
//	      - {window: 10m, requests_per_unit: 3000, algorithm: sliding_window_counter}
//	      # An entry: unit or window, requests_per_unit (at least 1), and optionally
//	      # algorithm, burst, failure_mode, forgive_rejected (sliding_window_log only: do not
//	      # record rejected requests). The descriptor's own algorithm, burst, failure_mode
//	      # and forgive_rejected are the defaults of its entries. At most 8 entries, no two
//	      # with the same algorithm and window.
//
//	  - key: client_ip
//	    value: 198.51.100.66     # the exact value wins over the key without value
//	    rate_limit: {unit: second, requests_per_unit: 0}
//
//	routes:                      # how an HTTP request becomes descriptors of this domain
//	  - name: create-order       # required, unique across the set; letters, digits, _ . : -
//	    match:                   # optional; every condition given must hold
//	      method: [POST]         # a list or one method; default any
//	      host: shop.example.com # case-insensitive, port ignored; *.example.com: subdomains
//	      path: /v1/orders       # exact path; or path_prefix: /v1/orders (covers
//	                             # /v1/orders and /v1/orders/…, not /v1/orders-old); or
//	                             # path_pattern: /v1/orders/{id} ({name}: one whole segment)
//	      headers:               # the header's first value; name Host is the request host
//	        - {name: X-Tenant, value: gold}    # equal to (case-sensitive)
//	        - {name: X-Debug, present: false}  # present: true / false
//	    descriptors:             # a list of descriptor lists; each is checked
//	      - [{key: route, value: orders}, {key: user, from: "header:X-User-ID"}]
//	      - [{key: plan, from: "header:X-Plan"}, {key: user, from: "header:X-User-ID", default: anonymous}]
//	      - [{key: client_ip, from: client_ip}]
//	      # An entry is {key, value} (a constant) or {key, from}, from one of
//	      #   header:NAME   the header's first value
//	      #   query:NAME    the query parameter's first value, URL-decoded
//	      #   client_ip     the client address (the ingress's, trusted-proxy aware)
//	      #   path:{name}   a {name} segment of the route's path_pattern
//	      #   method        the request method
//	      #   host          the request host, lower case, without port
//	      # and optionally default: VALUE, used when the request has none.
//	    idempotency_scope: [header:X-Api-Key]  # optional: what tells callers apart for
//	                             # Idempotency-Key, beside their address group; same
//	                             # sources as from:, every value of a header counts
//	                             # (default: [header:Authorization, header:Cookie])
//
//	queues:                      # where defer rules park requests; shared by all files
//	  orders:                    # name: letters, digits, _ and -, at most 64
//	    outflow: {rate: 50/s}    # required: N/s, N/minute, N/10m …; also
//	                             # {unit: second, requests_per_unit: 50}, or just 50/s.
//	                             # Shared by all dispatcher replicas, evenly spaced.
//	    max_depth: 100000        # messages held at most; full: 429 (default 100000)
//	    max_bytes: 1GiB          # bytes held at most: a number or KB MB GB KiB MiB GiB
//	                             # (default: no cap)
//	    max_age: 24h             # an order still waiting after this is dead-lettered
//	                             # (reason "expired"), never dropped unseen (default: none)
//	    max_attempts: 8          # delivery attempts before a message is dead (default 8)
//	    max_in_flight: 16        # deliveries under way at once, all replicas (default 16)
//	    backoff:                 # retry backoff after 5xx and network errors, with jitter
//	      initial: 1s            # default 1s
//	      max: 5m                # default 5m; at least initial
//	    downstream: http://orders-api:8080  # required: an http:// or https:// base URL
//	                             # (without credentials, query or fragment), or
//	                             # nats:SUBJECT to publish on (a literal subject, not
//	                             # under sluice. or $, which are sluice's and NATS's own)
//	    result_headers: [X-Order-Id]  # response headers kept in the ticket's result besides
//	                             # Content-Type, Content-Length, Location, ETag and
//	                             # Retry-After; nothing else is stored (Set-Cookie: refused)
//	    max_idempotency_keys: 10000  # Idempotency-Keys one caller may have accepted in
//	                             # this queue within the idempotency TTL; past it 429
//	                             # (default 10000, at most 10000000); counted in the
//	                             # NATS servers' memory: afresh after they restart
//	    max_body: 1MiB           # largest request body the queue stores (default 1MiB,
//	                             # at most 8MiB); a larger one gets 413 before it is read
//	    drop_headers: [Cookie]   # request headers never stored, so never delivered
//	                             # (beside hop-by-hop ones; default: none)
//	    dead_letter_max_age: 14d # dead letters of this queue are deleted after this
//	                             # (default 14d; a per-message TTL in SLUICE_DEAD)
//	    delivery: at_least_once  # nats: downstreams only. at_least_once (default): a
//	                             # JetStream stream must capture the subject (the queue is
//	                             # refused otherwise) and an order is done once it stored it;
//	                             # at_most_once: a core publish, done whether or not anyone
//	                             # listens
//	    max_delay: 24h           # how far ahead a client may ask for delivery with
//	                             # Sluice-Not-Before (default: none, the header is refused)
//	    # delay: 10s             # hold back every order this long after receipt (default: none)
//	    priorities:              # levels sharing the one outflow (default: one level)
//	      levels: [high, normal, low]
//	      default: normal        # an order without (or with an unknown) level
//	      mode: weighted         # weighted (default): each busy level its weight's share;
//	      weights: {high: 8, normal: 2, low: 1}  # strict: highest level first, others wait
//	    fair_by: header:X-Tenant # tenants with waiting orders take turns (header:, query:,
//	                             # client_ip, method or host; default: none)
//	    fair_lanes: 16           # tenants are hashed into this many lanes (default 16, max 64)
//	    tenant_max_depth: 500    # waiting orders one tenant lane may hold; past it 429
//	    flow_by:                 # each key its own outflow and parallelism within the
//	      from: header:X-Merchant  # queue's (header:, query:, client_ip, method or host)
//	      rate: 5/s              # each key's starts (default: only the queue's outflow)
//	      max_in_flight: 2       # each key's deliveries at once (default: the queue's)
//	    callback_hosts: [hooks.shop.example]  # where Sluice-Callback may point (see
//	                             # Completion callbacks); http://host[:port] allows plain http
//	    callback_private: false  # true: named callback hosts may resolve to private,
//	                             # loopback or link-local addresses (default false)
//	    callback_secret: env:ORDERS_CALLBACK_SECRET  # whsec_<base64>, signs the callbacks
//
// A route gives the priority of its orders with `priority: {value: high}` or
// `priority: {from: "header:X-Priority", default: normal}` (any source of `from:`).
//
// # What a request gets
//
// For each request the ingress finds one route: the path is cleaned first (`//`, `.`,
// `..` and a trailing `/` removed, so `/v1//orders/` is `/v1/orders`), then the most
// specific path wins: an exact `path`, then a `path_pattern` (literal segments before
// `{params}`, left to right), then the longest `path_prefix` (whole segments), then
// routes without a path. Among routes with the same path, the first in file order (files
// in load order) whose method, host and headers match wins. No route: the request is not
// limited.
//
// Each descriptor list of the route is then built from the request. A list with an
// entry that has no value in the request (an absent or empty header, query parameter or
// path segment, an unknown client address) is skipped, as Envoy skips a descriptor
// whose action cannot produce a value, unless the entry has a `default`. So a client that
// omits `X-User-ID` escapes a per-user limit: pair it with a per-IP list, a `default`, or
// a `headers: [{name: X-User-ID, present: true}]` condition on the route.
//
// Each built list is looked up in the route's domain exactly as the Envoy service does:
//
//   - one tree level per entry, in order; at each level the most specific descriptor wins:
//     the exact `value`, then the first `value` with `*` (in file order) whose pattern
//     matches, then the descriptor without `value`. There is no backtracking. A value
//     matched by a pattern or by a descriptor without `value` selects its own counter (as
//     the request's values make Envoy's cache key), except under `share_threshold`.
//   - the limit applies only if the list ends exactly on a descriptor with a
//     `rate_limit` (or `rate_limits`): a list longer or shorter than the tree path matches
//     nothing.
//   - `unlimited: true` always allows; `requests_per_unit: 0` never allows (with sluice's
//     fields on the descriptor, 0 is an error instead).
//   - when one matched rule `replaces` the `name` of another matched rule, the replaced
//     rule is not checked (in Envoy's order: every match's `replaces` is applied).
//   - two lists of a route that reach the same rule with the same values count once. (A
//     caller of `Set.Evaluate`, the gRPC service, that sends one descriptor twice is
//     charged twice, as Envoy's service charges every descriptor it is sent.)
//
// Every remaining check is applied, every limit of each; the most restrictive outcome
// wins (any rejection rejects; a deferral defers unless another rule rejects). Shadow
// rules are counted and logged but never change the outcome.
//
// Limits map onto the limiter as: `requests_per_unit` → `Rate`, `unit`/`window` →
// `Period` (second 1s, minute 1m, hour 1h, day 24h; times `unit_multiplier`), `burst` →
// `Burst`, `algorithm` (default `fixed_window`: epoch-aligned windows, as Envoy counts).
//
// Keys and names. Each limit of a rule counts on its own key
// `sl:DOMAIN:RULEHASH:LIMIT[:VALUESHASH]`, e.g. `sl:shop:566a6046e7b238d7:tb1s:UloE_AZkIAgECldJaFHFjQ`:
// the domain, a hash of the descriptor path, the algorithm and window, and a 128-bit
// SHA-256 of the request values that select the counter (the user of a per-user limit).
// Raw API keys or addresses never appear in keys, and keys survive reloads unchanged
// unless the descriptor path, algorithm or window changes. A rule's name (logs, metric
// labels, `RateLimit-Policy`) is its `name`, or `DOMAIN.key_value.key…` with a written
// value replaced by a short hash when routes fill that key from requests or it looks like
// an address, so a file that singles out one API key or IP does not leak it. Give a
// `name` to have a readable one.
//
// # Differences from envoyproxy/ratelimit
//
// A rules file of envoyproxy/ratelimit (as of 2026) loads and matches the same in sluice,
// checked by `rules/parity_test.go`, a table restating that project's test configs,
// config tests, examples, integration configs and README examples (40 of 42 load
// verdicts and 113 of 115 matching cases agree; the rest are the first two rows
// below). What remains different, on purpose:
//
// Columns: Envoy's service, sluice, why.
//
//   - a top-level `shadow_mode` is accepted and ignored (rules enforced) (sluice: `true` refused, `false` accepted): sluice used to shadow the whole file; neither meaning may apply silently. Use `--shadow` or per-descriptor `shadow_mode`
//   - `name` / `replaces` beside `rate_limit` (not inside it) are accepted and ignored (sluice: refused beside a plain `rate_limit`; beside `rate_limits` or sluice's fields (files Envoy refuses anyway) they name the rule and replace): no silent change of what `replaces` drops
//   - `replaces` naming no rule is accepted (sluice: refused): a typo would silently leave both limits applied
//   - `requests_per_unit` absent: 0, every request over the limit (sluice: refused; write `requests_per_unit: 0` to block): an omission must not block all traffic
//   - keys in a YAML file are checked against one list at every level (`unit: x` at the top loads) (sluice: each level knows its own fields): typos anywhere are reported
//   - a wildcard `value` is compared with the entry's `key_value` text, so `key: a, value: b*` also catches an entry of key `a_b` (in the versions read) (sluice: patterns match only values of their own key): the prefix test crossed keys
//   - counters are Redis keys of the request's values and the unit's time bucket; detailed_metric / value_to_metric put request values in stat names (sluice: counters are `sl:DOMAIN:RULEHASH:LIMIT[:VALUESHASH]` (request values hashed) for the rule's algorithm (`fixed_window` by default, as Envoy counts); metric labels are rule names, never request values): bounded labels; no raw keys or addresses in Redis or metrics
//   - a descriptor's limit override from the request (`limit` in the RLS request) (sluice: not part of the rules files): the gRPC service handles it
//   - one service-wide `SHADOW_MODE` (sluice: `--shadow`): same meaning
//
// # Validation
//
// `sluice rules check` and every load report all problems at once, each with file, line
// and column: YAML errors, unknown fields (with a suggestion), wrong types, unknown unit
// or algorithm, zero or negative limits, a unit and a window together, two limits with the
// same algorithm and window, `burst` / `forgive_rejected` on an algorithm that ignores it,
// sluice fields on a descriptor without limit, duplicate descriptors at one level,
// `replaces` naming nothing in the domain, `share_threshold` on a value without `*`,
// a top-level `shadow_mode: true`, `name` / `replaces` beside a plain
// Envoy `rate_limit`, `unit_multiplier` below 1 or with `window`, a domain in two files
// without `--merge-domains`, `defer` without a queue or with an unknown one,
// `queue` without `defer`, malformed `from`, `path:{x}` not in the route's pattern, a
// route descriptor list that can reach no rule, duplicate domains, queues and route
// names, invalid queue names, outflows (at most 1,000,000/s), sizes, durations and
// downstreams (URL without host, with credentials, a query or a bad port, not http(s);
// NATS subject empty, with wildcards or spaces, or under `sluice.` or `$`). Queue settings
// are checked by the queue package's own validator (`queueconfig.Config.Validate`), reported
// at their position: what `rules check` accepts, a reload and the start declare.
// Limits keep hostile files harmless: files over 8 MiB, more than 2^20 YAML nodes after
// alias expansion, descriptors nested over 16 levels. Problems never quote a value of
// the file, only its position (a wrong type says `got a string`): a file that is not a
// rules file at all (a symlink to `/etc/passwd`, a key, another program's YAML) is one
// problem, `not a rules file`, that quotes nothing of it, so no secret reaches the logs.
//
// A set with any problem is never activated.
//
// Editors validate and complete rules files with the JSON Schema in
// `rules/schema.json` (rules/schema.json) (draft 2020-12; also `rules.JSONSchema()`); the
// shipped examples point at it with a `# yaml-language-server: $schema=…` first line,
// which VS Code's and other YAML language servers read. A test holds it to the parser:
// every object lists exactly the fields the parser accepts, every shipped example, README
// example and loadable file of the Envoy parity table is valid under it, and a table of
// invalid files (unknown fields, units, algorithms, negative limits, bad sources,
// downstreams, sizes…) is refused by both. `sluice rules check` stays the authority: a
// schema cannot see references between queues, routes and descriptors.
//
// # Hot reload
//
// `sluice serve` watches its rules paths (fsnotify on the directories, which also sees
// editors' rename-and-replace and Kubernetes ConfigMap `..data` symlink swaps; polling
// when notifications are unavailable). Changed content is loaded as a whole new set and
// swapped in atomically: a request sees the old set or the new one, never a mix. Content
// with problems is refused, logged with every problem, and counted in
// `sluice_rules_reload_total{result="failure"}`; the old set keeps serving. Identical
// content is not a reload. SIGHUP reloads the same way.
//
// Reloads declare first: a new set goes live only after every queue it names is declared
// (queues it adds first, then those it changes; a reload that changes no queue asks NATS
// nothing), so the first defer to a queue a reload adds is accepted, never answered 503.
// If NATS refuses a declaration (a stream it cannot place or store, a timeout), the whole
// set is refused: logged, counted in `sluice_rules_reload_total{result="failure"}` once,
// what it had already changed is declared back as the active set has it (a queue it
// added keeps its empty stream, reported as orphaned until `sluice queue retire`), and
// the old set keeps serving. The refused content is tried again in the background (backoff
// 250 ms to 10 s), on SIGHUP and on the next file change, without being counted or logged
// again; it goes live as soon as its queues are declared, unless the files changed
// meanwhile. While NATS has not yet let sluice open its queues (unreachable at start), a
// new set goes live at once, since defers answer 503 until then with any set, and the
// newest set is declared once NATS answers.
//
// # Library use
//
//	w, err := watch.New([]string{"/etc/sluice/rules"}, watch.Options{Registerer: reg}) // rules/watch
//	// rules.LoadWith(paths, rules.MergeDomains()) and watch.Options{MergeDomains: true}
//	// let files share a domain; rules.Load alone reads the files once, without fsnotify.
//	if err != nil { … }                 // rules.Problems: every problem, FILE:LINE:COL: msg
//	defer w.Close()
//
//	set := w.Set()                      // one set for the whole request
//	route, checks := set.Match(r, clientIP, buf[:0])
//	for _, c := range checks {
//		for i, l := range c.Rule.Limits { // all must allow
//			d, err := store.AllowN(ctx, c.Key(i), l, 1)
//			…                             // c.Rule.OnLimit, c.Rule.Queue, c.Rule.Shadow, c.Rule.Name
//		}
//	}
package rules
