package ingress

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ingress/decide"
)

// quotaExceededType is the problem type of draft-ietf-httpapi-ratelimit-headers-11.
const quotaExceededType = "https://iana.org/assignments/http-problem-types#quota-exceeded"

// problem is an RFC 9457 problem details object.
type problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`

	// quota-exceeded members
	ViolatedPolicies []string `json:"violated-policies,omitempty"`
	Limit            int64    `json:"limit,omitempty"`
	RetryAfter       int64    `json:"retry-after,omitempty"` // seconds

	// ticket: an order that may have been accepted although the answer is an error
	// (see WriteTicketProblem)
	Ticket string `json:"ticket,omitempty"`
}

// writeProblem sends p as application/problem+json. Problems are never cached: they
// describe one moment of one client's quota.
func writeProblem(w http.ResponseWriter, p problem) {
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	h.Del("Content-Length")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}

// quotaExceeded is the 429 problem for the given violated policies.
func quotaExceeded(policies []string, limit int64, retryAfter time.Duration) problem {
	secs := decide.RetryAfterSeconds(retryAfter)
	return problem{
		Type:             quotaExceededType,
		Title:            "Request cannot be satisfied as assigned quota has been exceeded",
		Status:           http.StatusTooManyRequests,
		Detail:           "Quota exceeded; retry in " + strconv.FormatInt(secs, 10) + " s.",
		ViolatedPolicies: policies,
		Limit:            limit,
		RetryAfter:       secs,
	}
}

// simpleProblem is a problem of the generic type about:blank.
func simpleProblem(status int, detail string) problem {
	return problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
}

// WriteProblem answers status with an RFC 9457 problem of the generic type about:blank
// (application/problem+json, never cached), as the middleware answers: a Deferrer
// answers its errors with it.
func WriteProblem(w http.ResponseWriter, status int, detail string) {
	writeProblem(w, simpleProblem(status, detail))
}

// WriteTicketProblem is WriteProblem with the problem's extension member "ticket": the
// order that the refused request may still have become, whose status the client can
// ask for before sending it again.
func WriteTicketProblem(w http.ResponseWriter, status int, detail, ticket string) {
	p := simpleProblem(status, detail)
	p.Ticket = ticket
	writeProblem(w, p)
}
