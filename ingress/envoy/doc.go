// Package envoy offers sluice's decisions to proxies over the gRPC APIs of Envoy: the
// rate limit service (envoy.service.ratelimit.v3.RateLimitService, which Envoy's HTTP
// rate limit filter, Istio, Envoy Gateway, Contour and Gloo call) and the external
// authorization service (envoy.service.auth.v3.Authorization, Envoy's ext_authz
// filter), which can defer. Both decide with the rules, the limiter and the metrics of
// the HTTP front door, and with its decision engine (package ingress/decide), so a rule
// decides alike on every entry point and an Envoy and a sluice front door sharing one
// Redis share the same counters.
//
// # Envoy, Istio and ext_authz
//
// Platforms that already run Envoy (Istio, Envoy Gateway, Contour, Gloo) can call sluice
// instead of sending traffic through it. `sluice serve` or `sluice ingress` with
// `--grpc-listen ADDR` (and `sluice rls`, which runs only this, without a front door or
// queues) serves over gRPC (google.golang.org/grpc, go-control-plane's generated types):
//
//   - `envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`, a drop-in for
//     envoyproxy/ratelimit. Each descriptor is looked up in the request's `domain` as the
//     rules' Envoy-style tree answers it (`rules.Set.Evaluate`) and charged with the same
//     limiter, store and keys as the front door: an RLS replica and a front door on one
//     Redis count on the same counters. Per descriptor: `hits_addend` (the descriptor's,
//     else the request's; at least 1); a `limit` override is counted as Envoy counts it, a
//     fixed window of its unit (× `unit_multiplier`; month = 30 days, year = 365) keyed by
//     the domain and every entry, named and failing over like the rule the descriptor
//     reaches (`DOMAIN.override` when none; an unknown domain ignores overrides);
//     `requests_per_unit: 0` allows nothing. Each status has `code`, `current_limit` (the
//     limit closest to running out; a window that is not a whole unit is written as its
//     largest whole unit with `unit_multiplier`, so `window: 30s` is SECOND × 30),
//     `limit_remaining` and `duration_until_reset` (over the limit: until a request would be
//     allowed); it and `Retry-After` are never negative, whatever the `hits_addend`. A
//     request larger than a limit's whole capacity can never pass: OVER_LIMIT with
//     `Retry-After: 3600`, as a `requests_per_unit: 0` rule, and `duration_until_reset` the
//     time until the quota is whole again. `quota_mode` as in Envoy (Quota mode, go doc
//     ./rules): a quota descriptor over its limit stays OVER_LIMIT (`limit_remaining` 0)
//     while `overall_code` is OK as long as another quota has room. With
//     `--rls-dynamic-metadata` the response carries Envoy's `dynamic_metadata`: the domain,
//     the descriptors (their entries, `limit` override and `hitsAddend`), and under
//     `metadata` the rules' `metadata` of every descriptor that is OK (with quota mode, the
//     quotas with room), which an Envoy route can read to pick an upstream. A descriptor that reaches no rule, or an `unlimited` one, is OK without a
//     limit. `response_headers_to_add` (off with `--rls-headers=false`) are the front
//     door's: `X-Ratelimit-Limit`, `X-Ratelimit-Remaining`, `RateLimit-Policy`, `RateLimit`
//     for the closest limit, and over the limit `Retry-After` and `X-Ratelimit-Retry-After`.
//     Shadow mode as in Envoy: a rule's `shadow_mode` makes its descriptor OK; `--shadow`
//     keeps descriptors OVER_LIMIT and makes `overall_code` OK; both are counted
//     (`outcome="shadow_rejected"`). Failure modes are the rules' (`failure_mode`). Refused
//     with `INVALID_ARGUMENT`, charging nothing: an empty domain, no descriptors, more
//     than 64, an empty descriptor, a `hits_addend` over 2^52, an override without a unit.
//     `is_negative_hits` (a refund) is answered OK and charges nothing: the limiter cannot
//     give quota back. Defer rules reject here: Envoy's rate limit filter cannot park.
//   - `envoy.service.auth.v3.Authorization/Check`: the request Envoy describes
//     (method, path, host, headers, source address, body) is matched to a route and decided
//     exactly as the front door would decide it (client identity with `--trusted-proxies`
//     applied to the `--forwarded-header`, `X-Forwarded-For` by default, as Envoy appends
//     it). Allowed: OK, with the rate-limit headers as `response_headers_to_add`. Over a reject rule: denied, 429, with the headers and
//     the `application/problem+json` body. Over a defer rule: the order is parked and
//     the denied response is 202 with the ticket, `Location: /sluice/v1/deferred/{ticket}`
//     and the JSON body of the front door; route `/sluice/v1/deferred/` to `--check-listen`
//     (or the front door) for clients to follow it. Parking needs the whole body: Envoy's
//     `with_request_body` with `allow_partial_message: false` and `max_request_bytes` of at
//     least the largest order. A check without it (no body while the request declares one
//     or declares no length, `x-envoy-auth-partial-body: true`, a body shorter than
//     `Content-Length`) answers 429 and the problem's `detail` says why; a request that
//     declares `Content-Length: 0` is whole. An order with a header the dispatcher could not
//     send on (a value with a control character, a name that is not a token) is answered 400
//     and nothing is parked.
//   - Paths on the check endpoints: ext_authz and `/sluice/v1/check` (below) answer 400 to a
//     path not in normal form (`//`, `.` or `..` segments, also written `%2e`, an encoded
//     slash or backslash `%2F` / `%5C`, a backslash), whatever the rules: sluice matches
//     routes on the cleaned path, while a proxy that does not normalise forwards the raw
//     one (`/v1/orders/../../admin` would be counted as /admin). `deploy/envoy/envoy.yaml`
//     sets `normalize_path`, `merge_slashes` and `path_with_escaped_slashes_action:
//     REJECT_REQUEST`; on Istio set `meshConfig.pathNormalization.normalization:
//     MERGE_SLASHES`.
//   - `grpc.health.v1.Health` (SERVING for `""` and both services; NOT_SERVING from the
//     start of shutdown, so Envoy's `grpc_health_check` turns away before connections
//     close) and server reflection (`grpcurl -plaintext ADDR list`).
//
// Connections: at most 1024 concurrent streams each; idle ones closed after 10 minutes
// and pinged every minute; a client pinging more often than every 10 s is cut off.
// Flow-control windows are fixed (1 MiB a stream, 16 MiB a connection): grpc-go's
// bandwidth estimate would ping a busy Envoy about every third call.
// Metrics are the front door's (`sluice_decisions_total{rule,outcome}`,
// `sluice_decision_duration_seconds`) on the same registry, so dashboards and alerts see
// every path.
//
// nginx `auth_request` and Traefik `ForwardAuth` use the HTTP form on
// `--check-listen`: `GET /sluice/v1/check` with the original method in
// `X-Forwarded-Method` (or `X-Original-Method`), path and query in `X-Forwarded-Uri` (or
// `X-Original-URI`; origin form only; a check naming neither is 400), host in
// `X-Forwarded-Host` (else `Host`), and the other headers as the client sent them. The
// client is the peer, or what the `--forwarded-header` (`X-Forwarded-For` by default,
// as nginx and Traefik write it) names when the peer is a `--trusted-proxies` address. Answers: 200 with the rate-limit headers, or 429 with
// `Retry-After` and the problem, which a refusal also carries as one line of JSON in the
// `Sluice-Problem` header (nginx's `auth_request` keeps no body of the check, only
// headers). This check never parks an order and never answers
// another 2xx: nginx and Traefik take every 2xx for "allowed" and would send the
// request upstream as well, so a parked order would be delivered twice. Over a defer
// rule it answers 429 as over a reject rule, whatever body the check carries (Traefik's
// `forwardBody: true` included) and even `Content-Length: 0`, and the problem's `detail`
// says why; `Sluice-Not-Before` is 400. Deferral through a proxy is Envoy's ext_authz
// over gRPC above, whose denied 202 reaches the client as the response; Envoy's HTTP
// ext_authz service form is not served. The check's body is never read: a check that
// declares one gets `Connection: close`, so a body that never comes does not hold the
// answer. nginx passes every 2xx as "allowed", passes 401 and 403, and turns any other
// answer into 500: keep sluice's with `auth_request_set $sluice_status $upstream_status;`
// and answer it in an `error_page 500` location; send the check without the body and
// without `Content-Length` (`proxy_pass_request_body off;` and
// `proxy_set_header Content-Length "";`): nginx would announce the client's body on the
// check without sending it, and sluice would close the connection after every such
// check. `deploy/nginx/auth_request.conf` does all of this (429 with
// `Retry-After` and the rate-limit headers, 400, 503 when sluice does not answer) and is
// tested with Debian's nginx; `TestCheckBehindNginxForwardingBody` runs it without those
// two lines, and the client still gets 429 with nothing reaching the API or the queue.
// The check listener is for the proxies: anyone who reaches it can spend quota as any
// client the proxy could be, so never expose it.
//
// `deploy/envoy/` has an Envoy bootstrap with both filters against sluice, a compose file
// to run it, and Istio and Envoy Gateway examples (deploy/README.md).
package envoy
