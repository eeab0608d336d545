// Package deferral is the ingress's hand-off to the queue: a Deferrer that parks
// requests of defer rules in a queue.Store and answers 202 with a ticket, and the
// handlers by which clients follow (GET, with waits and event streams: WithWaits) and
// cancel (DELETE) their tickets. The ingress core knows only the ingress.Deferrer
// interface, so a program that rejects and never defers links no NATS.
package deferral

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"golang.org/x/net/http/httpguts"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/ingress/internal/warn"
	"github.com/sluicehq/sluice/ingress/ticket"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
)

// Parker is what the ingress needs of the queue package: *queue.Store is one.
type Parker interface {
	Park(ctx context.Context, req *queue.Request) (queue.Receipt, error)
	Status(ctx context.Context, ticket string) (*queue.Record, error)
	// BodyLimit is the largest body req may have to be stored (req.Body unset).
	BodyLimit(req *queue.Request) (queue.BodyLimit, error)
	Cancel(ctx context.Context, ticket string) error
}

// Path is where clients follow their tickets: Path + ticket.
const Path = "/sluice/v1/deferred/"

// Deferrer parks deferred requests with a Parker and serves their status. It is
// the ingress.Deferrer of `sluice serve`.
type Deferrer struct {
	parker Parker
	log    *slog.Logger
	memory memoryBudget
	// lookups limits each client's status and cancel requests (nil: no limit).
	lookups *lookupLimit
	// waits serves Prefer: wait and event streams of the status (nil: not offered).
	waits *waits
	// Warnings every refused request would repeat, logged at most once per
	// warnInterval.
	unavailable, keysFull *warn.Sometimes
}

// warnInterval is how often a warning that every refused request repeats (the queues
// unreachable, the key store full) is logged: once, then at most once per interval.
const warnInterval = 10 * time.Second

// New returns a deferrer that parks with p.
func New(p Parker, opts ...Option) *Deferrer {
	q := &Deferrer{parker: p, log: slog.Default(), memory: memoryBudget{max: DefaultBodyMemory},
		unavailable: warn.Every(warnInterval), keysFull: warn.Every(warnInterval)}
	for _, o := range opts {
		o(q)
	}
	if q.waits != nil {
		q.waits.log = q.log // whichever option came first
	}
	return q
}

// unavailableRetryAfter is what a client is told to wait when the queue cannot be
// reached: long enough for a NATS leader election or a restart.
const unavailableRetryAfter = 5 * time.Second

// Defer implements ingress.Deferrer. The client hears 202 Accepted only after JetStream has
// acknowledged the stored request; any doubt is a 503, never a 202.
func (q *Deferrer) Defer(w http.ResponseWriter, r *http.Request, d ingress.Deferral) {
	key, ok := idempotencyKey(r.Header)
	if !ok {
		ingress.WriteProblem(w, http.StatusBadRequest,
			"Idempotency-Key must be a structured-field string (or a token) of 1 to 255 printable characters.")
		return
	}
	// What the dispatcher could not deliver is refused now, not accepted and then
	// dead-lettered: a path such as "//host/x" or a query with a space.
	if err := queue.CheckTarget(r.URL.EscapedPath(), r.URL.RawQuery); err != nil {
		ingress.WriteProblem(w, http.StatusBadRequest, "This request cannot be queued: its "+err.Error()+".")
		return
	}
	// A callback the queue does not allow is refused before the body is read.
	callback := r.Header.Get(queue.HeaderCallback)
	if callback != "" {
		if _, err := d.Queue.CheckCallback(callback); err != nil {
			ingress.WriteProblem(w, http.StatusBadRequest, "Sluice-Callback: "+err.Error()+".")
			return
		}
	}
	received := time.Now()
	notBefore, ok := ParseNotBefore(r.Header.Values(ingress.HeaderNotBefore), received)
	if !ok {
		ingress.WriteProblem(w, http.StatusBadRequest,
			ingress.HeaderNotBefore+" must be one HTTP-date (like Sun, 06 Nov 1994 08:49:37 GMT) or a number of seconds from now.")
		return
	}
	header := d.ParkHeader(r)
	header.Del(ingress.HeaderNotBefore) // sluice's, not the downstream's
	// A header the dispatcher could not write (an ext_authz check can carry any): the
	// order would be accepted and never delivered.
	if !sendableHeader(header) {
		ingress.WriteProblem(w, http.StatusBadRequest,
			"This request cannot be queued: a header name is not a token, or a header value holds a control character.")
		return
	}
	req := newRequest(r, d, header, key)
	req.ReceivedAt, req.NotBefore, req.Callback = received, notBefore, callback
	// The body is read only as far as the queue can store it, into memory reserved
	// until it is parked.
	limit, err := q.parker.BodyLimit(req)
	if err != nil {
		q.parkFailed(w, d, err)
		return
	}
	body, reserved, err := q.memory.readBody(r, limit)
	defer q.memory.give(reserved)
	if err != nil {
		writeBodyError(w, r, err)
		return
	}
	req.Body = body
	receipt, err := q.parker.Park(r.Context(), req)
	if err != nil {
		q.parkFailed(w, d, err)
		return
	}
	q.writeAccepted(w, receipt)
}

// newRequest is the order r makes in d's queue, with header and the idempotency key
// key, but for its body and what only parking takes (time received, schedule,
// callback).
func newRequest(r *http.Request, d ingress.Deferral, header http.Header, key string) *queue.Request {
	return &queue.Request{
		Queue:          d.Queue.Name,
		Rule:           d.Rule.Name,
		Method:         r.Method,
		Path:           r.URL.EscapedPath(),
		RawQuery:       r.URL.RawQuery,
		Header:         header,
		Client:         d.Client,
		IdempotencyKey: key,
		Priority:       d.Priority,
		Tenant:         d.Tenant,
		Flow:           d.Flow,
	}
}

// writeAccepted answers 202 with receipt: a parked order, or a repeat of one.
func (q *Deferrer) writeAccepted(w http.ResponseWriter, receipt queue.Receipt) {
	ab := acceptedBody{
		Ticket:            receipt.Ticket,
		Queue:             receipt.Queue,
		Status:            string(receipt.Status),
		Position:          receipt.Position,
		EstimatedDelivery: receipt.EstimatedDelivery.UTC().Format(time.RFC3339),
		Duplicate:         receipt.Duplicate,
		Monitor:           Path + receipt.Ticket,
	}
	if q.waits != nil {
		ab.MonitorWait, ab.MonitorEvents = int64(q.waits.limits.Max/time.Second), true
	}
	if !receipt.NotBefore.IsZero() {
		ab.NotBefore = receipt.NotBefore.UTC().Format(time.RFC3339)
	}
	// The three values in one allocation; each slice is capped to its own.
	values := [...]string{ab.Monitor, "application/json", "no-store"}
	vs := values[:]
	h := w.Header()
	h["Location"], h["Content-Type"], h["Cache-Control"] = vs[0:1:1], vs[1:2:2], vs[2:3:3]
	w.WriteHeader(http.StatusAccepted)
	_, _ = w.Write(ab.appendJSON(make([]byte, 0, 320)))
}

// appendJSON appends ab's JSON to b as encoding/json's Encoder writes it (the fields in
// order, omitempty, its escaping of strings, a final newline), without reflection.
func (ab *acceptedBody) appendJSON(b []byte) []byte {
	b = append(b, `{"ticket":`...)
	b = appendJSONString(b, ab.Ticket)
	b = append(b, `,"queue":`...)
	b = appendJSONString(b, ab.Queue)
	if ab.Status != "" {
		b = append(b, `,"status":`...)
		b = appendJSONString(b, ab.Status)
	}
	b = append(b, `,"position":`...)
	b = strconv.AppendUint(b, ab.Position, 10)
	b = append(b, `,"estimated_delivery":`...)
	b = appendJSONString(b, ab.EstimatedDelivery)
	if ab.Duplicate {
		b = append(b, `,"duplicate":true`...)
	}
	b = append(b, `,"monitor":`...)
	b = appendJSONString(b, ab.Monitor)
	if ab.MonitorWait != 0 {
		b = append(b, `,"monitor_wait":`...)
		b = strconv.AppendInt(b, ab.MonitorWait, 10)
	}
	if ab.MonitorEvents {
		b = append(b, `,"monitor_events":true`...)
	}
	if ab.NotBefore != "" {
		b = append(b, `,"not_before":`...)
		b = appendJSONString(b, ab.NotBefore)
	}
	return append(b, "}\n"...)
}

// appendJSONString appends s as a JSON string, as encoding/json writes it: as it is
// when every byte is printable ASCII that needs no escape (a ticket, a queue name, a
// status, a path), else by encoding/json itself.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			quoted, _ := json.Marshal(s) // a string always encodes
			return append(b, quoted...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// Repeater is a Parker that answers a repeat without parking (*queue.Store is one):
// see queue.Store.Repeat.
type Repeater interface {
	Repeat(ctx context.Context, req *queue.Request) (queue.Receipt, bool, error)
}

// AnswerRepeat implements ingress.RepeatAnswerer with the Parker's Repeat (a Parker
// without it finds no repeats). The body is read, as far as the queue could store it,
// to tell the same payload from another; the request to proxy then carries it from
// memory. Not looked up, so proxied as before: a malformed key (the downstream's to
// judge), a body of unknown length (chunked) or larger than the queue takes (no order
// of the queue can have it), a body the deferred bodies' memory has no room for, and
// any request while the queue cannot be asked (NATS away: allowed requests are
// proxied then, see the README's failure table).
func (q *Deferrer) AnswerRepeat(w http.ResponseWriter, r *http.Request, d ingress.Deferral) (_ *http.Request, answered bool) {
	rp, ok := q.parker.(Repeater)
	if !ok {
		return r, false
	}
	key, ok := idempotencyKey(r.Header)
	if !ok || key == "" {
		return r, false
	}
	req := newRequest(r, d, d.ParkHeader(r), key)
	hasBody := r.Body != nil && r.Body != http.NoBody && r.ContentLength != 0
	if hasBody {
		limit, err := q.parker.BodyLimit(req)
		if err != nil || r.ContentLength < 0 || r.ContentLength > limit.Bytes || !q.memory.fits(r.ContentLength) {
			return r, false
		}
		body, reserved, err := q.memory.readSized(r.Body, r.ContentLength)
		if err != nil {
			writeBodyError(w, r, err) // the body broke off: nothing can be proxied either
			return r, true
		}
		// The copy is what is proxied: it counts against the budget until the
		// upstream has taken it (Close) or the request is over, whichever is first.
		var once sync.Once
		give := func() { once.Do(func() { q.memory.give(reserved) }) }
		stop := context.AfterFunc(r.Context(), give)
		req.Body = body
		read := *r
		read.Body = &budgetedBody{Reader: bytes.NewReader(body), release: func() { stop(); give() }}
		r = &read
		defer func() {
			if answered {
				read.Body.Close() // not proxied: the copy is done with
			}
		}()
	}
	receipt, found, err := rp.Repeat(r.Context(), req)
	switch {
	case errors.Is(err, queue.ErrIdempotencyConflict):
		q.parkFailed(w, d, err)
		return r, true
	case err != nil:
		q.log.Debug("cannot look up an idempotency key on the proxy path; proxying", "queue", d.Queue.Name, "err", err)
		return r, false
	case !found:
		return r, false
	}
	q.writeAccepted(w, receipt)
	return r, true
}

// budgetedBody is a body held in memory reserved from the budget: Close gives the
// reservation back (once).
type budgetedBody struct {
	*bytes.Reader
	release func()
}

func (b *budgetedBody) Close() error {
	b.release()
	return nil
}

// sendableHeader reports whether every field of h can be written on an HTTP request
// by the dispatcher's client: it checks them as net/http's does (httpguts).
func sendableHeader(h http.Header) bool {
	for k, vs := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vs {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}

// maxNotBeforeSeconds caps a delta-seconds Sluice-Not-Before: anything longer is
// beyond every queue's max_delay anyway, and the cap keeps the sum from overflowing.
const maxNotBeforeSeconds = int64(queueconfig.MaxScheduleDelay/time.Second) + 1

// ParseNotBefore reads the Sluice-Not-Before values of a request received at now: one
// HTTP-date (any of the three forms of RFC 9110, section 5.6.7) or a non-negative
// decimal number of seconds from now (as Retry-After). No value: the zero time, ok.
// More than one value, or a malformed one: ok is false. Longer delays than
// queueconfig.MaxScheduleDelay are clamped just above it (every queue refuses them).
func ParseNotBefore(values []string, now time.Time) (t time.Time, ok bool) {
	switch len(values) {
	case 0:
		return time.Time{}, true
	case 1:
	default:
		return time.Time{}, false
	}
	v := strings.TrimSpace(values[0])
	if v == "" {
		return time.Time{}, false
	}
	if strings.Trim(v, "0123456789") == "" {
		if len(v) > 19 {
			return now.Add(time.Duration(maxNotBeforeSeconds) * time.Second), true
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return time.Time{}, false
		}
		return now.Add(time.Duration(min(n, maxNotBeforeSeconds)) * time.Second), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// acceptedBody is the JSON of a 202. appendJSON writes it: a field added here is
// added there (TestAcceptedJSON compares the two).
type acceptedBody struct {
	Ticket            string `json:"ticket"`
	Queue             string `json:"queue"`
	Status            string `json:"status,omitempty"` // empty: a repeat of an order settled long ago
	Position          uint64 `json:"position"`
	EstimatedDelivery string `json:"estimated_delivery"`
	Duplicate         bool   `json:"duplicate,omitempty"`
	Monitor           string `json:"monitor"`
	// MonitorWait is the longest Prefer: wait the monitor honours, in seconds, and
	// MonitorEvents says it streams the status (Accept: text/event-stream); both
	// absent without WithWaits.
	MonitorWait   int64 `json:"monitor_wait,omitempty"`
	MonitorEvents bool  `json:"monitor_events,omitempty"`
	// NotBefore is a scheduled order's due time (status "scheduled").
	NotBefore string `json:"not_before,omitempty"`
}

// fullDetail says which limit refused an order: its tenant's lane (tenant_max_depth),
// or the queue's max_depth or max_bytes.
func fullDetail(queueName string, err error) string {
	var fe *queue.FullError
	if !errors.As(err, &fe) {
		return "The queue " + queueName + " is full"
	}
	switch fe.Limit {
	case "tenant_max_depth":
		return "This tenant's lane of the queue " + queueName + " is full: it holds " + strconv.FormatUint(fe.Depth, 10) +
			" orders, the most one tenant may have waiting (tenant_max_depth " + strconv.FormatInt(fe.Max, 10) + "); other tenants' orders are still taken"
	case "max_depth":
		return "The queue " + queueName + " is full: it holds " + strconv.FormatUint(fe.Depth, 10) + " orders (max_depth " + strconv.FormatInt(fe.Max, 10) + ")"
	case "max_bytes":
		return "The queue " + queueName + " is full: its orders take the bytes it may store (max_bytes " + strconv.FormatInt(fe.Max, 10) + ")"
	}
	return "The queue " + queueName + " is full"
}

func (q *Deferrer) parkFailed(w http.ResponseWriter, d ingress.Deferral, err error) {
	var unacked *queue.UnacknowledgedError
	switch {
	case errors.Is(err, queue.ErrIdempotencyConflict):
		ingress.WriteProblem(w, http.StatusUnprocessableEntity,
			"This Idempotency-Key was used before with a different request.")
	case errors.Is(err, queue.ErrFull):
		wait := max(queue.RetryAfter(err), time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(wait), 10))
		ingress.WriteProblem(w, http.StatusTooManyRequests,
			fullDetail(d.Queue.Name, err)+"; retry in "+strconv.FormatInt(decide.RetryAfterSeconds(wait), 10)+" s.")
	case errors.Is(err, queue.ErrTooManyKeys):
		wait := max(queue.RetryAfter(err), time.Second)
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(wait), 10))
		ingress.WriteProblem(w, http.StatusTooManyRequests,
			"Too many idempotency keys: this client has used the "+strconv.Itoa(d.Queue.MaxIdempotencyKeys)+
				" Idempotency-Keys the queue "+d.Queue.Name+" accepts per client (max_idempotency_keys) within "+
				d.Queue.IdempotencyTTL.String()+"; retry in "+strconv.FormatInt(decide.RetryAfterSeconds(wait), 10)+" s.")
	case errors.Is(err, queue.ErrKeyStoreFull):
		q.keysFull.Warn(q.log, "idempotency key store full", "queue", d.Queue.Name, "err", err)
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
		ingress.WriteProblem(w, http.StatusServiceUnavailable,
			"The idempotency key store is full; nothing was accepted. Retry later.")
	case errors.Is(err, queue.ErrSchedule):
		var se *queue.ScheduleError
		detail := "The queue " + d.Queue.Name + " takes no scheduled orders (" + ingress.HeaderNotBefore + ")."
		if errors.As(err, &se) && se.MaxDelay > 0 {
			detail = ingress.HeaderNotBefore + " is too far ahead: the queue " + d.Queue.Name + " delivers at most " +
				strconv.FormatInt(int64(se.MaxDelay/time.Second), 10) + " s (max_delay " + se.MaxDelay.String() + ") after receipt."
		}
		ingress.WriteProblem(w, http.StatusBadRequest, detail)
	case errors.Is(err, queue.ErrInvalidRequest):
		ingress.WriteProblem(w, http.StatusBadRequest, "This request cannot be queued.")
	case errors.Is(err, queue.ErrHeaderTooLarge):
		// Never stored however often it is sent: not a 503 to retry.
		detail := "The request's headers are too large to be queued."
		var he *queue.HeaderLimitError
		if errors.As(err, &he) {
			detail = "The request's headers are too large to be queued: stored with the order they take " +
				strconv.FormatInt(he.Size, 10) + " bytes, and the queue " + d.Queue.Name + " stores at most " +
				strconv.FormatInt(he.Limit, 10) + " (" + he.By + ")."
		}
		ingress.WriteProblem(w, http.StatusRequestHeaderFieldsTooLarge, detail)
	case errors.Is(err, queue.ErrTooLarge):
		ingress.WriteProblem(w, http.StatusRequestEntityTooLarge,
			"The request is too large to be queued: the NATS server refuses a message this large (its max payload).")
	case errors.As(err, &unacked):
		// The order may be stored: its client learns its ticket, and how to send it again safely.
		if errors.Is(err, context.Canceled) {
			// Its client left while the order was written: no sign of the queue's
			// health, and a warning here would stand in for an outage's.
			q.log.Debug("deferring not acknowledged: the client left", "queue", d.Queue.Name, "rule", d.Rule.Name, "ticket", unacked.Ticket)
		} else {
			q.unavailable.Warn(q.log, "deferring not acknowledged", "queue", d.Queue.Name, "rule", d.Rule.Name, "err", err)
		}
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
		again := " Sending it again without an Idempotency-Key may deliver it twice."
		if unacked.Keyed {
			again = " Sending it again with the same Idempotency-Key is safe: it is delivered once."
		}
		ingress.WriteTicketProblem(w, http.StatusServiceUnavailable,
			"The queue did not acknowledge the request in time: it may have been accepted as ticket "+unacked.Ticket+
				" (GET "+Path+unacked.Ticket+" tells, once the queue answers again)."+again, unacked.Ticket)
	default:
		// ErrUnavailable, an undeclared queue, anything else: nothing was accepted.
		q.unavailable.Warn(q.log, "deferring failed", "queue", d.Queue.Name, "rule", d.Rule.Name, "err", err)
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
		ingress.WriteProblem(w, http.StatusServiceUnavailable,
			"The request could not be queued; nothing was accepted. Retry later.")
	}
}

// idempotencyKey reads the Idempotency-Key header of the IETF draft: a structured-field
// string ("…"). Clients that send the key bare, as many APIs accept, are understood too
// when it is a plain token. ok is false for a malformed key; an absent header is ok.
func idempotencyKey(h http.Header) (key string, ok bool) {
	values := h.Values("Idempotency-Key")
	if len(values) == 0 {
		return "", true
	}
	if len(values) > 1 {
		return "", false
	}
	v := strings.TrimSpace(values[0])
	if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
		var b strings.Builder
		for i := 1; i < len(v)-1; i++ {
			c := v[i]
			switch {
			case c == '\\' && i+1 < len(v)-1 && (v[i+1] == '"' || v[i+1] == '\\'):
				i++
				b.WriteByte(v[i])
			case c == '"' || c == '\\' || c < 0x20 || c > 0x7e:
				return "", false
			default:
				b.WriteByte(c)
			}
		}
		key = b.String()
	} else {
		for i := 0; i < len(v); i++ {
			if c := v[i]; c <= 0x20 || c > 0x7e || c == '"' || c == ',' || c == ';' || c == '\\' {
				return "", false
			}
		}
		key = v
	}
	return key, len(key) >= 1 && len(key) <= 255
}

// statusOf is the JSON of GET Path{ticket} for rec.
func statusOf(rec *queue.Record) *ticket.Status {
	body := &ticket.Status{Ticket: rec.Ticket, Queue: rec.Queue, Status: string(rec.Status), Attempts: rec.Attempts,
		LastError: rec.LastError, Position: rec.Position, ReceivedAt: rec.ReceivedAt, UpdatedAt: rec.UpdatedAt}
	if !rec.NextAttemptAt.IsZero() && !rec.Status.Final() {
		body.NextTry = &rec.NextAttemptAt
	}
	if rec.Status == queue.StatusScheduled && !rec.NotBefore.IsZero() {
		due := decide.RetryAfterSeconds(max(time.Until(rec.NotBefore), 0))
		body.NotBefore, body.DueIn = &rec.NotBefore, &due
	}
	if res := rec.Result; res != nil {
		body.Result = &ticket.Result{Status: res.StatusCode, Headers: res.Header, Truncated: res.Truncated, Subject: res.Subject}
		if utf8.Valid(res.Body) {
			body.Result.Body = string(res.Body)
		} else {
			body.Result.BodyBase64 = res.Body
		}
	}
	return body
}

// StatusHandler serves GET Path{ticket}: the ticket's status, attempts and last
// error, Retry-After while it is not final, and once delivered the downstream's
// status, headers and body (capped). The ticket, 128 random bits, is the capability:
// whoever holds it may read the status. With WithWaits, a client may ask for the
// answer once the status is final (Prefer: wait=N) or for a stream of its changes
// (Accept: text/event-stream): see WithWaits.
func (q *Deferrer) StatusHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ticket := strings.TrimPrefix(r.URL.Path, Path)
		if !queue.ValidTicket(ticket) {
			ingress.WriteProblem(w, http.StatusNotFound, "No such ticket.")
			return
		}
		if !q.lookups.allow(w, r) {
			return
		}
		rec, err := q.parker.Status(r.Context(), ticket)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			ingress.WriteProblem(w, http.StatusNotFound, "No such ticket (tickets are kept for a limited time).")
			return
		case err != nil:
			w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
			ingress.WriteProblem(w, http.StatusServiceUnavailable, "The ticket's status cannot be read now.")
			return
		}
		if q.waits != nil {
			rec = q.waits.serve(w, r, rec)
			if rec == nil {
				return // streamed, or refused
			}
		}
		writeStatus(w, rec)
	})
}

// writeStatus answers rec as the JSON of GET Path{ticket}.
func writeStatus(w http.ResponseWriter, rec *queue.Record) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	if !rec.Status.Final() {
		h.Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(max(rec.RetryAfter, time.Second)), 10))
	}
	_ = json.NewEncoder(w).Encode(statusOf(rec))
}

// CancelHandler serves DELETE Path{ticket}: the ticket holder cancels an order
// that is still queued. 204: cancelled (also when it was already), and it is never
// delivered. 409: delivering or final (the problem says which). 404: unknown ticket.
// 503 with Retry-After: NATS unreachable, or a dispatcher took the order at the same
// moment and has not settled it yet (asking again is safe: the answer is then 204 or
// 409). As for status, the ticket (128 random bits) is the capability.
func (q *Deferrer) CancelHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ticket := strings.TrimPrefix(r.URL.Path, Path)
		if !queue.ValidTicket(ticket) {
			ingress.WriteProblem(w, http.StatusNotFound, "No such ticket.")
			return
		}
		if !q.lookups.allow(w, r) {
			return
		}
		err := q.parker.Cancel(r.Context(), ticket)
		switch {
		case err == nil:
			w.Header().Set("Cache-Control", "no-store")
			w.WriteHeader(http.StatusNoContent)
		case errors.Is(err, queue.ErrNotFound):
			ingress.WriteProblem(w, http.StatusNotFound, "No such ticket (tickets are kept for a limited time).")
		case errors.Is(err, queue.ErrNotCancellable):
			ingress.WriteProblem(w, http.StatusConflict, "The order can no longer be cancelled: "+
				strings.TrimPrefix(err.Error(), queue.ErrNotCancellable.Error()+": ")+".")
		case errors.Is(err, queue.ErrCancelUndecided):
			w.Header().Set("Retry-After", "1")
			ingress.WriteProblem(w, http.StatusServiceUnavailable,
				"A dispatcher took the order as it was cancelled; ask again to learn whether the cancellation held.")
		default:
			q.log.Warn("cancel failed", "err", err)
			w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
			ingress.WriteProblem(w, http.StatusServiceUnavailable, "The order cannot be cancelled now; retry later.")
		}
	})
}
