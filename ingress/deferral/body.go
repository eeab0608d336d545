package deferral

import (
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/queue"
)

// DefaultBodyMemory is the default cap on the bytes of deferred bodies held in memory
// at once (see WithBodyMemory).
const DefaultBodyMemory = 64 << 20

// memoryRetryAfter is what a client is told to wait when the deferred bodies under way
// fill the memory budget: they are parked (and let go of) within moments.
const memoryRetryAfter = time.Second

// readChunk is how much of a body of unknown length is read, and reserved, at a time.
const readChunk = 32 << 10

// memoryBudget caps the bytes of deferred bodies held in memory at once. It never
// waits: a request that does not fit is refused at once, so a flood of large bodies
// costs the process no more than the budget, and no goroutine queues up behind it.
type memoryBudget struct {
	max  int64 // ≤ 0: no cap
	used atomic.Int64
}

// take reserves n bytes; false when they do not fit.
func (b *memoryBudget) take(n int64) bool {
	if b.max <= 0 || n <= 0 {
		return true
	}
	if b.used.Add(n) > b.max {
		b.used.Add(-n)
		return false
	}
	return true
}

// give returns n bytes reserved with take.
func (b *memoryBudget) give(n int64) {
	if b.max > 0 && n > 0 {
		b.used.Add(-n)
	}
}

// errNoMemory: the memory budget of deferred bodies is spent.
var errNoMemory = errors.New("ingress: deferred bodies use all of their memory")

// bodyTooLargeError: the body is larger than Limit allows.
type bodyTooLargeError struct{ Limit queue.BodyLimit }

func (e *bodyTooLargeError) Error() string { return "ingress: body larger than " + e.Limit.String() }

// readBody reads a deferred request's body, at most limit bytes, into memory reserved
// from the budget; the caller gives back the returned reservation once the body is
// parked. A Content-Length over the limit, or over what is left of the budget, is
// refused before a byte is read, and its memory is reserved as the body arrives (see
// readSized); a body of unknown length (chunked) is read and reserved a chunk at a
// time and refused as soon as it passes the limit. Errors: *bodyTooLargeError, *http.MaxBytesError (the
// middleware's --max-body), errNoMemory, or the read error.
func (b *memoryBudget) readBody(r *http.Request, limit queue.BodyLimit) (body []byte, reserved int64, err error) {
	if b.max > 0 && b.max < limit.Bytes {
		// A body the budget can never hold is too large, not "retry later".
		limit = queue.BodyLimit{Bytes: b.max, By: "--defer-memory"}
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, 0, nil
	}
	if n := r.ContentLength; n > 0 {
		if n > limit.Bytes {
			return nil, 0, &bodyTooLargeError{limit}
		}
		if !b.fits(n) {
			return nil, 0, errNoMemory
		}
		return b.readSized(r.Body, n)
	}
	return b.readUnsized(r.Body, limit)
}

// fits reports whether n more bytes fit in what is left of the budget now (nothing is
// reserved).
func (b *memoryBudget) fits(n int64) bool {
	return b.max <= 0 || b.used.Load()+n <= b.max
}

// readSized reads a body of n bytes (Content-Length) into a buffer that grows, each
// growth reserved before it is made, as the body arrives: a client that announces n
// bytes and sends them slowly, or never, holds only about what it sent (at most twice
// that, and a chunk), not n, until the server's read timeout ends it.
func (b *memoryBudget) readSized(r io.Reader, n int64) ([]byte, int64, error) {
	var (
		body     []byte
		reserved int64
	)
	for int64(len(body)) < n {
		if len(body) == cap(body) {
			grown := min(n, max(readChunk, 2*int64(cap(body))))
			if !b.take(grown - reserved) {
				b.give(reserved)
				return nil, 0, errNoMemory
			}
			reserved = grown
			body = append(make([]byte, 0, grown), body...)
		}
		m, err := io.ReadFull(r, body[len(body):cap(body)])
		body = body[:len(body)+m]
		if err != nil {
			b.give(reserved)
			return nil, 0, err
		}
	}
	return body, reserved, nil
}

// chunks holds the chunks of bodies of unknown length while they are read: a body that
// turns out too large, or is refused for memory, leaves them for the next one instead
// of garbage.
var chunks = sync.Pool{New: func() any { return new([readChunk]byte) }}

// readUnsized reads a body of unknown length a chunk at a time, reserving each chunk
// before it is read and stopping at limit+1 bytes, then copies it into one buffer (the
// chunks and the buffer are reserved together for that moment, so such a body can be
// at most half the budget).
func (b *memoryBudget) readUnsized(r io.Reader, limit queue.BodyLimit) ([]byte, int64, error) {
	if half := b.max / 2 / readChunk * readChunk; b.max > 0 && half < limit.Bytes {
		limit = queue.BodyLimit{Bytes: half, By: "--defer-memory"}
	}
	var (
		parts    []*[readChunk]byte
		total    int64
		reserved int64
	)
	defer func() {
		for _, c := range parts {
			chunks.Put(c)
		}
		b.give(reserved)
	}()
	for {
		if total > limit.Bytes {
			return nil, 0, &bodyTooLargeError{limit}
		}
		if !b.take(readChunk) {
			return nil, 0, errNoMemory
		}
		reserved += readChunk
		c := chunks.Get().(*[readChunk]byte)
		parts = append(parts, c)
		n, err := io.ReadFull(r, c[:min(readChunk, limit.Bytes+1-total)])
		total += int64(n)
		if n == 0 { // the end, found past a full chunk
			chunks.Put(c)
			parts = parts[:len(parts)-1]
			b.give(readChunk)
			reserved -= readChunk
		}
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			break
		}
		if err != nil {
			return nil, 0, err
		}
	}
	if total > limit.Bytes {
		return nil, 0, &bodyTooLargeError{limit}
	}
	if !b.take(total) {
		return nil, 0, errNoMemory
	}
	body := make([]byte, 0, total)
	for _, c := range parts {
		body = append(body, c[:min(readChunk, total-int64(len(body)))]...)
	}
	return body, total, nil
}

// drainLimit bounds what writeBodyError reads of a refused body, beside the
// middleware's --max-body.
const drainLimit = 32 << 20

// writeBodyError answers a body that readBody refused, at once, and only then reads
// what is left of it, into nothing (never into memory; at most --max-body and
// drainLimit): a client still sending its body would otherwise find the connection
// reset under it, which destroys the answer, and it would retry blindly. A client that
// waits for 100 Continue before sending has sent nothing more and is left alone.
func writeBodyError(w http.ResponseWriter, r *http.Request, err error) {
	rc := http.NewResponseController(w)
	// Lets the body be read after the answer is written (net/http would close it).
	duplex := rc.EnableFullDuplex() == nil
	w.Header().Set("Connection", "close")
	writeBodyProblem(w, err)
	if duplex && !strings.EqualFold(r.Header.Get("Expect"), "100-continue") {
		_ = rc.Flush()
		_, _ = io.CopyN(io.Discard, r.Body, drainLimit)
	}
}

func writeBodyProblem(w http.ResponseWriter, err error) {
	var tooLarge *bodyTooLargeError
	var maxBytes *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		ingress.WriteProblem(w, http.StatusRequestEntityTooLarge,
			"The request body is larger than "+strconv.FormatInt(tooLarge.Limit.Bytes, 10)+
				" bytes, the most this queue can store ("+tooLarge.Limit.By+").")
	case errors.As(err, &maxBytes):
		ingress.WriteProblem(w, http.StatusRequestEntityTooLarge,
			"The request body is larger than "+strconv.FormatInt(maxBytes.Limit, 10)+" bytes.")
	case errors.Is(err, errNoMemory):
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(memoryRetryAfter), 10))
		ingress.WriteProblem(w, http.StatusServiceUnavailable,
			"Too many large requests are being queued at once; nothing was accepted. Retry later.")
	default:
		ingress.WriteProblem(w, http.StatusBadRequest, "The request body could not be read.")
	}
}

// Option configures a Deferrer.
type Option func(*Deferrer)

// WithLogger sets where parking failures are logged (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(q *Deferrer) {
		if l != nil {
			q.log = l
		}
	}
}

// WithBodyMemory caps the bytes of deferred request bodies held in memory at once
// (default 64 MiB; 0 or less: no cap). A body that does not fit is answered 503 with
// Retry-After before it is read, or as soon as it outgrows what is left; one larger
// than the whole cap is 413.
func WithBodyMemory(n int64) Option {
	return func(q *Deferrer) { q.memory.max = n }
}
