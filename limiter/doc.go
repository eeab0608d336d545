// Package limiter implements sluice's rate-limit algorithms and an in-process sharded
// memory store that keeps their state; limiter/redisstore is a store shared by replicas
// through Redis.
//
// Every algorithm works on time in whole microseconds and keeps, per key, the latest
// time it has seen: a clock that steps backwards is read as "no time has passed", so it
// never grants quota that the forward clock would not.
//
// # Limiter
//
//	store := limiter.NewMemory()                      // or redisstore.New(redisClient)
//	d, err := store.AllowN(ctx, "orders:user-42",
//		limiter.Limit{Algorithm: limiter.TokenBucket, Rate: 2, Period: time.Second, Burst: 4}, 1)
//	// d.Allowed, d.Limit, d.Remaining, d.RetryAfter, d.ResetAfter
//
// Columns: algorithm, parameters, exact semantics.
//
//   - `token_bucket` (parameters: `Burst` (bucket size, default `Rate`), `Rate` per `Period` refill): starts full; a request takes `n` tokens; refill is continuous and capped at the bucket size
//   - `leaky_bucket` (parameters: `Burst` (queue size), `Rate` per `Period` outflow): a meter: admitted while the virtual queue has room for `n`; the level drains continuously at the outflow rate. Its level is the token bucket's size minus its tokens, so both share one implementation
//   - `fixed_window` (parameters: `Rate` per `Period`): windows aligned to the Unix epoch; the count resets at each boundary; rejected requests are not counted
//   - `sliding_window_log` (parameters: `Rate` per `Period`): timestamps at or before now−window are dropped, the request's `n` timestamps added, allowed when the log holds at most `Rate`. Rejected timestamps stay (a client that keeps hammering stays blocked) unless `ForgiveRejected`. Only the newest `Rate` timestamps can change a decision, so no more are kept
//   - `sliding_window_counter` (parameters: `Rate` per `Period`): estimate = current window's count + previous window's count × the previous window's overlap with the sliding window; allowed when floor(estimate) + n ≤ `Rate` (for one unit: floor(estimate) < `Rate`), then counted
//
// Every decision gives `Allowed`, `Limit` (the capacity), `Remaining`, `RetryAfter` (how
// long until the same request would be allowed, `limiter.Never` when `n` exceeds the
// capacity) and `ResetAfter` (until the key is back to full quota). Time is kept to the
// microsecond (a clock that steps backwards: above); any window length works.
//
// Memory store: per shard (its own lock; no global lock) an open-addressing table
// whose 64-byte slots hold each key's state inline, each slot with a sync.Mutex of its
// own. A key already tracked is decided without the shard's lock: found by an atomic
// lookup and held by its slot's lock, so a hot key touches one cache line; inserting,
// moving or dropping keys, and the sliding window log, take the shard's lock. A decision
// on one of many keys costs about one cache miss and no allocation; the table holds no
// pointers for the GC to scan.
// Keys are known by 88 bits of two independently seeded hashes rather than stored: two
// keys would be confused with a probability of about 10^-10 over a century at a million
// decisions a second (see `slot` in `limiter/memory.go`). Time comes from the monotonic
// clock (or an injected one). Bounded: a key whose state is back to a fresh key's is
// dropped as new keys arrive, and beyond `WithMaxKeys` (default 1,000,000) the key closest
// to fresh is evicted.
//
// Redis store (`redisstore.New(redis.UniversalClient, …)` in `limiter/redisstore`:
// standalone, Sentinel or Cluster): each decision is one atomic Lua script (EVALSHA,
// reloaded on NOSCRIPT) on one hash-tagged key (`sluice:{key}:tb`), so it runs on Redis
// Cluster; concurrent decisions are coalesced into pipelines, and a call of one decision
// runs a script that makes only that one, which costs Redis less than the batched script
// (deploy/figures/README.md). Every key has a TTL of its reset plus a grace, so idle
// keys vanish. Time is the Redis server's (`TIME` in the script), so replicas with skewed
// clocks agree; `redisstore.WithClock` injects a clock instead. A key over its limit is
// remembered in-process until it would be allowed again, and answered without Redis with
// the decision Redis would give. Each Redis call is bounded (`redisstore.WithTimeout`, 50 ms);
// when Redis fails or is slow, the limit's `failure_mode` decides: `local` (default: an
// in-process memory store with the same limit), `open` (allow) or `closed` (reject). Redis
// is then left alone while a probe re-checks it with exponential backoff
// (`cenkalti/backoff`); decisions return to Redis when it answers. Every fallback is
// counted in `sluice_limiter_fallback_total{mode}` (registered by
// `redisstore.WithRegisterer`). A program that uses only the memory store links no
// go-redis.
//
// The conformance suite (`limiter/redisstore/conformance_test.go`) runs every algorithm
// on the memory store, a real standalone Redis and a real three-master Redis Cluster, on
// an injected clock: exact decisions at window edges, refill caps, `n` above the capacity, many keys,
// a clock stepping backwards, many goroutines on one key (exactly the capacity is
// granted), and a random trace replayed through every store that must give identical
// decisions to the microsecond.
//
// # sluice simulate
//
// Tune bucket sizes and windows before going live: replay a trace of requests through one
// limit on a simulated clock starting at 2000-01-01T00:00:00Z.
//
//	go run ./cmd/sluice simulate --algorithm token_bucket --bucket-size 5 --refill-rate 2/s --trace deploy/traces/burst.trace
//
// Trace lines are `OFFSET [KEY [N]]` (a Go duration from the start, non-decreasing; key
// `-` and n 1 by default; `#` comments). Flags: `--algorithm`, `--limit` and `--window`
// for the window algorithms, `--bucket-size` with `--refill-rate` (token bucket) or
// `--outflow-rate` (leaky bucket) written `N/UNIT` (`4/m`, `10/30s`),
// `--forgive-rejected`, `--redis URL` to decide on Redis, `--json`. Output: one line per
// request, `OFFSET KEY allow|deny remaining=R retry_after=D`, then `allowed=A denied=D`.
// Bad input names the line or flag, exits 2 and prints no partial table.
package limiter
