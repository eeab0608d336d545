// Command sluice is the sluice throttling gateway and its operator tools.
//
// The command line is parsed by spf13/cobra and spf13/pflag. The standard flag package
// served while sluice had one command; with ten, each with subcommands or positional
// arguments among its flags, it left every command to re-implement what cobra does once:
// GNU-style --flags (and -h), flags anywhere among the arguments, nested subcommands
// (rules check), "did you mean" for mistyped commands, and shell completion generated
// from the same tree that parses (sluice completion bash|zsh|fish). cobra is the parser
// of kubectl, helm, docker and gh, so sluice behaves as its operators' other tools do; the alternatives (urfave/cli, kong) would give the same for a less familiar
// help layout and completion. sluice's own layers stay on top of it: every flag can
// come from SLUICE_<FLAG> and, for the long-running commands, from --config FILE
// (config.go), and --print-config says which of them set each value.
//
// run builds the command tree afresh for every call, so that tests run the command
// line in process; main only wires the process's arguments, streams, signals and exit
// status to it.
//
// # Flags, environment and exit status
//
// Flags are `--name value` or `--name=value` (one dash is refused, with a hint: `-rules`
// says `--rules`); a boolean takes its value after `=` (`--dispatch=false`). A mistyped
// command or flag gets a suggestion (`unknown flag --admin-lisen (did you mean
// --admin-listen?)`). Every size (`--max-body`, `--idempotency-max-bytes`,
// `--defer-memory`, `--grpc-max-message`, `--max-upstream-header`, in flags, `SLUICE_*` and the config file) takes a
// unit as rules files do: `10MiB`, `1GB`, or plain bytes.
// Every flag can also be given as an environment variable `SLUICE_<FLAG>` (upper case,
// dashes as underscores: `--admin-token` is `SLUICE_ADMIN_TOKEN`), and, for `serve`,
// `ingress`, `dispatch`, `rls` and `dlq`, in a config file (`--config FILE`, below). Each flag
// takes the first of: command line, environment, file, default. Exit status: 0 success,
// 1 failure (invalid rules, a data directory held by another process, a server that
// stopped with an error; for `dlq`, NATS unreachable), 2 usage (including a bad config
// file or a missing TLS file). `serve`, `ingress` and `dispatch` never exit for want of
// NATS (unless `--require-durable`, below): unreachable, without quorum or unable to place R3 streams yet, they keep
// connecting and declaring the queues in the background (backoff from 250 ms to 10 s,
// one log line when it starts failing and one when it succeeds), answer defers 503 with
// `Retry-After` and proxy allowed requests meanwhile, and start the dispatchers once the
// queues are declared. A rules reload during the wait is not lost: the newest set is
// declared.
//
// # The flags of sluice serve
//
// `sluice serve` flags (`sluice serve -h` lists them all):
//
// Columns: flag, default, meaning.
//
//   - `--rules` (default: (required)): rules files or directories, comma-separated; reloaded when they change and on SIGHUP
//   - `--merge-domains` (default: false): let several rules files share a domain (Envoy's `MERGE_DOMAIN_CONFIG`): their descriptors join one tree, their `replaces` and routes see each other; a descriptor repeated across them is an error. Also on `ingress`, `dispatch` and `rules check`
//   - `--upstream` (default: (required)): where allowed requests are proxied
//   - `--max-upstream-header` (default: 1MiB): largest response head the upstream may send (status line, header fields, 1xx responses before them; a chunked body's trailer section), in total and per line; larger → 502 and the connection is closed; 0 is refused (exit 2)
//   - `--upstream-reuse-after` (default: 0: reuse at once): how long a kept-alive upstream connection idles, watched, before it carries another request; bytes a broken upstream sends within that delay close the connection instead of reaching another client (Upstream, go doc ./ingress); costs about request rate × delay more connections
//   - `--upstream-max-hold` (default: 10s): longest a request may wait in the front door (a stalled or SIGSTOPped process, a slow connect) and still be sent upstream; past it 503 with `Retry-After`, never sent, since its client has most likely retried; 0 is refused (exit 2)
//   - `--listen` (default: `127.0.0.1:8080`): the front door
//   - `--fast-path` (default: true): the front door serves the common plaintext HTTP/1.1 requests (a Content-Length or no body, no `Transfer-Encoding`, `Expect` or `Upgrade`, a head within 4 KiB: see go doc ./ingress/h1) on sluice's own fast path, one read and one write a request, and hands every other connection, with what it has read of it, to Go's net/http server, whose answers those get; `false`: net/http serves every connection
//   - `--admin-listen` (default: `127.0.0.1:9090`): `/metrics`, `/healthz`, `/readyz`, `/sluice/v1/rules`, `/sluice/v1/status`, the queue API (deploy/README.md) and `/sluice/v1/openapi.json`
//   - `--admin-token` (default: none; the console then signs in with `DATA_DIR/console.token`, see Operator console in deploy/README.md): bearer token that everything on the admin listener requires, except `/healthz` and the console's sign-in page and assets (`/console/`, which then keeps a session cookie); an address (an IPv6 address's /64) that presents 10 wrong tokens (API or sign-in together) is refused with 429 and `Retry-After`, the right token too, and gets one more try every 6 s
//   - `--console-report-interval` (default: `5s`, 1s to 10s): how often this replica publishes its decision counters and queue figures to the NATS bucket `sluice_console` for the console's cluster view, and the console reads every replica's; the console's history takes a point every two intervals and keeps 360 (an hour at the default)
//   - `--redis` (default: none): keep limits in Redis (`redis://[user[:password]@]host:port/db`, `rediss://` for TLS, `redis://h1:p1?addr=h2:p2` for a Cluster); memory otherwise. Where dispatchers run (`serve`, and `dispatch`, which takes the `--redis*` flags for this alone), each flow key's pace (a queue's `flow_by` rate) lives there too, so a replica that takes a queue over keeps it; max_in_flight per key stays counted by the dispatcher that leads the queue
//   - `--redis-password` (default: none): the Redis password, instead of one in the URL (best as `SLUICE_REDIS_PASSWORD`)
//   - `--redis-ca`, `--redis-cert`, `--redis-key` (default: none): Redis TLS: CA certificates instead of the system's, client certificate and key (`rediss://` only)
//   - `--redis-timeout` (default: `50ms`): how long a decision waits for Redis; past it the limit's `failure_mode` decides (and Redis is re-probed with backoff)
//   - `--trusted-proxies` (default: none): CIDRs whose forwarding header (`--forwarded-header`) is believed
//   - `--forwarded-header` (default: `x-forwarded-for`): the header the trusted proxies append the client to: `x-forwarded-for` (nginx, HAProxy, AWS ALB, Envoy, Traefik by default) or `forwarded` (RFC 7239); only it is read, the other ignored, since those proxies pass a client's own copy of it through untouched. Anything else is refused (exit 2)
//   - `--proxy-protocol` (default: none): CIDRs of load balancers whose front-door connections may start with a PROXY protocol header (v1 or v2, HAProxy's `send-proxy` / `send-proxy-v2`); the client is then the address in the header, and `--trusted-proxies` and the limits follow from it. Other peers are read as before
//   - `--ipv6-prefix` (default: 64): IPv6 clients are limited per prefix of this length
//   - `--max-body` (default: 10MiB): larger bodies get 413 (a size: bytes or with a unit, `10MiB`, `1GB`)
//   - `--defer-memory` (default: 64MiB): bytes of deferred bodies held in memory at once (a size: `67108864`, `64MiB`, `1GB`); a body that does not fit gets 503 with `Retry-After: 1`, one larger than the whole budget (half of it when chunked) 413. Also sets the Go memory limit, see Memory (deploy/README.md, Running in production)
//   - `--ticket-lookups` (default: `100/s`): ticket status and cancel requests (`/sluice/v1/deferred/{ticket}`) each client (its address, an IPv6 address's prefix) may make, in bursts of twice the count (an address following a hundred tickets by their `Retry-After` stays within it); past it 429 with `Retry-After`. A lookup of an unknown ticket reads NATS in every queue, so it is limited for everybody; `0`: no limit
//   - `--max-wait-preference` (default: `1m`): longest `Prefer: wait` a ticket status request is held for until the order is final (longer ones are cut to it); `0`: no waits and no event streams
//   - `--max-waits-per-client` (default: `100`): ticket waits and event streams each client (its address, an IPv6 address's prefix) may have open at once; past it a wait is answered at once without `Preference-Applied` and a stream is 429
//   - `--max-waits` (default: `10000`): ticket waits and event streams open at once over every client
//   - `--max-keys` (default: 1,000,000): keys the memory limiter tracks at most
//   - `--shadow` (default: false): every rule in shadow mode: decide, count, log, never enforce
//   - `--grpc-listen` (default: (`rls`: `127.0.0.1:8081`)): gRPC for Envoy: `envoy.service.ratelimit.v3.RateLimitService`, `envoy.service.auth.v3.Authorization`, `grpc.health.v1.Health`, server reflection (Envoy, Istio and ext_authz (go doc ./ingress/envoy)); empty: none
//   - `--grpc-cert`, `--grpc-key` (default: none): TLS on `--grpc-listen` (read again at each handshake: a renewed certificate needs no restart)
//   - `--grpc-ca` (default: none): with it, `--grpc-listen` requires client certificates signed by these CAs (mutual TLS)
//   - `--grpc-max-message` (default: 10MiB + 64KiB): largest gRPC message received (a size); an ext_authz check carries the request body, so keep it above `--max-body`; larger ones fail with `RESOURCE_EXHAUSTED`
//   - `--rls-headers` (default: true): the rate limit service fills `response_headers_to_add`
//   - `--rls-dynamic-metadata` (default: false): the rate limit service returns `dynamic_metadata`, as Envoy's `RESPONSE_DYNAMIC_METADATA` (Envoy, Istio and ext_authz (go doc ./ingress/envoy))
//   - `--check-listen` (default: none): HTTP listener for proxies: `/sluice/v1/check` (nginx `auth_request`, Traefik `ForwardAuth`) and the tickets (`/sluice/v1/deferred/…`); keep clients off it
//   - `--nats` (default: none): NATS cluster URLs; empty: embedded server. Not reachable yet: connected and declared in the background (above)
//   - `--require-durable` (default: false): with `--nats`, sluice warns at start when it can tell that accepted orders would not be durable (memory storage, one replica on a cluster); with this flag it refuses to start instead, and also when NATS does not answer at start. A server's sync setting is not visible to a client: check its `/varz` (`"sync_always": true`, Durability in deploy/README.md)
//   - `--data-dir` (default: `sluice-data`): the embedded server's JetStream directory
//   - `--nats-listen` (default: none): let NATS clients reach the embedded server at this address; needs `--nats-listen-token` or client certificates, else exit 2
//   - `--nats-listen-token` (default: none): token every client of `--nats-listen` must give (32+ characters; best as `SLUICE_NATS_LISTEN_TOKEN`); sluice's own in-process connection gives it too
//   - `--nats-listen-cert`, `--nats-listen-key`, `--nats-listen-ca` (default: none): TLS on `--nats-listen`; with `--nats-listen-ca`, clients must present a certificate that CA signed (their credential, instead of or besides the token)
//   - `--encryption-key`, `--encryption-key-file` (default: none): encrypt the embedded server's store at rest (nats-server's ChaCha20-Poly1305, 32+ characters; best as `SLUICE_ENCRYPTION_KEY` or a file readable only by sluice); without it a warning says parked orders are stored in clear
//   - `--nats-creds`, `--nats-token`, `--nats-ca`, `--nats-cert`, `--nats-key` (default: none): NATS credentials (file or token, best as `SLUICE_NATS_TOKEN`) and TLS for `--nats`
//   - `--queue-key` (default: embedded: generated once into `DATA_DIR/queue.key`; required with `--nats`): the secret that signs parked orders and ticket records (Signed orders (go doc ./queue)): standard base64 (as `openssl rand -base64 32` prints it) of at least 32 bytes; every process sharing the queues needs the same one; best as `SLUICE_QUEUE_KEY`
//   - `--replicas` (default: `auto`: 1 embedded or single server, 3 on a cluster): stream replicas of the queues: `auto` or 1 to 5
//   - `--idempotency-max-bytes` (default: 256 MiB): byte cap of the idempotency keys (bucket and each queue's key stream); new keys past 90% get 503; give every process the same value
//   - `--dispatch` (default: true): run the dispatchers in this process
//   - `--delivery-timeout` (default: 30s): one delivery attempt; longer is a failed attempt
//   - `--failover-after` (default: 10s): a queue moves to another dispatcher replica after its dispatcher stopped pulling this long
//   - `--ack-wait` (default: `--delivery-timeout` + 30s (`--print-config` shows the value)): when a message held by a crashed dispatcher is delivered again (same `Idempotency-Key`)
//   - `--shutdown-timeout` (default: 30s): how long SIGINT/SIGTERM waits for requests and deliveries under way
//   - `--log-format`, `--log-level` (default: text, info): `log/slog` output; debug logs one line per rejected request
//   - `--config` (default: none): read flags from this YAML file (also `SLUICE_CONFIG`)
//   - `--print-config` (default: false): print the effective configuration and exit (`serve`, `ingress`, `dispatch`, `rls`)
//
// # Config file
//
// `--config FILE` (or `SLUICE_CONFIG=FILE`) reads flags from a YAML mapping whose keys are
// the flag names without dashes (`admin-listen: 127.0.0.1:9090`; `admin_listen` works
// too). Values are YAML scalars of the flag's type: strings, integers, `true`/`false`,
// durations as Go durations (`30s`, `1m30s`), sizes as in rules files (`64MiB`); the list flags `rules`, `trusted-proxies`
// and `nats` take a YAML list or a comma-separated string. Relative paths are relative to
// the working directory, as on the command line. A key that is set on the command line or
// in the environment is overridden, but still checked.
//
// One file can describe a whole deployment: `serve`, `ingress`, `dispatch` and `dlq` read
// the same file, and each takes the keys it has flags for and leaves the others alone
// (`dispatch` ignores `upstream` and takes of the front door's keys only the `redis` ones; `dlq` takes only the NATS keys). A key that
// is a flag of none of them, a value its flag does not take, a key given twice, a file
// that is missing or not YAML: the command prints every problem as `FILE:LINE: message`
// naming the key, and exits 2. `--config`, `--print-config` and `dlq`'s `--json`,
// `--limit` and `--yes` are never read from a file. `simulate`, `rules check` and
// `version` take no config file and ignore `SLUICE_CONFIG`: their flags describe one run
// or one check, not a deployment.
//
//	# /etc/sluice/sluice.yaml: two or more replicas sharing Redis and a NATS cluster
//	rules: [/etc/sluice/rules]
//	upstream: http://orders-api:8080
//	listen: 0.0.0.0:8080
//	admin-listen: 0.0.0.0:9090
//	# admin-token, redis-password and queue-key come from SLUICE_ADMIN_TOKEN,
//	# SLUICE_REDIS_PASSWORD and SLUICE_QUEUE_KEY
//	redis: rediss://redis.internal:6380/0
//	redis-ca: /etc/sluice/tls/ca.pem
//	trusted-proxies: [10.0.0.0/8]
//	nats: [tls://nats-0.nats:4222, tls://nats-1.nats:4222, tls://nats-2.nats:4222]
//	nats-creds: /etc/sluice/nats/sluice.creds
//	nats-ca: /etc/sluice/tls/ca.pem
//	delivery-timeout: 20s
//	shutdown-timeout: 30s
//	log-format: json
//
// `sluice serve --config /etc/sluice/sluice.yaml --print-config` prints every flag with its
// value and source, as YAML that `--config` accepts, and exits without starting
// anything. Secrets are masked: `--admin-token`, `--redis-password` (any flag named for a
// token, password or secret), `--queue-key`, and the password of a URL (`redis://:@host`, a NATS
// token `nats://@host`). Paths of key and credentials files are shown.
//
//	# sluice serve: the effective configuration. After each value, where it came from:
//	# flag, env (SLUICE_*), file or default. Secrets are masked.
//	# config file: /etc/sluice/sluice.yaml
//
//	ack-wait: 50s # default (delivery-timeout + 30s)
//	admin-listen: 0.0.0.0:9090 # file
//	admin-token: '****' # env SLUICE_ADMIN_TOKEN
//	data-dir: sluice-data # default
//	delivery-timeout: 20s # file
//	…
//	redis: rediss://redis.internal:6380/0 # file
//	redis-ca: /etc/sluice/tls/ca.pem # file
//	redis-cert: "" # default
//	redis-key: "" # default
//	redis-password: '****' # env SLUICE_REDIS_PASSWORD
//	…
//
// # Credentials and TLS
//
//   - NATS (with `--nats`): user and password or a token in the URL
//     (`nats://user:pass@host:4222`, `nats://token@host:4222`); `--nats-creds FILE`, a
//     credentials file (user JWT and nkey seed, as `nsc` writes it); `tls://` URLs or
//     `--nats-ca FILE` for TLS, checked against the system's CAs or those in the file;
//     `--nats-cert` and `--nats-key` for a client certificate; `--nats-token` (or
//     `SLUICE_NATS_TOKEN`) for a token, such as another sluice's `--nats-listen-token`.
//     Without `--nats` (the embedded server) these flags have no use, and a warning says so.
//   - The embedded server's listener (`--nats-listen`): clients authenticate with
//     `--nats-listen-token` and/or a TLS client certificate signed by `--nats-listen-ca`
//     (`--nats-listen-cert` and `--nats-listen-key` are the server's). A listener with
//     neither refuses to start (exit 2). The token is required from in-process connections
//     too; sluice gives it to its own.
//   - Encryption at rest (embedded server): `--encryption-key` (or `--encryption-key-file`,
//     trailing newline ignored; a warning if others can read it). A data directory written in
//     clear is encrypted at the first start with a key; one written with a key does not start
//     without it, or with another (exit 1, `the encryption key of the data directory is
//     missing or wrong`), and `sluice dlq --data-dir` needs it too. Losing the key loses the
//     parked orders. Changing it is not supported yet.
//   - Redis (with `--redis`): the password in the URL (`redis://:pass@host:6379/0`, or
//     `redis://user:pass@…` for an ACL user) or in `--redis-password` /
//     `SLUICE_REDIS_PASSWORD`, not both; `rediss://` for TLS checked against the system's
//     CAs, `--redis-ca FILE` for a private CA, `--redis-cert` and `--redis-key` for a client
//     certificate. They apply to a single server and to a Cluster
//     (`rediss://h1:p1?addr=h2:p2`).
//
// The files are read at start-up (a missing or malformed one is a usage error, exit 2)
// and client certificates again at every new connection, so renewed certificates are
// picked up without a restart.
package main
