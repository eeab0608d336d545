package console

import (
	"cmp"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ingress"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/rules"
	"github.com/sluicehq/sluice/rules/watch"
)

// decisionSeries is one rule and outcome's count of sluice_decisions_total.
type decisionSeries struct {
	Rule    string  `json:"rule"`
	Outcome string  `json:"outcome"`
	Total   float64 `json:"total"`
}

// decisions answers the decision counters of this process as they are now; see
// clusterData for every replica's rates.
func (c *Console) decisions(w http.ResponseWriter, _ *http.Request, _ []byte) {
	out := struct {
		At     time.Time        `json:"at"`
		Series []decisionSeries `json:"series"`
	}{At: c.now().UTC(), Series: []decisionSeries{}}
	if c.gatherer != nil {
		s, err := gatherDecisions(c.gatherer)
		if err != nil {
			ingress.WriteProblem(w, http.StatusInternalServerError, "The metrics could not be read.")
			return
		}
		out.Series = s
	}
	writeJSON(w, http.StatusOK, out)
}

// gatherDecisions reads sluice_decisions_total from g, sorted by rule and outcome.
func gatherDecisions(g prometheus.Gatherer) ([]decisionSeries, error) {
	fams, err := g.Gather()
	if err != nil && len(fams) == 0 {
		return nil, err
	}
	out := []decisionSeries{}
	for _, f := range fams {
		if f.GetName() != "sluice_decisions_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			s := decisionSeries{Total: m.GetCounter().GetValue()}
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "rule":
					s.Rule = l.GetValue()
				case "outcome":
					s.Outcome = l.GetValue()
				}
			}
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b decisionSeries) int {
		return cmp.Or(cmp.Compare(a.Rule, b.Rule), cmp.Compare(a.Outcome, b.Outcome))
	})
	return out, nil
}

// clusterData answers the overview's figures: decisions per second by outcome and
// rule summed over every replica, the queues, and the last hour's history (see
// clusterView); with ?history=0 without the history's points, which change once per
// HistoryStep.
func (c *Console) clusterData(w http.ResponseWriter, r *http.Request, _ []byte) {
	if c.lazy {
		c.cluster.tickIfDue(r.Context())
	}
	v := c.cluster.view()
	if r.URL.Query().Get("history") == "0" {
		v.History.Points = []historyPoint{}
	}
	writeJSON(w, http.StatusOK, v)
}

// ticketView is what the console shows of a ticket: its state, never the order's or
// the downstream's headers and body.
type ticketView struct {
	Ticket        string       `json:"ticket"`
	Queue         string       `json:"queue"`
	Rule          string       `json:"rule,omitempty"`
	Status        queue.Status `json:"status"`
	Attempts      int          `json:"attempts"`
	LastError     string       `json:"last_error,omitempty"`
	Position      uint64       `json:"position,omitempty"`
	ReceivedAt    time.Time    `json:"received_at,omitzero"`
	UpdatedAt     time.Time    `json:"updated_at,omitzero"`
	NextAttemptAt time.Time    `json:"next_attempt_at,omitzero"`
	// ResultStatus is the downstream's status code once final; ResultBytes the size of
	// the body kept with it.
	ResultStatus int `json:"result_status,omitempty"`
	ResultBytes  int `json:"result_bytes,omitempty"`
}

func (c *Console) ticket(w http.ResponseWriter, r *http.Request, _ []byte) {
	var st *queue.Store
	if c.store != nil {
		st = c.store.Load()
	}
	if st == nil {
		ingress.WriteProblem(w, http.StatusServiceUnavailable, "The queues are not reachable yet.")
		return
	}
	t := r.PathValue("ticket")
	if !queue.ValidTicket(t) {
		ingress.WriteProblem(w, http.StatusBadRequest, "Not a ticket: a ticket is 26 characters of a-z and 2-7.")
		return
	}
	rec, err := st.Status(r.Context(), t)
	switch {
	case errors.Is(err, queue.ErrNotFound):
		ingress.WriteProblem(w, http.StatusNotFound, "No such ticket (tickets are kept for a limited time).")
		return
	case err != nil:
		c.log.Error("console: ticket lookup", "err", err)
		ingress.WriteProblem(w, http.StatusServiceUnavailable, "The ticket's status cannot be read now.")
		return
	}
	v := ticketView{Ticket: rec.Ticket, Queue: rec.Queue, Rule: rec.Rule, Status: rec.Status, Attempts: rec.Attempts,
		LastError: rec.LastError, Position: rec.Position, ReceivedAt: rec.ReceivedAt.UTC(), UpdatedAt: rec.UpdatedAt.UTC()}
	if !rec.NextAttemptAt.IsZero() && !rec.Status.Final() {
		v.NextAttemptAt = rec.NextAttemptAt.UTC()
	}
	if rec.Result != nil {
		v.ResultStatus, v.ResultBytes = rec.Result.StatusCode, len(rec.Result.Body)
	}
	writeJSON(w, http.StatusOK, v)
}

// Reloads records the outcome of the rules reloads for the console's rules page. Its
// Observe fits watch.Options.OnReload. The zero value is ready to use.
type Reloads struct {
	mu       sync.Mutex
	last     *reloadView
	ok, fail int
}

type reloadView struct {
	At            time.Time `json:"at"`
	OK            bool      `json:"ok"`
	ActiveVersion string    `json:"active_version"`
	Error         string    `json:"error,omitempty"`
	Problems      []string  `json:"problems,omitempty"`
}

// Observe records one reload attempt that found changed content.
func (r *Reloads) Observe(res watch.ReloadResult) {
	v := &reloadView{At: time.Now().UTC(), OK: res.Err == nil}
	if res.Set != nil {
		v.ActiveVersion = res.Set.Version()
	}
	if res.Err != nil {
		v.Error = res.Err.Error()
		var ps rules.Problems
		if errors.As(res.Err, &ps) {
			for _, p := range ps {
				v.Problems = append(v.Problems, p.String())
			}
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last = v
	if v.OK {
		r.ok++
	} else {
		r.fail++
	}
}

func (c *Console) reloadsView(w http.ResponseWriter, _ *http.Request, _ []byte) {
	out := struct {
		Last      *reloadView `json:"last,omitempty"`
		Succeeded int         `json:"succeeded"`
		Failed    int         `json:"failed"`
	}{}
	if c.reloads != nil {
		c.reloads.mu.Lock()
		out.Last, out.Succeeded, out.Failed = c.reloads.last, c.reloads.ok, c.reloads.fail
		c.reloads.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, out)
}

// explainRequest is the body of POST data/explain.
type explainRequest struct {
	Method  string   `json:"method"`
	Path    string   `json:"path"`
	Headers []string `json:"headers,omitempty"`
	IP      string   `json:"ip,omitempty"`
}

type explainView struct {
	Route       *explainRoute       `json:"route"`
	Descriptors []explainDescriptor `json:"descriptors"`
}

type explainRoute struct {
	Name   string `json:"name"`
	Domain string `json:"domain"`
	Source string `json:"source"`
}

type explainDescriptor struct {
	Entries    []string     `json:"entries"`
	Missing    string       `json:"missing,omitempty"`
	Rule       *explainRule `json:"rule,omitempty"`
	ReplacedBy string       `json:"replaced_by,omitempty"`
	Duplicate  bool         `json:"duplicate,omitempty"`
}

type explainRule struct {
	Name       string   `json:"name"`
	Descriptor string   `json:"descriptor"`
	Source     string   `json:"source"`
	Limits     []string `json:"limits,omitempty"`
	Unlimited  bool     `json:"unlimited,omitempty"`
	Deny       bool     `json:"deny,omitempty"`
	OnLimit    string   `json:"on_limit"`
	Queue      string   `json:"queue,omitempty"`
	Shadow     bool     `json:"shadow,omitempty"`
	Quota      bool     `json:"quota,omitempty"` // quota_mode
}

// maxExplainBody bounds an explain request.
const maxExplainBody = 64 << 10

// explain tells how the active rules treat a request described in the body, with
// rules.Set.Explain (as `sluice rules check --explain` does).
func (c *Console) explain(w http.ResponseWriter, r *http.Request, _ []byte) {
	var set *rules.Set
	if c.rules != nil {
		set = c.rules.Set()
	}
	if set == nil {
		ingress.WriteProblem(w, http.StatusServiceUnavailable, "No rules are loaded.")
		return
	}
	var in explainRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxExplainBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		ingress.WriteProblem(w, http.StatusBadRequest, "The request is not the expected JSON.")
		return
	}
	req, addr, err := rules.NewExplainRequest(r.Context(), in.Method, in.Path, in.Headers, in.IP)
	if err != nil {
		ingress.WriteProblem(w, http.StatusBadRequest, err.Error())
		return
	}
	ex := set.Explain(req, addr)
	out := explainView{Descriptors: []explainDescriptor{}}
	if rt := ex.Route; rt != nil {
		out.Route = &explainRoute{Name: rt.Name, Domain: rt.Domain, Source: rt.File + ":" + strconv.Itoa(rt.Line)}
	}
	for _, d := range ex.Descriptors {
		v := explainDescriptor{Entries: []string{}, Missing: d.Missing, ReplacedBy: d.ReplacedBy, Duplicate: d.Duplicate}
		for _, e := range d.Entries {
			v.Entries = append(v.Entries, e.Key+"="+e.Value)
		}
		if rl := d.Rule; rl != nil {
			er := &explainRule{Name: rl.Name, Descriptor: rl.Descriptor, Source: rl.File + ":" + strconv.Itoa(rl.Line),
				Unlimited: rl.Unlimited, Deny: rl.Deny, OnLimit: string(rl.OnLimit), Shadow: rl.Shadow, Quota: rl.Quota}
			for _, l := range rl.Limits {
				er.Limits = append(er.Limits, rules.DescribeLimit(l))
			}
			if rl.Queue != nil {
				er.Queue = rl.Queue.Name
			}
			v.Rule = er
		}
		out.Descriptors = append(out.Descriptors, v)
	}
	writeJSON(w, http.StatusOK, out)
}
