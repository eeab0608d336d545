package deferral

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/ingress/internal/warn"
	"github.com/sluicehq/sluice/queue"
)

// RecordWatcher is what waits need of a Parker to hear of a ticket's changes at once:
// *queue.Store is one (see queue.Store.WatchRecords). Without it, a waited ticket is
// read again every few seconds (followPoll) and nothing else.
type RecordWatcher interface {
	WatchRecords(ctx context.Context, changed func(ticket string)) (stop func(), err error)
}

// WaitLimits configures WithWaits.
type WaitLimits struct {
	// Max is the longest Prefer: wait honoured; a longer one is cut to it. 0: no
	// waits and no streams (every request is answered at once, as without WithWaits).
	Max time.Duration
	// PerClient caps the waits and streams open at once per client address group (IDs;
	// nil: the peer address); Total caps them over every client. 0: the defaults
	// (DefaultWaitsPerClient, DefaultWaits).
	PerClient, Total int
	IDs              *ingress.ClientIdentity
}

// Defaults of WaitLimits.
const (
	DefaultWaitsPerClient = 100
	DefaultWaits          = 10_000
)

// WithWaits lets clients wait for a ticket on GET Path{ticket}:
//
//   - Prefer: wait=N (RFC 7240; N whole seconds, the first wait of the fields counts):
//     a status that is not final is answered once it is final, or after N seconds
//     (at most Max) with the status then, whichever comes first, with
//     Preference-Applied: wait=N (N as honoured). A status already final is answered
//     at once, with Preference-Applied too.
//   - Accept: text/event-stream: a server-sent event stream. It starts with
//     "retry: 1000" and the status; each change of the status is one more event
//     (event: status, id: the status, data: the status JSON), a comment every 15 s
//     keeps idle proxies from closing it, and it ends after the final status (or
//     after 10 minutes: the client reconnects after the retry). A reconnect whose
//     Last-Event-ID is the final status the ticket has is answered 204, which tells an
//     EventSource to stop.
//
// Past PerClient or Total a Prefer: wait is answered at once without
// Preference-Applied (RFC 7240 lets a server ignore a preference), and a stream is 429
// with Retry-After. A client that goes away frees its place at once. Waiting costs
// NATS nothing per client: every ticket with waiters is read once when its first
// waiter comes, again when the watch (RecordWatcher) says its record was written, and
// otherwise every 5 to 30 s (its Retry-After) for the changes no record tells (the
// first delivery attempt, a position in the queue); its waiters share those reads. A
// wait and a stream each count as one lookup of WithLookupLimit. Close ends them all.
func WithWaits(l WaitLimits) Option {
	return func(q *Deferrer) {
		if l.Max <= 0 {
			q.waits = nil
			return
		}
		if l.PerClient <= 0 {
			l.PerClient = DefaultWaitsPerClient
		}
		if l.Total <= 0 {
			l.Total = DefaultWaits
		}
		if l.IDs == nil {
			l.IDs, _ = ingress.NewClientIdentity(nil, 0) // trusts no proxy; cannot fail
		}
		ctx, cancel := context.WithCancel(context.Background())
		q.waits = &waits{limits: l, parker: q.parker, poll: followPoll, ctx: ctx, cancel: cancel,
			follows: map[string]*follow{}, clients: map[string]int{}, watchFailed: warn.Every(warnInterval)}
		q.waits.watcher, _ = q.parker.(RecordWatcher)
	}
}

// Close ends every wait and stream (each answers the status it has, or ends) and
// stops watching; later waits are answered at once. For a server's shutdown: an
// http.Server's Shutdown waits for its handlers (register Close with
// RegisterOnShutdown). It returns once nothing of the waits runs.
func (q *Deferrer) Close() {
	if q.waits != nil {
		q.waits.close()
	}
}

// OpenWaits returns the waits and event streams open now (0 without WithWaits).
func (q *Deferrer) OpenWaits() int {
	if q.waits == nil {
		return 0
	}
	q.waits.mu.Lock()
	defer q.waits.mu.Unlock()
	return q.waits.open
}

const (
	// followPoll and followPollMax bound how often a ticket with waiters is read
	// besides the watch's news (its Retry-After, within them).
	followPoll    = 5 * time.Second
	followPollMax = 30 * time.Second
	// readTimeout bounds one read of a waited ticket.
	readTimeout = 5 * time.Second
	// watchRetry is how long a watch that failed to start is not tried again.
	watchRetry = 5 * time.Second
	// Streams: a comment that often keeps proxies from closing an idle stream; a
	// stream ends after streamLifetime (the client reconnects after streamRetry).
	keepAlive      = 15 * time.Second
	streamLifetime = 10 * time.Minute
	streamRetry    = time.Second
	// writeSlack is how long a write of a wait's answer or an event may take.
	writeSlack = 10 * time.Second
)

// waits is a WithWaits: the open waits per client and one follow per waited ticket.
type waits struct {
	limits  WaitLimits
	parker  Parker
	watcher RecordWatcher // nil: read every poll only
	log     *slog.Logger
	// watchFailed warns that the watch cannot start, at most once per warnInterval.
	watchFailed *warn.Sometimes
	poll        time.Duration // followPoll; tests set a longer one to prove the watch
	ctx         context.Context
	cancel      context.CancelFunc
	wg          sync.WaitGroup // follows' goroutines

	mu      sync.Mutex
	closed  bool
	follows map[string]*follow
	clients map[string]int // open waits by client group
	open    int

	// watchMu orders starting and stopping the watch.
	watchMu    sync.Mutex
	stopWatch  func() // nil: not watching
	watchAfter time.Time
}

// follow is a waited ticket: its latest status, shared by its waiters.
type follow struct {
	ticket  string
	waiters int           // under waits.mu
	kick    chan struct{} // cap 1: the watch saw its record written
	quit    chan struct{} // closed when its last waiter leaves

	mu      sync.Mutex
	rec     *queue.Record // nil until the first read
	gone    bool          // the ticket is unknown now (expired)
	changed chan struct{} // closed when rec or gone changes, then replaced
}

func (f *follow) state() (rec *queue.Record, gone bool, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rec, f.gone, f.changed
}

// mode is what a request asks of WithWaits.
type mode struct {
	wait   time.Duration // Prefer: wait, cut to Max (0: none)
	stream bool          // Accept: text/event-stream
}

// serve answers a request for rec (its status just read) as it asks: a stream (nil
// returned: answered), a wait (the status to answer), or at once (rec).
func (h *waits) serve(w http.ResponseWriter, r *http.Request, rec *queue.Record) *queue.Record {
	m := h.mode(r)
	if !m.stream && m.wait == 0 {
		return rec
	}
	if m.stream && rec.Status.Final() && r.Header.Get("Last-Event-ID") == string(rec.Status) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent) // seen it: an EventSource stops
		return nil
	}
	if !m.stream && rec.Status.Final() {
		w.Header().Set("Preference-Applied", "wait="+strconv.FormatInt(int64(m.wait/time.Second), 10))
		return rec
	}
	client := h.limits.IDs.Group(h.limits.IDs.Addr(r)).String()
	f := h.join(rec.Ticket, client)
	if f == nil {
		if m.stream {
			w.Header().Set("Retry-After", "1")
			ingress.WriteProblem(w, http.StatusTooManyRequests, "Too many waits and event streams open; ask again after Retry-After.")
			return nil
		}
		return rec // the preference is not applied
	}
	defer h.leave(f, client)
	rc := http.NewResponseController(w)
	if m.stream {
		h.stream(w, r, rc, f, rec)
		return nil
	}
	// The server's own timeouts are for requests that do not wait.
	_ = rc.SetReadDeadline(time.Now().Add(m.wait + writeSlack))
	_ = rc.SetWriteDeadline(time.Now().Add(m.wait + writeSlack))
	rec = h.wait(r.Context(), f, rec, m.wait)
	w.Header().Set("Preference-Applied", "wait="+strconv.FormatInt(int64(m.wait/time.Second), 10))
	return rec
}

// mode reads what r asks for.
func (h *waits) mode(r *http.Request) mode {
	var m mode
	if r.Method != http.MethodGet {
		return m // HEAD: nothing would be read of a wait or a stream
	}
	m.stream = acceptsEventStream(r.Header.Values("Accept"))
	if d, ok := preferWait(r.Header.Values("Prefer")); ok && d > 0 {
		m.wait = min(d, h.limits.Max)
	}
	return m
}

// wait returns the status of f once it is final, or at most d later, ctx's end or
// Close: the newest of rec and what f has read then.
func (h *waits) wait(ctx context.Context, f *follow, rec *queue.Record, d time.Duration) *queue.Record {
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		cur, gone, changed := f.state()
		rec = newer(rec, cur)
		if gone || rec.Status.Final() {
			return rec
		}
		select {
		case <-changed:
		case <-t.C:
			return rec
		case <-ctx.Done():
			return rec
		case <-h.ctx.Done():
			return rec
		}
	}
}

// newer returns b when it is a read of the ticket at least as recent as a (nil: a).
func newer(a, b *queue.Record) *queue.Record {
	if b == nil || b.UpdatedAt.Before(a.UpdatedAt) {
		return a
	}
	return b
}

// stream serves an event stream of f, starting with rec.
func (h *waits) stream(w http.ResponseWriter, r *http.Request, rc *http.ResponseController, f *follow, rec *queue.Record) {
	_ = rc.SetReadDeadline(time.Now().Add(streamLifetime + writeSlack))
	hd := w.Header()
	hd.Set("Content-Type", "text/event-stream")
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Accel-Buffering", "no") // nginx: pass events on as they come
	w.WriteHeader(http.StatusOK)
	send := func(s string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(writeSlack))
		if _, err := w.Write([]byte(s)); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	event := func(rec *queue.Record) bool {
		b, _ := json.Marshal(statusOf(rec))
		return send("id: " + string(rec.Status) + "\nevent: status\ndata: " + string(b) + "\n\n")
	}
	if !send("retry: "+strconv.FormatInt(streamRetry.Milliseconds(), 10)+"\n\n") || !event(rec) {
		return
	}
	alive := time.NewTicker(keepAlive)
	defer alive.Stop()
	end := time.NewTimer(streamLifetime)
	defer end.Stop()
	for !rec.Status.Final() {
		cur, gone, changed := f.state()
		if gone {
			return
		}
		if n := newer(rec, cur); n != rec && changedStatus(rec, n) {
			rec = n
			if !event(rec) {
				return
			}
			continue
		}
		select {
		case <-changed:
		case <-alive.C:
			if !send(": keep-alive\n\n") {
				return
			}
		case <-end.C:
			return
		case <-r.Context().Done():
			return
		case <-h.ctx.Done():
			return
		}
	}
}

// changedStatus reports whether b says something a's event did not.
func changedStatus(a, b *queue.Record) bool {
	return a.Status != b.Status || a.Attempts != b.Attempts || a.Position != b.Position ||
		a.LastError != b.LastError || !a.NextAttemptAt.Equal(b.NextAttemptAt)
}

// join takes a place for client and returns the follow of ticket, made (and read)
// if it had no waiters; nil when past a cap or closed.
func (h *waits) join(ticket, client string) *follow {
	h.mu.Lock()
	if h.closed || h.open >= h.limits.Total || h.clients[client] >= h.limits.PerClient {
		h.mu.Unlock()
		return nil
	}
	h.open++
	h.clients[client]++
	f := h.follows[ticket]
	made := f == nil
	if made {
		f = &follow{ticket: ticket, kick: make(chan struct{}, 1), quit: make(chan struct{}), changed: make(chan struct{})}
		h.follows[ticket] = f
		h.wg.Add(1)
	}
	f.waiters++
	h.mu.Unlock()
	if made {
		// Watching before the first read: a write between the status the waiter
		// has and this read is in the read, one after it is told.
		h.syncWatch()
		go h.follow(f)
	}
	return f
}

// leave gives back a place taken by join.
func (h *waits) leave(f *follow, client string) {
	h.mu.Lock()
	h.open--
	if h.clients[client]--; h.clients[client] <= 0 {
		delete(h.clients, client)
	}
	f.waiters--
	last := f.waiters == 0
	if last {
		delete(h.follows, f.ticket)
		close(f.quit)
	}
	none := len(h.follows) == 0
	h.mu.Unlock()
	if none {
		h.syncWatch()
	}
}

// follow reads f's ticket until it is final or has no waiters: at once, when the
// watch tells its record was written, and every poll (its Retry-After, within
// followPoll and followPollMax).
func (h *waits) follow(f *follow) {
	defer h.wg.Done()
	for {
		interval := h.read(f)
		if interval == 0 {
			return // final or gone: what it has is the answer
		}
		t := time.NewTimer(interval)
		select {
		case <-f.kick:
		case <-t.C:
			h.syncWatch() // one that failed to start is tried again
		case <-f.quit:
		case <-h.ctx.Done():
		}
		t.Stop()
		select {
		case <-f.quit:
			return
		case <-h.ctx.Done():
			return
		default:
		}
	}
}

// read reads f's ticket once and tells its waiters what changed; it returns when to
// read again (0: never).
func (h *waits) read(f *follow) time.Duration {
	ctx, cancel := context.WithTimeout(h.ctx, readTimeout)
	rec, err := h.parker.Status(ctx, f.ticket)
	cancel()
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case errors.Is(err, queue.ErrNotFound):
		f.gone = true
	case err != nil:
		return h.poll // unreachable for now: what the waiters have stands
	default:
		f.rec = rec
	}
	close(f.changed)
	f.changed = make(chan struct{})
	if f.gone || rec.Status.Final() {
		return 0
	}
	return min(max(rec.RetryAfter, h.poll), max(followPollMax, h.poll))
}

// changed is the watch's news: ticket's record was written.
func (h *waits) changed(ticket string) {
	h.mu.Lock()
	f := h.follows[ticket]
	h.mu.Unlock()
	if f != nil {
		select {
		case f.kick <- struct{}{}:
		default:
		}
	}
}

// syncWatch watches while some ticket has waiters, and stops when none has.
func (h *waits) syncWatch() {
	if h.watcher == nil {
		return
	}
	h.watchMu.Lock()
	defer h.watchMu.Unlock()
	h.mu.Lock()
	want := len(h.follows) > 0 && !h.closed
	h.mu.Unlock()
	switch {
	case want && h.stopWatch == nil && !time.Now().Before(h.watchAfter):
		ctx, cancel := context.WithTimeout(h.ctx, readTimeout)
		stop, err := h.watcher.WatchRecords(ctx, h.changed)
		cancel()
		if err != nil {
			h.watchAfter = time.Now().Add(watchRetry)
			if h.ctx.Err() == nil {
				h.watchFailed.Warn(h.log, "cannot watch ticket records; waits read their tickets every few seconds instead", "err", err)
			}
			return
		}
		h.stopWatch = stop
		// What was written while nobody watched is read now.
		h.mu.Lock()
		for _, f := range h.follows {
			select {
			case f.kick <- struct{}{}:
			default:
			}
		}
		h.mu.Unlock()
	case !want && h.stopWatch != nil:
		h.stopWatch()
		h.stopWatch = nil
	}
}

func (h *waits) close() {
	h.mu.Lock()
	h.closed = true
	h.mu.Unlock()
	h.cancel()
	h.wg.Wait()
	h.syncWatch()
}

// preferWait reads the wait preference of Prefer fields (RFC 7240): the first
// "wait" among them, case-insensitive, whose value is delta-seconds (a quoted value
// too). ok is false when there is none or it is not a number; values past a day are
// a day.
func preferWait(values []string) (d time.Duration, ok bool) {
	for _, v := range values {
		for _, pref := range splitList(v) {
			pref, _, _ = strings.Cut(pref, ";") // its parameters
			name, val, _ := strings.Cut(pref, "=")
			if !strings.EqualFold(strings.TrimSpace(name), "wait") {
				continue
			}
			val = strings.TrimSpace(val)
			if len(val) >= 2 && val[0] == '"' && val[len(val)-1] == '"' {
				val = val[1 : len(val)-1]
			}
			if val == "" || strings.Trim(val, "0123456789") != "" {
				return 0, false // the first one counts, even malformed
			}
			if len(val) > 5 {
				return 24 * time.Hour, true
			}
			n, _ := strconv.Atoi(val)
			return min(time.Duration(n)*time.Second, 24*time.Hour), true
		}
	}
	return 0, false
}

// acceptsEventStream reports whether Accept fields name text/event-stream with a
// weight other than 0.
func acceptsEventStream(values []string) bool {
	for _, v := range values {
		for _, rng := range splitList(v) {
			typ, params, _ := strings.Cut(rng, ";")
			if !strings.EqualFold(strings.TrimSpace(typ), "text/event-stream") {
				continue
			}
			for p := range strings.SplitSeq(params, ";") {
				k, q, _ := strings.Cut(p, "=")
				if strings.EqualFold(strings.TrimSpace(k), "q") {
					if w, err := strconv.ParseFloat(strings.TrimSpace(q), 64); err == nil && w <= 0 {
						return false
					}
				}
			}
			return true
		}
	}
	return false
}

// splitList splits a field value's comma-separated list, keeping quoted strings
// (with their escapes) whole.
func splitList(v string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case quoted && c == '\\':
			i++
		case c == '"':
			quoted = !quoted
		case !quoted && c == ',':
			out = append(out, v[start:i])
			start = i + 1
		}
	}
	return append(out, v[start:])
}
