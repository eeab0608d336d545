// Package queueconfig is the configuration of one sluice queue: its fields, defaults and
// validation. It imports nothing of NATS, so the rules package compiles `queues:` into
// it and a program that only reads rules links no NATS client or server; the queue
// package declares queues from it.
//
// Its rates are the limiter's (Outflow and FlowBy.Rate are a limiter.Rate, FlowBy.Limit
// the limiter.Limit that paces a flow): the queue layer builds on the limiter, so that
// import points down, and the limiter knows nothing of queues.
package queueconfig

import (
	"errors"
	"fmt"
	"math"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue/webhook"
)

// Defaults applied by Config.WithDefaults to fields left at their zero value.
const (
	DefaultMaxDepth        = 100_000
	DefaultMaxAttempts     = 8
	DefaultMaxInFlight     = 16
	DefaultBackoffInitial  = time.Second
	DefaultBackoffMax      = 5 * time.Minute
	DefaultReplicas        = 1
	DefaultDuplicateWindow = 2 * time.Minute
	DefaultIdempotencyTTL  = 24 * time.Hour
	// DefaultMaxBody is the largest request body a queue stores unless its MaxBody
	// says otherwise: NATS's default max payload.
	DefaultMaxBody = 1 << 20
	// MaxMaxBody is the most MaxBody may be: NATS advises against larger messages, and
	// every byte of a body is held in memory while it is parked and delivered.
	MaxMaxBody = 8 << 20
	// DefaultDeadLetterMaxAge is how long dead letters are kept unless DeadLetterMaxAge
	// says otherwise.
	DefaultDeadLetterMaxAge = 14 * 24 * time.Hour
	// MaxScheduleDelay is the most Delay and MaxDelay may be: an order waits at most a
	// year for its time.
	MaxScheduleDelay = 366 * 24 * time.Hour
)

// Idempotency key caps (see Config.MaxIdempotencyKeys).
const (
	DefaultMaxIdempotencyKeys = 10_000
	// MaxIdempotencyKeysLimit is the largest MaxIdempotencyKeys accepted.
	MaxIdempotencyKeysLimit = 10_000_000
)

// Delivery is the delivery guarantee of a queue with a nats:SUBJECT downstream.
type Delivery string

const (
	// AtLeastOnce (the default): the order is published through JetStream and is done
	// only once a stream capturing the subject acknowledged it; queue.Store.Declare refuses a
	// subject that no stream captures (queue.ErrNoStream).
	AtLeastOnce Delivery = "at_least_once"
	// AtMostOnce: a core NATS publish, done once the server has it, whether or not
	// anyone is subscribed. Only for nats: downstreams.
	AtMostOnce Delivery = "at_most_once"
)

// Backoff configures the retry delay after failed delivery attempts: exponential from
// Initial, doubling per failed attempt, capped at Max, with ±50% jitter.
type Backoff struct {
	Initial time.Duration
	Max     time.Duration
}

// Config is one queue: where parked requests are kept and how they are drained. The
// rules package compiles the `queues:` section of a rules file into this type. Zero
// fields take the documented defaults (see WithDefaults).
type Config struct {
	// Name identifies the queue: 1–64 characters of A–Z, a–z, 0–9, '_' and '-'. It is
	// part of stream names, subjects and metric labels.
	Name string
	// Outflow is the global delivery rate, shared by every dispatcher replica. Required.
	Outflow limiter.Rate
	// MaxDepth caps the number of queued messages (default 100,000). A full queue
	// refuses new messages (queue.ErrFull); it never drops queued ones. Negative: no cap.
	MaxDepth int64
	// MaxBytes caps the stored size of the queue (0: no cap).
	MaxBytes int64
	// MaxAge is how long a message may wait in the queue: a dispatcher that reaches an
	// older one moves it to the dead letters (reason "expired") instead of delivering it
	// (0: forever).
	MaxAge time.Duration
	// MaxAttempts is the number of failed delivery attempts (5xx, timeouts, network
	// errors) before a message is dead-lettered (default 8). Pauses caused by
	// downstream 429/503 and redeliveries after a crash are not failed attempts.
	MaxAttempts int
	// MaxInFlight caps concurrent deliveries across all replicas (default 16). It is the
	// consumer's MaxAckPending.
	MaxInFlight int
	// Backoff is the retry delay after a failed attempt (default 1s doubling to 5m).
	Backoff Backoff
	// Downstream is where messages go: an http:// or https:// base URL (the original
	// path and query are appended) or nats:SUBJECT.
	Downstream string
	// Delivery is AtLeastOnce (default) or AtMostOnce, for a nats: downstream.
	Delivery Delivery
	// Replicas is the stream replica count (default 1; 3 on a JetStream cluster).
	Replicas int
	// DuplicateWindow is JetStream's Nats-Msg-Id duplicate window (default 2m).
	// Idempotency beyond it comes from the key-value bucket.
	DuplicateWindow time.Duration
	// IdempotencyTTL is how long an idempotency key is remembered after its order
	// became final (while the order waits, its message remembers the key), and how
	// long a ticket's status record is kept after its last change (default 24h). It
	// must be at least MaxAge.
	IdempotencyTTL time.Duration
	// MaxBody is the largest request body the queue stores, in bytes (default 1 MiB,
	// at most 8 MiB). The ingress answers 413 to a larger one without reading it. A
	// NATS server whose max payload cannot hold it lowers it (see queue.Store.BodyLimit).
	MaxBody int64
	// DropHeaders are request header names that are never stored, so never delivered
	// either (beside the hop-by-hop headers, which never are): credentials the
	// downstream does not need, for example.
	DropHeaders []string
	// DeadLetterMaxAge is how long a dead letter of this queue is kept before JetStream
	// deletes it (default 14 days; a per-message TTL, so each queue keeps its own).
	DeadLetterMaxAge time.Duration
	// ResultHeaders are downstream response headers kept in a ticket's result (and shown
	// by its monitor) besides DefaultResultHeaders. Set-Cookie is refused.
	ResultHeaders []string
	// MaxIdempotencyKeys caps the idempotency keys one client scope may record in this
	// queue within IdempotencyTTL (default 10,000); past it queue.Store.Park fails with
	// queue.ErrTooManyKeys. The count is kept in the NATS servers' memory: exact while
	// they run, it starts afresh when they restart (orders and their keys are kept).
	MaxIdempotencyKeys int
	// CallbackHosts are where clients may ask (Sluice-Callback: URL) to be told that
	// their order ended. Each entry is "host" or "host:port", which allows https URLs to
	// it, or "http://host[:port]", which allows plain http too. Hosts compare without
	// case; an entry without a port allows only URLs without one. Empty: no callbacks.
	CallbackHosts []string
	// CallbackPrivate lets callbacks to the names in CallbackHosts reach whatever
	// addresses those names resolve to. Without it the dispatcher refuses a name that
	// resolves to a loopback, link-local, private (RFC 1918, fc00::/7), shared (CGNAT
	// 100.64.0.0/10), multicast, unspecified or otherwise special address, in any form
	// (IPv4-mapped included): a listed name whose DNS points inside the network must not
	// turn callbacks into requests to it. A host listed as an IP literal is always
	// reached: the operator named that very address.
	CallbackPrivate bool
	// CallbackSecret signs the queue's callbacks (queue/webhook), in the form
	// "whsec_<base64 key>". Required with CallbackHosts. It is never written as JSON
	// (stream metadata, admin answers): a queue adopted from its stream alone has no
	// secret, so takes no callbacks.
	CallbackSecret string `json:"-"`
	// Priorities declares priority levels (none: one level). An order's level comes
	// from its route's priority source; see Priorities and PriorityMode.
	Priorities Priorities
	// FairBy names the request source that tells tenants apart (header:X-Tenant,
	// query:NAME, client_ip, method or host; empty: no fairness). Tenants with waiting
	// orders share each level's slots round robin, by lane: a tenant's value is hashed
	// to one of FairLanes lanes, so tenants whose values share a lane share its turns.
	// The value is whatever the request carries: with a header or query parameter the
	// client picks its own tenant, so one client can spread its orders over every lane
	// (and past TenantMaxDepth, which then caps each lane, not the client). Name a
	// source the client cannot choose: a header an authenticating proxy in front sets
	// (and strips from the client's request), or client_ip.
	FairBy string
	// FairLanes is the number of tenant lanes (default 16 with FairBy, at most 64).
	FairLanes int
	// TenantMaxDepth caps the waiting orders of one tenant lane (0: no cap beyond
	// MaxDepth); past it a park is refused like a full queue (queue.ErrFull, a
	// *queue.FullError whose Limit is "tenant_max_depth"; the front door's 429 names it).
	TenantMaxDepth int64
	// FlowBy gives each key its own outflow and parallelism within the queue's (see
	// FlowBy; zero: none).
	FlowBy FlowBy
	// MaxDelay is how far in the future a client may ask its order to be delivered
	// (the Sluice-Not-Before request header), counted from when the request is received;
	// a later time is refused. 0 (the default): the queue takes no client schedules. At
	// most MaxScheduleDelay.
	MaxDelay time.Duration
	// Delay holds back every order of the queue: none is delivered sooner than Delay
	// after it was received (a client's later Sluice-Not-Before wins). 0: none. At most
	// MaxScheduleDelay.
	Delay time.Duration
}

// Scheduled reports whether orders of the queue may wait for a time of their own
// (Delay or MaxDelay set). The queue's stream then allows JetStream message schedules,
// which it keeps for good (JetStream cannot turn them off again).
func (c Config) Scheduled() bool { return c.Delay > 0 || c.MaxDelay > 0 }

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidName reports whether s is a valid queue name (see Config.Name).
func ValidName(s string) bool { return nameRE.MatchString(s) }

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	if c.MaxDepth == 0 {
		c.MaxDepth = DefaultMaxDepth
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	if c.MaxInFlight == 0 {
		c.MaxInFlight = DefaultMaxInFlight
	}
	if c.Backoff.Initial == 0 {
		c.Backoff.Initial = DefaultBackoffInitial
	}
	if c.Backoff.Max == 0 {
		c.Backoff.Max = max(DefaultBackoffMax, c.Backoff.Initial)
	}
	if c.Replicas == 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Delivery == "" {
		c.Delivery = AtLeastOnce
	}
	if c.DuplicateWindow == 0 {
		c.DuplicateWindow = DefaultDuplicateWindow
		if c.MaxAge > 0 && c.MaxAge < c.DuplicateWindow {
			c.DuplicateWindow = c.MaxAge
		}
	}
	if c.IdempotencyTTL == 0 {
		c.IdempotencyTTL = max(DefaultIdempotencyTTL, c.MaxAge)
	}
	if c.MaxIdempotencyKeys == 0 {
		c.MaxIdempotencyKeys = DefaultMaxIdempotencyKeys
	}
	if c.MaxBody == 0 {
		c.MaxBody = DefaultMaxBody
	}
	if c.DeadLetterMaxAge == 0 {
		c.DeadLetterMaxAge = DefaultDeadLetterMaxAge
	}
	return c.lanesWithDefaults()
}

// ErrInvalidConfig wraps every configuration problem reported by Config.Validate.
var ErrInvalidConfig = errors.New("queue: invalid config")

// ConfigError is one problem of a Config. errors.Is(err, ErrInvalidConfig) holds for it.
type ConfigError struct {
	Queue string
	// Field is the setting at fault, named as in a rules file: max_bytes,
	// drop_headers, backoff…
	Field   string
	Problem string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("%v: queue %q: %s", ErrInvalidConfig, e.Queue, e.Problem)
}

// Is makes errors.Is(err, ErrInvalidConfig) true.
func (e *ConfigError) Is(target error) bool { return target == ErrInvalidConfig }

// Validate reports every problem of the configuration (after defaults) at once, joined
// with errors.Join; each is a *ConfigError. The rules package validates its queues
// with it, so a rules file and a library caller get the same answers.
func (c Config) Validate() error {
	c = c.WithDefaults()
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Queue: c.Name, Field: field, Problem: fmt.Sprintf(format, args...)})
	}
	if !nameRE.MatchString(c.Name) {
		bad("name", "name must be 1-64 characters of A-Z, a-z, 0-9, '_' or '-'")
	}
	if !c.Outflow.Valid() {
		bad("outflow", "outflow rate must be positive, for example 50/s")
	} else if c.Outflow.PerSecondFloat() > 1e6 {
		bad("outflow", "outflow rate %s is above 1,000,000/s", c.Outflow)
	}
	if c.MaxBytes < 0 {
		bad("max_bytes", "max_bytes must not be negative")
	}
	if c.MaxAge < 0 {
		bad("max_age", "max_age must not be negative")
	}
	if c.MaxAttempts < 1 {
		bad("max_attempts", "max_attempts must be at least 1")
	}
	if c.MaxInFlight < 1 || c.MaxInFlight > math.MaxInt32 {
		bad("max_in_flight", "max_in_flight must be at least 1")
	}
	if c.Backoff.Initial <= 0 {
		bad("backoff", "backoff initial must be positive")
	}
	if c.Backoff.Max < c.Backoff.Initial {
		bad("backoff", "backoff max (%s) is shorter than initial (%s)", c.Backoff.Max, c.Backoff.Initial)
	}
	if c.Replicas < 1 || c.Replicas > 5 {
		bad("replicas", "replicas must be between 1 and 5")
	}
	if c.DuplicateWindow < 0 {
		bad("duplicate_window", "duplicate window must not be negative")
	}
	if c.MaxAge > 0 && c.DuplicateWindow > c.MaxAge {
		bad("duplicate_window", "duplicate window (%s) is longer than max_age (%s)", c.DuplicateWindow, c.MaxAge)
	}
	if c.IdempotencyTTL < time.Second {
		bad("idempotency_ttl", "idempotency TTL must be at least 1s")
	}
	if c.MaxAge > 0 && c.IdempotencyTTL < c.MaxAge {
		bad("idempotency_ttl", "idempotency TTL (%s) is shorter than max_age (%s): a key would be forgotten while its message still waits", c.IdempotencyTTL, c.MaxAge)
	}
	if c.IdempotencyTTL < c.Backoff.Max {
		bad("idempotency_ttl", "idempotency TTL (%s) is shorter than the backoff max (%s)", c.IdempotencyTTL, c.Backoff.Max)
	}
	if err := validateDownstream(c.Downstream); err != nil {
		bad("downstream", "downstream: %v", err)
	}
	switch {
	case c.Delivery != AtLeastOnce && c.Delivery != AtMostOnce:
		bad("delivery", "delivery %q: use at_least_once or at_most_once", c.Delivery)
	case c.Delivery == AtMostOnce && c.NATSSubject() == "":
		bad("delivery", "delivery: at_most_once applies to nats: downstreams only")
	}
	if c.MaxBody < 1 || c.MaxBody > MaxMaxBody {
		bad("max_body", "max_body must be between 1 byte and 8MiB, got %d bytes", c.MaxBody)
	}
	for _, h := range c.DropHeaders {
		if !ValidHeaderName(h) {
			bad("drop_headers", "drop_headers: %q is not a header name", h)
		}
	}
	for _, h := range c.ResultHeaders {
		if err := CheckResultHeader(h); err != nil {
			bad("result_headers", "result_headers: %v", err)
		}
	}
	if c.MaxIdempotencyKeys < 1 || c.MaxIdempotencyKeys > MaxIdempotencyKeysLimit {
		bad("max_idempotency_keys", "max_idempotency_keys must be between 1 and %d", MaxIdempotencyKeysLimit)
	}
	for _, h := range c.CallbackHosts {
		if _, err := parseCallbackHost(h); err != nil {
			bad("callback_hosts", "callback_hosts: %v", err)
		}
	}
	switch _, err := webhook.ParseSecret(c.CallbackSecret); {
	case len(c.CallbackHosts) > 0 && c.CallbackSecret == "":
		bad("callback_secret", "callback_hosts needs a callback_secret to sign the callbacks (whsec_ and 32 random bytes in base64: echo whsec_$(openssl rand -base64 32))")
	case c.CallbackSecret != "" && len(c.CallbackHosts) == 0:
		bad("callback_secret", "callback_secret without callback_hosts: no callback could be sent")
	case c.CallbackSecret != "" && err != nil:
		bad("callback_secret", "callback_secret: %v", err)
	}
	if c.MaxDelay < 0 || c.MaxDelay > MaxScheduleDelay {
		bad("max_delay", "max_delay must be between 0 and %s, got %s", MaxScheduleDelay, c.MaxDelay)
	}
	if c.Delay < 0 || c.Delay > MaxScheduleDelay {
		bad("delay", "delay must be between 0 and %s, got %s", MaxScheduleDelay, c.Delay)
	}
	// JetStream's per-message TTLs count whole seconds.
	if c.DeadLetterMaxAge < time.Second {
		bad("dead_letter_max_age", "dead_letter_max_age must be at least 1s, got %s", c.DeadLetterMaxAge)
	}
	c.validateLanes(bad)
	c.validateFlow(bad)
	return errors.Join(errs...)
}

// NATSSubject returns the subject of a nats:SUBJECT downstream, or "".
func (c Config) NATSSubject() string {
	if s, ok := strings.CutPrefix(c.Downstream, "nats:"); ok {
		return s
	}
	return ""
}

// reservedSubjects are where no queue may deliver: sluice's own subjects (queues, key
// slots, dead letters, done and dead events) and NATS's ($JS, $KV, $SYS…). Work
// published there would forge sluice's messages or call the server's APIs.
var reservedSubjects = []string{"sluice.", "$"}

// validateDownstream is the one check of a downstream: the rules package reports its
// problems with their position. Messages never quote credentials.
func validateDownstream(d string) error {
	if d == "" {
		return errors.New("required: an http:// or https:// URL, or nats:SUBJECT")
	}
	if subj, ok := strings.CutPrefix(d, "nats:"); ok {
		return checkSubject(subj)
	}
	u, err := url.Parse(d)
	if err != nil {
		return errors.New("not a valid URL") // the error would quote it, credentials and all
	}
	shown := d
	if u.User != nil {
		shown = u.Redacted()
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("%q must be an http:// or https:// URL or nats:SUBJECT", shown)
	case u.Host == "" || u.Hostname() == "":
		return fmt.Errorf("URL %q has no host", shown)
	case u.User != nil:
		// Downstream URLs appear in logs and admin pages.
		return fmt.Errorf("URL %q must not carry credentials", shown)
	case u.RawQuery != "" || u.ForceQuery:
		return fmt.Errorf("URL %q must not have a query: it is a base URL, each order's own path and query are appended", shown)
	case u.Fragment != "":
		return fmt.Errorf("URL %q must not have a #fragment", shown)
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("URL %q has an invalid port", shown)
		}
	}
	return nil
}

// checkSubject accepts a literal NATS subject to publish on: dot-separated non-empty
// tokens, no wildcards, no white space, outside the reserved namespaces.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("nats: needs a subject, like nats:orders.paced")
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch {
		case tok == "":
			return fmt.Errorf("NATS subject %q has an empty token", s)
		case strings.ContainsAny(tok, "*>"):
			return fmt.Errorf("NATS subject %q has a wildcard; work is published on a literal subject", s)
		case strings.ContainsAny(tok, " \t\r\n\x00"):
			return fmt.Errorf("NATS subject %q contains white space", s)
		}
	}
	for _, reserved := range reservedSubjects {
		if strings.HasPrefix(s, reserved) {
			return fmt.Errorf("NATS subject %q is reserved: subjects that start with sluice. or $ belong to sluice and to NATS", s)
		}
	}
	return nil
}
