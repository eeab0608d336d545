// Package rules is sluice's rules model: it parses and validates rules files, compiles
// them for the request path, matches HTTP requests to routes and descriptors, and keeps
// the active set current as files change.
//
// A rules file is YAML in the format of the Envoy / Lyft rate limit service (domain,
// nested descriptors of key and optional value, wildcard values with * anywhere,
// rate_limit with unit, unit_multiplier and requests_per_unit, unlimited, name,
// replaces, shadow_mode, quota_mode, detailed_metric, value_to_metric,
// share_threshold, metadata), which loads unchanged and means the same (the README
// lists what still differs), plus sluice's extensions: per-descriptor
// algorithm, burst, window, several limits (rate_limits), on_limit reject or defer,
// queue and failure_mode; routes that turn requests into descriptors; and queues. The
// README's Rules section documents every field and default.
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
package rules
