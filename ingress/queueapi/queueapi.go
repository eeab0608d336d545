// Package queueapi serves the queue operations of the admin listener (see
// ingress.Admin.Queues): listing, pausing, resuming and retiring queues, and their dead
// letters.
package queueapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/decide"
	"github.com/sluicehq/sluice/queue"
)

// API serves the queue operations of the admin listener (see openapi.json):
//
//	GET    /sluice/v1/queues                    every queue: depth, outflow, pause, orphaned
//	GET    /sluice/v1/queues/{q}                one queue
//	POST   /sluice/v1/queues/{q}/pause          pause until (RFC 3339) or for (duration)
//	POST   /sluice/v1/queues/{q}/resume         end any pause (also a downstream's)
//	POST   /sluice/v1/queues/{q}/retire         delete an orphaned queue (drop=true: non-empty)
//	GET    /sluice/v1/queues/{q}/flows          the flow keys with settings or orders, paged
//	GET    /sluice/v1/queues/{q}/flows/{k}      one flow key: settings, depth, rate
//	POST   /sluice/v1/queues/{q}/flows/{k}/pause   pause one flow key (until or for)
//	POST   /sluice/v1/queues/{q}/flows/{k}/resume  end that pause
//	PUT    /sluice/v1/queues/{q}/flows/{k}/rate    pin the key's rate ({"rate": "2/s"})
//	DELETE /sluice/v1/queues/{q}/flows/{k}/rate    back to the queue's flow_by rate
//	GET    /sluice/v1/queues/{q}/dead           dead letters
//	POST   /sluice/v1/queues/{q}/dead/requeue   requeue tickets (or all)
//	DELETE /sluice/v1/queues/{q}/dead           purge tickets (or all); confirm=true
//
// Pauses are the queue consumer's pause on the server, so they hold on every replica.
type API struct {
	// Store gives the queue store: nil until the queues are declared (NATS may come
	// later than the process); the API answers 503 meanwhile, as without a Store.
	Store interface{ Load() *queue.Store }
	Log   *slog.Logger
}

func (a *API) store() *queue.Store {
	if a.Store == nil {
		return nil
	}
	return a.Store.Load()
}

// whenOpen answers 503 until the store is open (it never closes again).
func (a *API) whenOpen(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.store() == nil {
			w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
			ingress.WriteProblem(w, http.StatusServiceUnavailable, "The queues are not declared yet: NATS is not reachable.")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// unavailableRetryAfter is what a client is told to wait when NATS cannot be
// reached: long enough for a leader election or a restart (as the deferrer's).
const unavailableRetryAfter = 5 * time.Second

// Queue API limits.
const (
	// maxAdminBody caps request bodies of the admin API.
	maxAdminBody = 1 << 20
	// maxPause is the longest pause an operator can set.
	maxPause = 366 * 24 * time.Hour
	// defaultDeadLimit and maxDeadLimit bound a dead-letter listing.
	defaultDeadLimit = 100
	maxDeadLimit     = 10_000
)

// Routes returns the queue API's endpoints.
func (a *API) Routes() []ingress.Route {
	routes := []ingress.Route{
		{Pattern: "GET /sluice/v1/queues", Handler: http.HandlerFunc(a.list)},
		{Pattern: "GET /sluice/v1/queues/{queue}", Handler: a.withQueue(a.show)},
		{Pattern: "POST /sluice/v1/queues/{queue}/pause", Handler: a.withQueue(a.pause)},
		{Pattern: "POST /sluice/v1/queues/{queue}/resume", Handler: a.withQueue(a.resume)},
		{Pattern: "POST /sluice/v1/queues/{queue}/retire", Handler: http.HandlerFunc(a.retire)},
		{Pattern: "GET /sluice/v1/queues/{queue}/flows", Handler: a.withQueue(a.flows)},
		{Pattern: "GET /sluice/v1/queues/{queue}/flows/{key}", Handler: a.withQueue(a.flow)},
		{Pattern: "POST /sluice/v1/queues/{queue}/flows/{key}/pause", Handler: a.withQueue(a.flowPause)},
		{Pattern: "POST /sluice/v1/queues/{queue}/flows/{key}/resume", Handler: a.withQueue(a.flowResume)},
		{Pattern: "PUT /sluice/v1/queues/{queue}/flows/{key}/rate", Handler: a.withQueue(a.flowRate)},
		{Pattern: "DELETE /sluice/v1/queues/{queue}/flows/{key}/rate", Handler: a.withQueue(a.flowRate)},
		{Pattern: "GET /sluice/v1/queues/{queue}/dead", Handler: http.HandlerFunc(a.deadList)},
		{Pattern: "POST /sluice/v1/queues/{queue}/dead/requeue", Handler: http.HandlerFunc(a.requeue)},
		{Pattern: "DELETE /sluice/v1/queues/{queue}/dead", Handler: http.HandlerFunc(a.purge)},
	}
	for i := range routes {
		routes[i].Handler = a.whenOpen(routes[i].Handler)
	}
	return routes
}

// QueueView is the JSON of one queue.
type QueueView struct {
	Name              string     `json:"name"`
	Orphaned          bool       `json:"orphaned"`
	Depth             uint64     `json:"depth"`
	Bytes             uint64     `json:"bytes"`
	OldestWaitSeconds float64    `json:"oldest_wait_seconds"`
	InFlight          int        `json:"in_flight"`
	PausedUntil       *time.Time `json:"paused_until,omitempty"`
	Outflow           struct {
		Configured          string  `json:"configured"`
		ConfiguredPerSecond float64 `json:"configured_per_second"`
		// Achieved: orders that left the queue per second (delivered, failed,
		// dead-lettered or cancelled) over AchievedOverSeconds, at most the last
		// minute, on every replica. Absent until measured.
		AchievedPerSecond   *float64 `json:"achieved_per_second,omitempty"`
		AchievedOverSeconds float64  `json:"achieved_over_seconds"`
	} `json:"outflow"`
	MaxDepth    int64  `json:"max_depth"`
	MaxAttempts int    `json:"max_attempts"`
	Downstream  string `json:"downstream"`
}

func newQueueView(in queue.Info, now time.Time) QueueView {
	v := QueueView{Name: in.Name, Orphaned: in.Orphaned, Depth: in.Depth, Bytes: in.Bytes, InFlight: in.InFlight,
		MaxDepth: in.Config.MaxDepth, MaxAttempts: in.Config.MaxAttempts, Downstream: in.Config.Downstream}
	if !in.Oldest.IsZero() {
		v.OldestWaitSeconds = max(now.Sub(in.Oldest), 0).Seconds()
	}
	if !in.PausedUntil.IsZero() {
		v.PausedUntil = &in.PausedUntil
	}
	v.Outflow.Configured = in.Config.Outflow.String()
	v.Outflow.ConfiguredPerSecond = in.Config.Outflow.PerSecondFloat()
	if in.AchievedOver > 0 {
		v.Outflow.AchievedPerSecond = &in.Achieved
		v.Outflow.AchievedOverSeconds = in.AchievedOver.Seconds()
	}
	return v
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	qs := a.store().Queues()
	slices.SortFunc(qs, func(x, y *queue.Queue) int { return cmp.Compare(x.Name(), y.Name()) })
	out := struct {
		Queues []QueueView `json:"queues"`
	}{Queues: []QueueView{}}
	now := time.Now()
	for _, q := range qs {
		in, err := q.Info(r.Context())
		if errors.Is(err, queue.ErrUnknownQueue) {
			continue // retired meanwhile
		}
		if err != nil {
			a.fail(w, err)
			return
		}
		out.Queues = append(out.Queues, newQueueView(in, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// withQueue resolves {queue} to a queue of the store (404 otherwise).
func (a *API) withQueue(h func(http.ResponseWriter, *http.Request, *queue.Queue)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q, err := a.store().Queue(r.PathValue("queue"))
		if err != nil {
			a.fail(w, err)
			return
		}
		h(w, r, q)
	})
}

func (a *API) show(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	in, err := q.Info(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, newQueueView(in, time.Now()))
}

// pauseRequest is the body of a pause; the query parameters of the same names may be
// used instead.
type pauseRequest struct {
	Until string `json:"until,omitempty"`
	For   string `json:"for,omitempty"`
}

func (a *API) pause(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	until, ok := pauseUntil(w, r)
	if !ok {
		return
	}
	if err := q.Pause(r.Context(), until); err != nil {
		a.fail(w, err)
		return
	}
	a.show(w, r, q)
}

// pauseUntil reads the end of a pause from r (a pauseRequest, or its query
// parameters); it answers the client itself and returns false when it is not valid.
func pauseUntil(w http.ResponseWriter, r *http.Request) (time.Time, bool) {
	var req pauseRequest
	if !readBody(w, r, &req) {
		return time.Time{}, false
	}
	if v := r.URL.Query().Get("until"); v != "" {
		req.Until = v
	}
	if v := r.URL.Query().Get("for"); v != "" {
		req.For = v
	}
	now := time.Now()
	var until time.Time
	switch {
	case (req.Until == "") == (req.For == ""):
		ingress.WriteProblem(w, http.StatusBadRequest, `Give exactly one of "until" (RFC 3339 time) or "for" (duration such as 15m).`)
		return time.Time{}, false
	case req.For != "":
		d, err := time.ParseDuration(req.For)
		if err != nil || d <= 0 || d > maxPause {
			ingress.WriteProblem(w, http.StatusBadRequest, `"for" must be a positive duration such as 90s or 15m, at most 8784h.`)
			return time.Time{}, false
		}
		until = now.Add(d)
	default:
		t, err := time.Parse(time.RFC3339, req.Until)
		if err != nil || !t.After(now) || t.Sub(now) > maxPause {
			ingress.WriteProblem(w, http.StatusBadRequest, `"until" must be an RFC 3339 time in the future, at most 366 days ahead.`)
			return time.Time{}, false
		}
		until = t
	}
	return until, true
}

func (a *API) resume(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	if err := q.Resume(r.Context()); err != nil {
		a.fail(w, err)
		return
	}
	a.show(w, r, q)
}

func (a *API) retire(w http.ResponseWriter, r *http.Request) {
	drop, ok := boolParam(w, r, "drop")
	if !ok {
		return
	}
	name := r.PathValue("queue")
	n, err := a.store().Retire(r.Context(), name, drop)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Retired string `json:"retired"`
		Dropped uint64 `json:"dropped"`
	}{name, n})
}

// DeadLetterView is the JSON of one dead letter (also `sluice dlq list --json`).
type DeadLetterView struct {
	Ticket     string    `json:"ticket"`
	Queue      string    `json:"queue"`
	Rule       string    `json:"rule,omitempty"`
	Attempts   int       `json:"attempts"`
	Reason     string    `json:"reason"`
	DeadAt     time.Time `json:"dead_at"`
	ReceivedAt time.Time `json:"received_at,omitzero"`
	Method     string    `json:"method"`
	Path       string    `json:"path"`
	Query      string    `json:"query,omitempty"`
	BodyBytes  int       `json:"body_bytes"`
}

// NewDeadLetterView returns the view of a dead letter of queue.
func NewDeadLetterView(queueName string, dl queue.DeadLetter) DeadLetterView {
	m := dl.Message
	return DeadLetterView{Ticket: m.Ticket, Queue: queueName, Rule: m.Rule, Attempts: dl.Attempts, Reason: dl.Reason,
		DeadAt: dl.DeadAt.UTC(), ReceivedAt: m.ReceivedAt.UTC(), Method: m.Method, Path: m.Path,
		Query: m.RawQuery, BodyBytes: len(m.Body)}
}

func (a *API) deadList(w http.ResponseWriter, r *http.Request) {
	limit := defaultDeadLimit
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDeadLimit {
			ingress.WriteProblem(w, http.StatusBadRequest, "limit must be a number from 1 to "+strconv.Itoa(maxDeadLimit)+".")
			return
		}
		limit = n
	}
	name := r.PathValue("queue")
	if !a.queueExists(w, r, name) {
		return
	}
	dls, err := a.store().DeadLetters(r.Context(), name, limit)
	if err != nil {
		a.fail(w, err)
		return
	}
	out := struct {
		DeadLetters []DeadLetterView `json:"dead_letters"`
	}{DeadLetters: make([]DeadLetterView, 0, len(dls))}
	for _, dl := range dls {
		out.DeadLetters = append(out.DeadLetters, NewDeadLetterView(name, dl))
	}
	writeJSON(w, http.StatusOK, out)
}

// ticketsRequest names dead letters: tickets, or all of the queue's.
type ticketsRequest struct {
	Tickets []string `json:"tickets,omitempty"`
	All     bool     `json:"all,omitempty"`
}

// maxTickets bounds the tickets of one request.
const maxTickets = 10_000

// tickets reads the tickets of a requeue or purge from the body and the ticket query
// parameters; an empty selection must say all.
func tickets(w http.ResponseWriter, r *http.Request) ([]string, bool) {
	var req ticketsRequest
	if !readBody(w, r, &req) {
		return nil, false
	}
	req.Tickets = append(req.Tickets, r.URL.Query()["ticket"]...)
	all, ok := boolParam(w, r, "all")
	if !ok {
		return nil, false
	}
	req.All = req.All || all
	switch {
	case len(req.Tickets) > maxTickets:
		ingress.WriteProblem(w, http.StatusRequestEntityTooLarge, "At most "+strconv.Itoa(maxTickets)+" tickets per request.")
		return nil, false
	case req.All && len(req.Tickets) > 0:
		ingress.WriteProblem(w, http.StatusBadRequest, `Give tickets or "all", not both.`)
		return nil, false
	case !req.All && len(req.Tickets) == 0:
		ingress.WriteProblem(w, http.StatusBadRequest, `Give the tickets, or "all": true for every dead letter of the queue.`)
		return nil, false
	}
	for _, t := range req.Tickets {
		if !queue.ValidTicket(t) {
			ingress.WriteProblem(w, http.StatusBadRequest, "Not a ticket: "+strconv.Quote(shortened(t, 40))+".")
			return nil, false
		}
	}
	return req.Tickets, true
}

func (a *API) requeue(w http.ResponseWriter, r *http.Request) {
	a.onDeadLetters(w, r, "requeued", a.store().Requeue)
}

func (a *API) purge(w http.ResponseWriter, r *http.Request) {
	confirm, ok := boolParam(w, r, "confirm")
	if !ok {
		return
	}
	if !confirm {
		ingress.WriteProblem(w, http.StatusBadRequest, "Purging deletes dead letters for good: add confirm=true.")
		return
	}
	a.onDeadLetters(w, r, "purged", a.store().PurgeDeadLetters)
}

// onDeadLetters runs op on the dead letters the request names (its tickets, or all)
// of the path's queue and answers {"<done>": how many}.
func (a *API) onDeadLetters(w http.ResponseWriter, r *http.Request, done string,
	op func(ctx context.Context, queue string, tickets ...string) (int, error)) {
	ts, ok := tickets(w, r)
	if !ok {
		return
	}
	name := r.PathValue("queue")
	if !a.queueExists(w, r, name) {
		return
	}
	n, err := op(r.Context(), name, ts...)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{done: n})
}

// queueExists answers 404 unless name is a queue of the store or has a stream (dead
// letters of a retired queue stay reachable while its stream exists).
func (a *API) queueExists(w http.ResponseWriter, r *http.Request, name string) bool {
	if _, err := a.store().Queue(name); err == nil {
		return true
	}
	if err := a.store().CheckQueue(r.Context(), name); err != nil {
		a.fail(w, err) // unknown: 404; NATS unreachable: 503, not a false 404
		return false
	}
	return true
}

// fail answers a queue error with its status.
func (a *API) fail(w http.ResponseWriter, err error) {
	var status int
	switch {
	case errors.Is(err, queue.ErrUnknownQueue):
		ingress.WriteProblem(w, http.StatusNotFound, "No such queue.")
		return
	case errors.Is(err, queue.ErrNotFound):
		status = http.StatusNotFound
	case errors.Is(err, queue.ErrInvalidRequest):
		status = http.StatusBadRequest
	case errors.Is(err, queue.ErrNoDispatcher), errors.Is(err, queue.ErrDeclared), errors.Is(err, queue.ErrNotEmpty):
		status = http.StatusConflict
	case errors.Is(err, queue.ErrFull):
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(max(queue.RetryAfter(err), time.Second)), 10))
		status = http.StatusTooManyRequests
	case errors.Is(err, queue.ErrUnavailable):
		w.Header().Set("Retry-After", strconv.FormatInt(decide.RetryAfterSeconds(unavailableRetryAfter), 10))
		status = http.StatusServiceUnavailable
	default:
		if a.Log != nil {
			a.Log.Error("queue API", "err", err)
		}
		ingress.WriteProblem(w, http.StatusInternalServerError, "The operation failed; see the logs.")
		return
	}
	ingress.WriteProblem(w, status, err.Error())
}

// readBody decodes an optional JSON body (at most maxAdminBody bytes, no unknown
// fields) into v. It answers the client itself and returns false on a bad body.
func readBody(w http.ResponseWriter, r *http.Request, v any) bool {
	if r.Body == nil || r.Body == http.NoBody {
		return true
	}
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxAdminBody))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true // empty body
	}
	if err == nil && dec.More() {
		err = errors.New("trailing data after the JSON object")
	}
	if err != nil {
		if tooLarge := new(http.MaxBytesError); errors.As(err, &tooLarge) {
			ingress.WriteProblem(w, http.StatusRequestEntityTooLarge, "The request body is larger than "+strconv.Itoa(maxAdminBody)+" bytes.")
			return false
		}
		ingress.WriteProblem(w, http.StatusBadRequest, "The request body is not the expected JSON: "+shortened(err.Error(), 200))
		return false
	}
	return true
}

// boolParam reads an optional true/false query parameter.
func boolParam(w http.ResponseWriter, r *http.Request, name string) (bool, bool) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, true
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		ingress.WriteProblem(w, http.StatusBadRequest, name+" must be true or false.")
		return false, false
	}
	return b, true
}

func shortened(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
