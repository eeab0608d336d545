package queue

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Sentinel errors. Functions wrap them with %w; test with errors.Is.
var (
	// ErrFull: the queue is at its max_depth or max_bytes and refuses the message
	// (ingress: 429). The error is a *FullError carrying a suggested retry delay.
	ErrFull = errors.New("queue: full")
	// ErrUnavailable: NATS / JetStream could not be reached or did not acknowledge in
	// time; nothing was accepted (ingress: 503).
	ErrUnavailable = errors.New("queue: unavailable")
	// ErrStorageFull: JetStream storage is at the high-water mark (see WithStoreLimit)
	// or refused the write for want of space. Park wraps it together with
	// ErrUnavailable (ingress: 503): nothing was accepted.
	ErrStorageFull = errors.New("queue: storage full")
	// ErrNoStream: the nats:SUBJECT downstream of an at-least-once queue is captured by
	// no JetStream stream, so a publish could not be acknowledged (Declare).
	ErrNoStream = errors.New("queue: no JetStream stream captures the downstream subject")
	// ErrIdempotencyConflict: the idempotency key was used before by the same client
	// with a different payload (ingress: 422).
	ErrIdempotencyConflict = errors.New("queue: idempotency key reused with a different payload")
	// ErrNotFound: unknown (or expired) ticket, or no such dead letter.
	ErrNotFound = errors.New("queue: not found")
	// ErrUnknownQueue: the named queue was not declared on this Store.
	ErrUnknownQueue = errors.New("queue: unknown queue")
	// ErrTooLarge: the message is larger than the NATS server accepts (ingress: 413).
	ErrTooLarge = errors.New("queue: message too large")
	// ErrHeaderTooLarge: the request's headers, as its parked message stores them,
	// exceed what the NATS server stores (ingress: 431); the error is a
	// *HeaderLimitError naming the limit. It matches ErrTooLarge too.
	ErrHeaderTooLarge = fmt.Errorf("%w: headers too large", ErrTooLarge)
	// ErrInvalidConfig is queueconfig.ErrInvalidConfig: every problem of a queue's
	// configuration, of a stored one, or of a Store option wraps it.
	ErrInvalidConfig = queueconfig.ErrInvalidConfig
	// ErrInvalidRequest: a Request lacks a required field or has a malformed one.
	ErrInvalidRequest = errors.New("queue: invalid request")
	// ErrNotCancellable: Cancel found the order past queued (delivering or final).
	ErrNotCancellable = errors.New("queue: the order is no longer queued")
	// ErrCancelUndecided: Cancel recorded the cancellation, but a dispatcher had
	// already taken the order and has not settled it yet; the ticket's status will
	// say cancelled or what the delivery gave. Asking again is safe.
	ErrCancelUndecided = errors.New("queue: a dispatcher holds the order; cancellation undecided")
	// ErrCancelled: Lease.Start found the ticket cancelled; it must not be delivered.
	ErrCancelled = errors.New("queue: the order was cancelled")
	// ErrNoDispatcher: the queue has no consumer yet (no dispatcher ever ran it), so
	// it cannot be paused or resumed.
	ErrNoDispatcher = errors.New("queue: no dispatcher has attached to the queue yet")
	// ErrDeclared: Retire was asked for a queue that the rules still declare.
	ErrDeclared = errors.New("queue: the queue is declared by the rules")
	// ErrNotEmpty: Retire was asked for a queue that still holds orders or dead letters.
	ErrNotEmpty = errors.New("queue: the queue still holds orders")
	// ErrTooManyKeys: the client scope has MaxIdempotencyKeys keys accepted in the
	// queue within IdempotencyTTL (ingress: 429). The error is a *KeyLimitError.
	ErrTooManyKeys = errors.New("queue: too many idempotency keys for this client")
	// ErrNotAcknowledged: Park sent the order to JetStream and no answer came before
	// its deadline (the publish timeout, or the caller's context): the order may have
	// been stored, and if it was, it is delivered. The error is an
	// *UnacknowledgedError naming the order's ticket, whose Status tells once the
	// server answers again; a keyed order is safely sent again with its key, which
	// finds it. It matches ErrUnavailable too (ingress: 503).
	ErrNotAcknowledged = fmt.Errorf("%w: not acknowledged", ErrUnavailable)
	// ErrKeyStoreFull: the idempotency bucket is at its byte cap; nothing was accepted
	// (ingress: 503). It matches ErrUnavailable too.
	ErrKeyStoreFull = fmt.Errorf("%w: the idempotency key store is full", ErrUnavailable)
	// ErrForged: a parked message or a stored record does not carry this store's
	// signature (written by someone without the signing key, altered, or signed with
	// another key). It must not be acted on.
	ErrForged = errors.New("queue: forged")
	// ErrSchedule: a Request's NotBefore is refused: the queue takes no client
	// schedules (MaxDelay 0) or the time is further away than its MaxDelay (ingress:
	// 400). The error is a *ScheduleError.
	ErrSchedule = errors.New("queue: delivery time refused")
)

// ScheduleError is returned (wrapped) when Park refuses a Request's NotBefore.
// errors.Is(err, ErrSchedule) holds for it.
type ScheduleError struct {
	Queue string
	// MaxDelay is the queue's bound (0: the queue takes no client schedules).
	MaxDelay time.Duration
	// Asked is how far ahead of the request's receipt the client asked.
	Asked time.Duration
}

func (e *ScheduleError) Error() string {
	if e.MaxDelay <= 0 {
		return fmt.Sprintf("queue %q takes no scheduled orders (max_delay is not set)", e.Queue)
	}
	return fmt.Sprintf("queue %q delivers at most %s after receipt (max_delay); asked for %s", e.Queue, e.MaxDelay, e.Asked.Round(time.Second))
}

// Is makes errors.Is(err, ErrSchedule) true.
func (e *ScheduleError) Is(target error) bool { return target == ErrSchedule }

// UnacknowledgedError is returned by Park when JetStream did not answer the order's
// publish in time: the order may be stored as Ticket. errors.Is(err,
// ErrNotAcknowledged) and errors.Is(err, ErrUnavailable) hold for it.
type UnacknowledgedError struct {
	Queue  string
	Ticket string
	// Keyed is true for an order with an Idempotency-Key: sending it again with the
	// key gets its ticket if it was stored, and stores it once if not.
	Keyed bool
	// Err is the publish's own error (a deadline, a cancelled context).
	Err error
}

func (e *UnacknowledgedError) Error() string {
	return fmt.Sprintf("queue: unavailable: publish to %q not acknowledged, the order may be stored as ticket %s: %v", e.Queue, e.Ticket, e.Err)
}

// Is makes errors.Is(err, ErrNotAcknowledged) and errors.Is(err, ErrUnavailable) true.
func (e *UnacknowledgedError) Is(target error) bool {
	return target == ErrNotAcknowledged || target == ErrUnavailable
}

func (e *UnacknowledgedError) Unwrap() error { return e.Err }

// KeyLimitError is returned (wrapped) when a client scope has used up its idempotency
// keys in a queue. errors.Is(err, ErrTooManyKeys) holds for it.
type KeyLimitError struct {
	Queue string
	// Limit is the queue's MaxIdempotencyKeys.
	Limit int
	// RetryAfter is when the client's oldest key slot expires.
	RetryAfter time.Duration
}

func (e *KeyLimitError) Error() string {
	return fmt.Sprintf("queue %q: this client has %d idempotency keys within the idempotency TTL, the most allowed; retry after %s",
		e.Queue, e.Limit, e.RetryAfter)
}

// Is makes errors.Is(err, ErrTooManyKeys) true.
func (e *KeyLimitError) Is(target error) bool { return target == ErrTooManyKeys }

// FullError is returned (wrapped) when a queue refuses a message because it is full.
// errors.Is(err, ErrFull) holds for it.
type FullError struct {
	Queue string
	// Depth is the number of queued messages when the message was refused.
	Depth uint64
	// RetryAfter is a suggested delay before trying again: the time the queue needs,
	// at its outflow rate, to drain a tenth of its depth (at least one second).
	RetryAfter time.Duration
	// Lane is set when the order's tenant lane was full (TenantMaxDepth), not the
	// queue; Depth is then the lane's.
	Lane string
	// Limit names the limit reached, as the rules file spells it: tenant_max_depth,
	// max_depth or max_bytes (empty: the stream's own, or one no longer configured);
	// Max is its value (orders, or bytes for max_bytes).
	Limit string
	Max   int64
}

func (e *FullError) Error() string {
	limit := ""
	if e.Limit != "" {
		limit = fmt.Sprintf(", %s %d", e.Limit, e.Max)
	}
	if e.Lane != "" {
		return fmt.Sprintf("queue %q: the tenant lane is full (%d messages%s); retry after %s", e.Queue, e.Depth, limit, e.RetryAfter)
	}
	return fmt.Sprintf("queue %q is full (%d messages%s); retry after %s", e.Queue, e.Depth, limit, e.RetryAfter)
}

// Is makes errors.Is(err, ErrFull) true.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// RetryAfter returns the suggested retry delay of a *FullError or *KeyLimitError in
// err's chain, or 0.
func RetryAfter(err error) time.Duration {
	var fe *FullError
	if errors.As(err, &fe) {
		return fe.RetryAfter
	}
	var ke *KeyLimitError
	if errors.As(err, &ke) {
		return ke.RetryAfter
	}
	return 0
}
