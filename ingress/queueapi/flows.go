package queueapi

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
)

// FlowView is the JSON of one flow key: its settings, what they make of the queue's
// flow_by, and (in listings and a key's GET) what the dispatchers report of it. The
// key is its hash (queue.Message.FlowKey): sluice keeps no flow value.
type FlowView struct {
	FlowKey     string     `json:"flow_key"`
	Paused      bool       `json:"paused"`
	PausedUntil *time.Time `json:"paused_until,omitempty"`
	// Rate is the pinned rate ("": the queue's flow_by rate).
	Rate string `json:"rate,omitempty"`
	// ConfiguredRate is the key's rate: the pinned one, else flow_by's ("": none).
	ConfiguredRate string `json:"configured_rate,omitempty"`
	// MaxInFlight is flow_by's max_in_flight (0: none beyond the queue's).
	MaxInFlight int `json:"max_in_flight"`
	// Depth is the key's orders the dispatchers hold, not settled (queue.FlowStat).
	Depth *int `json:"depth,omitempty"`
	// AchievedPerSecond is the key's deliveries started per second over the last
	// AchievedOverSeconds.
	AchievedPerSecond   *float64 `json:"achieved_per_second,omitempty"`
	AchievedOverSeconds float64  `json:"achieved_over_seconds,omitempty"`
}

// newFlowView returns key's view in q under fc; st, when not nil, is what the
// dispatchers report of it.
func newFlowView(q *queue.Queue, key string, fc queue.FlowControl, st *queue.FlowStat, now time.Time) FlowView {
	f := q.Config().FlowBy
	v := FlowView{FlowKey: key, MaxInFlight: f.MaxInFlight}
	if fc.Paused(now) {
		v.Paused, v.PausedUntil = true, &fc.PausedUntil
	}
	if !fc.Rate.IsZero() {
		v.Rate = fc.Rate.String()
		f.Rate = fc.Rate
	}
	if !f.Rate.IsZero() {
		v.ConfiguredRate = f.Rate.String()
	}
	if st != nil {
		v.Depth, v.AchievedPerSecond = &st.Depth, &st.PerSecond
		v.AchievedOverSeconds = queue.FlowRateWindow.Seconds()
	}
	return v
}

// Flow listings: a page holds at most maxFlowPage keys (defaultFlowPage unless the
// limit parameter says otherwise).
const (
	defaultFlowPage = 100
	maxFlowPage     = 1000
)

// FlowsPage is the JSON of a listing of a queue's flow keys.
type FlowsPage struct {
	Queue string     `json:"queue"`
	Flows []FlowView `json:"flows"`
	// Next is the after parameter of the next page ("": this is the last).
	Next string `json:"next,omitempty"`
	// QueueDepth is the queue's orders: the keys' depths count only those the
	// dispatchers hold.
	QueueDepth uint64 `json:"queue_depth"`
	// Reports is the dispatchers' reports read; Truncated the keys they left out.
	Reports   int `json:"reports"`
	Truncated int `json:"truncated,omitempty"`
}

// flows lists the queue's flow keys with settings of their own or reported by a
// dispatcher (orders held, or started within the rate window), by hash, a page at a
// time: after (a hash) starts past it, limit bounds the page.
func (a *API) flows(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	after, limit, ok := flowPage(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	settings, err := q.Flows(ctx)
	if err != nil {
		a.fail(w, err)
		return
	}
	report, err := q.FlowStats(ctx)
	if err != nil {
		a.fail(w, err)
		return
	}
	depth, err := q.Depth(ctx)
	if err != nil {
		a.fail(w, err)
		return
	}
	keys := make([]string, 0, len(settings)+len(report.Keys))
	for k := range settings {
		keys = append(keys, k)
	}
	for k := range report.Keys {
		if _, dup := settings[k]; !dup {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	from, _ := slices.BinarySearch(keys, after)
	if from < len(keys) && keys[from] == after {
		from++
	}
	page := keys[from:min(from+limit, len(keys))]
	out := FlowsPage{Queue: q.Name(), Flows: make([]FlowView, 0, len(page)), QueueDepth: depth,
		Reports: report.Reports, Truncated: report.Truncated}
	if from+limit < len(keys) {
		out.Next = page[len(page)-1]
	}
	now := time.Now()
	for _, k := range page {
		st := report.Keys[k]
		st.Key = k
		out.Flows = append(out.Flows, newFlowView(q, k, settings[k], &st, now))
	}
	writeJSON(w, http.StatusOK, out)
}

// flowPage reads a listing's after and limit parameters, or answers 400.
func flowPage(w http.ResponseWriter, r *http.Request) (after string, limit int, ok bool) {
	limit = defaultFlowPage
	qs := r.URL.Query()
	if v := qs.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxFlowPage {
			ingress.WriteProblem(w, http.StatusBadRequest, "limit must be a number from 1 to "+strconv.Itoa(maxFlowPage)+".")
			return "", 0, false
		}
		limit = n
	}
	after = qs.Get("after")
	if after != "" && !queue.ValidFlowKey(after) {
		ingress.WriteProblem(w, http.StatusBadRequest, "after must be a flow key (32 hex digits, as listed), the next of the previous page.")
		return "", 0, false
	}
	return after, limit, true
}

// flow answers one flow key, named by its value: settings and reported figures.
func (a *API) flow(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	if !q.Config().FlowBy.Enabled() {
		ingress.WriteProblem(w, http.StatusBadRequest, "Queue "+strconv.Quote(q.Name())+" has no flow_by.")
		return
	}
	value := r.PathValue("key")
	fc, err := q.Flow(r.Context(), value)
	if err != nil {
		a.fail(w, err)
		return
	}
	report, err := q.FlowStats(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	key := a.store().FlowKeyFor(q.Config(), value)
	st := report.Keys[key]
	writeJSON(w, http.StatusOK, newFlowView(q, key, fc, &st, time.Now()))
}

// changeFlow applies change to the settings of the flow key whose value is {key}
// (queue.Queue.ChangeFlow: a change another replica makes meanwhile is kept) and
// answers with them.
func (a *API) changeFlow(w http.ResponseWriter, r *http.Request, q *queue.Queue, change func(*queue.FlowControl)) {
	value := r.PathValue("key")
	fc, err := q.ChangeFlow(r.Context(), value, change)
	if err != nil {
		a.fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, newFlowView(q, a.store().FlowKeyFor(q.Config(), value), fc, nil, time.Now()))
}

func (a *API) flowPause(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	until, ok := pauseUntil(w, r)
	if !ok {
		return
	}
	a.changeFlow(w, r, q, func(fc *queue.FlowControl) { fc.PausedUntil = until })
}

func (a *API) flowResume(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	a.changeFlow(w, r, q, func(fc *queue.FlowControl) { fc.PausedUntil = time.Time{} })
}

// flowRateRequest is the body of a pinned rate (PUT .../rate).
type flowRateRequest struct {
	Rate string `json:"rate"`
}

// flowRate pins the key's rate (PUT) or removes the pinned rate (DELETE).
func (a *API) flowRate(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	var rate limiter.Rate
	if r.Method == http.MethodPut {
		var req flowRateRequest
		if !readBody(w, r, &req) {
			return
		}
		var err error
		if rate, err = limiter.ParseRate(req.Rate); err != nil {
			ingress.WriteProblem(w, http.StatusBadRequest, `"rate" must be a rate such as 2/s or 100/m: `+shortened(err.Error(), 200))
			return
		}
	}
	a.changeFlow(w, r, q, func(fc *queue.FlowControl) { fc.Rate = rate })
}
