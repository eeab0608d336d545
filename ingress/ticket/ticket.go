// Package ticket is the client side of sluice's deferred orders: the JSON of a
// ticket's status (GET /sluice/v1/deferred/{ticket}, the monitor URL of a 202) and
// Wait, which follows a ticket until it is final in as few requests as the front door
// allows. It imports the standard library only, so any Go program can follow its
// orders without linking NATS or the rest of sluice.
package ticket

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The states of a ticket. Done, Failed, Dead and Cancelled are final.
const (
	Scheduled  = "scheduled"
	Queued     = "queued"
	Delivering = "delivering"
	Done       = "done"
	Failed     = "failed"
	Dead       = "dead"
	Cancelled  = "cancelled"
)

// Status is the JSON of GET /sluice/v1/deferred/{ticket}, and the data of each event
// of its event stream.
type Status struct {
	Ticket     string    `json:"ticket"`
	Queue      string    `json:"queue"`
	Status     string    `json:"status"`
	Attempts   int       `json:"attempts"`
	LastError  string    `json:"last_error,omitempty"`
	Position   uint64    `json:"position,omitempty"`
	ReceivedAt time.Time `json:"received_at"`
	UpdatedAt  time.Time `json:"updated_at"`
	// Result is the downstream's answer, once done or failed.
	Result  *Result    `json:"result,omitempty"`
	NextTry *time.Time `json:"next_attempt_at,omitempty"`
	// NotBefore and DueIn (whole seconds, rounded up) tell when a scheduled order
	// falls due.
	NotBefore *time.Time `json:"not_before,omitempty"`
	DueIn     *int64     `json:"due_in,omitempty"`
}

// Final reports whether no further delivery happens in this status.
func (s *Status) Final() bool {
	switch s.Status {
	case Done, Failed, Dead, Cancelled:
		return true
	}
	return false
}

// Result is the downstream's answer to the final delivery attempt.
type Result struct {
	Status  int         `json:"status,omitempty"`
	Headers http.Header `json:"headers,omitempty"`
	// Body is the downstream's body when it is UTF-8 text, BodyBase64 otherwise.
	Body       string `json:"body,omitempty"`
	BodyBase64 []byte `json:"body_base64,omitempty"`
	Truncated  bool   `json:"truncated,omitempty"`
	Subject    string `json:"subject,omitempty"`
}

// ErrNotFound: the front door does not know the ticket (never issued, or expired).
var ErrNotFound = errors.New("ticket: no such ticket")

// Option configures Wait.
type Option func(*waitOptions)

type waitOptions struct {
	client *http.Client
	wait   time.Duration
}

// WithHTTPClient sends the requests with c (default http.DefaultClient). Its Timeout,
// if any, must be longer than the wait asked for (WithWait).
func WithHTTPClient(c *http.Client) Option { return func(o *waitOptions) { o.client = c } }

// WithWait sets the longest wait asked for in one request (Prefer: wait, default 60s,
// at least a second); the front door may honour less (its --max-wait-preference).
func WithWait(d time.Duration) Option { return func(o *waitOptions) { o.wait = d } }

// maxBody caps a status body read: the result body is at most 64 KiB (base64: 88 KiB).
const maxBody = 1 << 20

// maxPause caps how long Wait follows a Retry-After between two requests.
const maxPause = time.Minute

// Wait follows the ticket at monitorURL (the front door's base URL + the 202's
// monitor) until its status is final, and returns that status. Each request asks the
// front door to hold the answer until the status is final (Prefer: wait=N, N the time
// left of ctx's deadline, at most WithWait); when the front door did not wait
// (no Preference-Applied), is busy (429, 503) or answered a status that is not final,
// Wait asks again after its Retry-After (1 s to a minute). A ticket the front door
// does not know is ErrNotFound; ctx's end is ctx.Err(), wrapped; any other answer is
// an error naming its status. Wait never returns a status that is not final without
// an error.
func Wait(ctx context.Context, monitorURL string, opts ...Option) (*Status, error) {
	o := waitOptions{client: http.DefaultClient, wait: time.Minute}
	for _, opt := range opts {
		opt(&o)
	}
	o.wait = max(o.wait, time.Second)
	for {
		st, pause, err := o.ask(ctx, monitorURL)
		if err != nil {
			return nil, err
		}
		if st != nil && st.Final() {
			return st, nil
		}
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil, fmt.Errorf("ticket: waiting for %s: %w", monitorURL, ctx.Err())
			case <-t.C:
			}
		}
	}
}

// ask sends one request; pause is how long to wait before the next (0: at once).
func (o *waitOptions) ask(ctx context.Context, monitorURL string) (st *Status, pause time.Duration, err error) {
	wait := o.wait
	if dl, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(dl))
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, monitorURL, nil)
	if err != nil {
		return nil, 0, fmt.Errorf("ticket: %w", err)
	}
	req.Header.Set("Accept", "application/json")
	if secs := int64(wait / time.Second); secs >= 1 {
		req.Header.Set("Prefer", "wait="+strconv.FormatInt(secs, 10))
	}
	resp, err := o.client.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, 0, fmt.Errorf("ticket: waiting for %s: %w", monitorURL, ctx.Err())
		}
		return nil, 0, fmt.Errorf("ticket: %w", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		return nil, 0, fmt.Errorf("ticket: reading the status: %w", err)
	}
	pause = retryAfter(resp.Header.Get("Retry-After"))
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotFound:
		return nil, 0, ErrNotFound
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return nil, pause, nil
	default:
		return nil, 0, fmt.Errorf("ticket: %s answered %s", monitorURL, resp.Status)
	}
	if len(body) > maxBody {
		return nil, 0, fmt.Errorf("ticket: the status from %s is larger than %d bytes", monitorURL, maxBody)
	}
	st = new(Status)
	if err := json.Unmarshal(body, st); err != nil {
		return nil, 0, fmt.Errorf("ticket: the status from %s: %w", monitorURL, err)
	}
	if st.Final() {
		return st, 0, nil
	}
	if applied(resp.Header.Values("Preference-Applied")) {
		return st, 0, nil // the front door waited: ask again at once
	}
	return st, pause, nil
}

// applied reports whether a Preference-Applied field names wait.
func applied(values []string) bool {
	for _, v := range values {
		for p := range strings.SplitSeq(v, ",") {
			name, _, _ := strings.Cut(p, "=")
			if strings.EqualFold(strings.TrimSpace(name), "wait") {
				return true
			}
		}
	}
	return false
}

// retryAfter reads a Retry-After in seconds (an HTTP-date too), within 1 s and
// maxPause: a missing or hostile value never makes Wait spin or sleep for a day.
func retryAfter(v string) time.Duration {
	d := time.Second
	v = strings.TrimSpace(v)
	if len(v) > 9 && strings.Trim(v, "0123456789") == "" {
		return maxPause
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		d = time.Duration(min(max(n, 1), int64(maxPause/time.Second))) * time.Second
	} else if t, err := http.ParseTime(v); err == nil {
		d = time.Until(t)
	}
	return min(max(d, time.Second), maxPause)
}
