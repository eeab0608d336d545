package queueapi

import (
	"cmp"
	"net/http"
	"slices"
	"time"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/limiter"
	"github.com/sluicehq/sluice/queue"
)

// FlowView is the JSON of one flow key's settings. The key is its hash
// (queue.Message.FlowKey): sluice keeps no flow value.
type FlowView struct {
	FlowKey     string     `json:"flow_key"`
	PausedUntil *time.Time `json:"paused_until,omitempty"`
	Rate        string     `json:"rate,omitempty"`
}

func newFlowView(key string, fc queue.FlowControl, now time.Time) FlowView {
	v := FlowView{FlowKey: key}
	if fc.Paused(now) {
		v.PausedUntil = &fc.PausedUntil
	}
	if !fc.Rate.IsZero() {
		v.Rate = fc.Rate.String()
	}
	return v
}

// flows lists the queue's flow keys with settings of their own.
func (a *API) flows(w http.ResponseWriter, r *http.Request, q *queue.Queue) {
	all, err := q.Flows(r.Context())
	if err != nil {
		a.fail(w, err)
		return
	}
	out := struct {
		Queue string     `json:"queue"`
		Flows []FlowView `json:"flows"`
	}{Queue: q.Name(), Flows: []FlowView{}}
	now := time.Now()
	for k, fc := range all {
		out.Flows = append(out.Flows, newFlowView(k, fc, now))
	}
	slices.SortFunc(out.Flows, func(x, y FlowView) int { return cmp.Compare(x.FlowKey, y.FlowKey) })
	writeJSON(w, http.StatusOK, out)
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
	writeJSON(w, http.StatusOK, newFlowView(a.store().FlowKeyFor(q.Config(), value), fc, time.Now()))
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
