// Package rules is sluice's rules model: it parses and validates rules files, compiles
// them for the request path, matches HTTP requests to routes and descriptors, and keeps
// the active set current as files change.
//
// A rules file is YAML in the format of the Envoy / Lyft rate limit service (domain,
// nested descriptors of key and optional value, wildcard values with * anywhere,
// rate_limit with unit, unit_multiplier and requests_per_unit, unlimited, name,
// replaces, shadow_mode, detailed_metric, value_to_metric, share_threshold, metadata),
// which loads unchanged and means the same (the README lists what still differs, such
// as quota_mode, which is refused), plus sluice's extensions: per-descriptor
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
