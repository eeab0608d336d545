package queue

import (
	"errors"
	"fmt"
	"time"
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
	// ErrInvalidConfig wraps every configuration problem reported by Config.Validate.
	ErrInvalidConfig = errors.New("queue: invalid config")
	// ErrInvalidRequest: a Request lacks a required field or has a malformed one.
	ErrInvalidRequest = errors.New("queue: invalid request")
)

// FullError is returned (wrapped) when a queue refuses a message because it is full.
// errors.Is(err, ErrFull) holds for it.
type FullError struct {
	Queue string
	// Depth is the number of queued messages when the message was refused.
	Depth uint64
	// RetryAfter is a suggested delay before trying again: the time the queue needs,
	// at its outflow rate, to drain a tenth of its depth (at least one second).
	RetryAfter time.Duration
}

func (e *FullError) Error() string {
	return fmt.Sprintf("queue %q is full (%d messages); retry after %s", e.Queue, e.Depth, e.RetryAfter)
}

// Is makes errors.Is(err, ErrFull) true.
func (e *FullError) Is(target error) bool { return target == ErrFull }

// RetryAfter returns the suggested retry delay of a *FullError in err's chain, or 0.
func RetryAfter(err error) time.Duration {
	var fe *FullError
	if errors.As(err, &fe) {
		return fe.RetryAfter
	}
	return 0
}
