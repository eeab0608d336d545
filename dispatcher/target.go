package dispatcher

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/dispatcher/pace"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/queueconfig"
	"github.com/sluicehq/sluice/queue/telemetry"
)

type outcomeKind int

const (
	outcomeDone      outcomeKind = iota // 2xx / publish acknowledged
	outcomeThrottled                    // 429 / 503: pause the queue, retry, no attempt counted
	outcomeRetry                        // other 5xx, timeout, network error: failed attempt
	outcomeFailed                       // other status: final failure
)

type outcome struct {
	kind       outcomeKind
	status     int
	header     http.Header
	body       []byte
	truncated  bool
	retryAfter time.Duration
	err        error
	// detail is the whole error of a request that got no answer, for the log and the
	// trace: it names the downstream's URL and address, which err must not, as err is
	// kept in the ticket's record and shown to whoever holds the ticket.
	detail  error
	down    downKind // a failed attempt that found the downstream down (see circuit)
	subject string
	seq     uint64
}

func (o outcome) describe() string {
	switch {
	case o.err != nil:
		return o.err.Error()
	case o.status != 0:
		return fmt.Sprintf("downstream answered %d %s", o.status, http.StatusText(o.status))
	}
	return ""
}

// detailed is describe with the whole error when there is one: for operators only.
func (o outcome) detailed() string {
	if o.detail != nil {
		return o.detail.Error()
	}
	return o.describe()
}

func (o outcome) result() *queue.Result {
	return &queue.Result{StatusCode: o.status, Header: o.header, Body: o.body, Truncated: o.truncated, Subject: o.subject, Sequence: o.seq}
}

// target delivers a message to a queue's downstream.
type target interface {
	// check tells whether m can be delivered at all (an error: never).
	check(m *queue.Message) error
	deliver(ctx context.Context, m *queue.Message) outcome
}

func (d *Dispatcher) newTarget(cfg queueconfig.Config) (target, error) {
	if subj := cfg.NATSSubject(); subj != "" {
		return &natsTarget{subject: subj, atMostOnce: cfg.Delivery == queueconfig.AtMostOnce, pub: d.store}, nil
	}
	base, err := url.Parse(cfg.Downstream)
	if err != nil {
		return nil, fmt.Errorf("downstream of %q: %w", cfg.Name, err)
	}
	return &httpTarget{base: base, client: d.client, defaultPause: d.opts.defaultPause}, nil
}

func defaultHTTPClient() *http.Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 512
	tr.MaxIdleConnsPerHost = 256
	tr.IdleConnTimeout = 90 * time.Second
	return &http.Client{
		Transport: tr,
		// A redirect would change the method or drop the body; the 3xx is the answer.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// httpTarget delivers a parked request to its delivery URL (see deliveryURL) with its
// parked method, headers and body, plus Sluice-Ticket and an Idempotency-Key (the
// client's own, else the ticket).
type httpTarget struct {
	base         *url.URL
	client       *http.Client
	defaultPause time.Duration
}

// deliveryURL returns the delivery URL of m: the base URL's scheme and host, its path
// (without a trailing slash) followed by the parked escaped path, and the parked query.
// It is assembled from url.URL fields, never parsed from a joined string, so nothing in
// the parked path or query can change the host; queue.CheckTarget says which paths and
// queries are refused.
func deliveryURL(base *url.URL, m *queue.Message) (*url.URL, error) {
	if m.Method == "" {
		// Park refuses an order without one; net/http would send it as a GET.
		return nil, errors.New("no method")
	}
	if err := queue.CheckTarget(m.Path, m.RawQuery); err != nil {
		return nil, err
	}
	path, err := url.PathUnescape(m.Path)
	if err != nil {
		return nil, fmt.Errorf("path %q: %w", m.Path, err)
	}
	return &url.URL{
		Scheme: base.Scheme,
		Host:   base.Host,
		Path:   strings.TrimSuffix(base.Path, "/") + path,
		// Kept when it is a valid encoding of Path (EscapedPath checks), so that
		// "/a%2Fb" reaches the downstream as sent.
		RawPath:  strings.TrimSuffix(base.EscapedPath(), "/") + m.Path,
		RawQuery: m.RawQuery,
	}, nil
}

func (t *httpTarget) check(m *queue.Message) error {
	_, err := deliveryURL(t.base, m)
	return err
}

func (t *httpTarget) deliver(ctx context.Context, m *queue.Message) outcome {
	u, err := deliveryURL(t.base, m)
	if err != nil {
		return outcome{kind: outcomeFailed, err: fmt.Errorf("bad delivery URL: %w", err)}
	}
	req, err := http.NewRequestWithContext(ctx, m.Method, "/", bytes.NewReader(m.Body))
	if err != nil {
		return outcome{kind: outcomeFailed, err: fmt.Errorf("bad request: %w", err)}
	}
	req.URL, req.Host = u, u.Host
	for k, vs := range m.Header {
		req.Header[k] = append([]string(nil), vs...)
	}
	// The downstream sees the client's own key, exactly as sent (as a proxied request
	// of the same order would), or the ticket when the client sent none.
	req.Header.Set(queue.HeaderTicket, m.Ticket)
	if len(req.Header.Values("Idempotency-Key")) == 0 {
		req.Header.Set("Idempotency-Key", m.Ticket)
	}
	// A request that fails unanswered is this attempt's failure, retried after the
	// backoff at a pacing slot of its own, never sent again by the client on its own.
	req = pace.SendOnce(req)
	// The delivery's trace context, when traced, replaces the client's traceparent.
	telemetry.Inject(ctx, req.Header)
	resp, err := t.client.Do(req)
	if err != nil {
		return outcome{kind: outcomeRetry, down: transportFailure(err), err: errors.New(transportCause(err)), detail: err}
	}
	body, truncated, readErr := readCapped(resp.Body, queue.MaxResultBody)
	_ = resp.Body.Close()
	out := outcome{status: resp.StatusCode, header: resp.Header, body: body, truncated: truncated}
	switch code := resp.StatusCode; {
	case code >= 200 && code < 300:
		out.kind = outcomeDone
		if readErr != nil { // the answer counts; the body is incomplete
			out.truncated = true
		}
	case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
		out.kind = outcomeThrottled
		if d, ok := pace.RetryAfter(resp.Header, time.Now()); ok {
			out.retryAfter = d
		}
	case code >= 500:
		out.kind = outcomeRetry
	default:
		out.kind = outcomeFailed
	}
	return out
}

// readCapped reads up to limit bytes, then drains (a bounded amount) so the connection
// can be reused.
func readCapped(r io.Reader, limit int) ([]byte, bool, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	truncated := len(b) > limit
	if truncated {
		b = b[:limit]
		_, _ = io.CopyN(io.Discard, r, 1<<20)
	}
	return b, truncated, err
}

// forwarder publishes an order to a NATS subject (queue.Store.Forward). Errors that
// wrap queue.ErrUnavailable say the subject cannot be reached; those that wrap
// context.DeadlineExceeded that no answer came in time.
type forwarder interface {
	Forward(ctx context.Context, subject string, m *queue.Message, opts ...queue.ForwardOption) (seq uint64, err error)
}

// natsTarget publishes the body with the metadata headers to a subject: through
// JetStream, done once a stream acknowledged it (at least once; queue.Store.Declare
// made sure a stream captures the subject), or for a queue with delivery at_most_once
// as a core publish followed by a flush (done once the server has it, subscribers or
// not). The consumer may reply later (package queue/subscriber): writeResults writes the
// reply into the done ticket's result.
type natsTarget struct {
	subject    string
	atMostOnce bool
	pub        forwarder
}

// check refuses what an HTTP delivery would: consumers of the subject may well build
// URLs from the path and query headers.
func (t *natsTarget) check(m *queue.Message) error {
	_, err := deliveryURL(&url.URL{}, m)
	return err
}

func (t *natsTarget) deliver(ctx context.Context, m *queue.Message) outcome {
	var opts []queue.ForwardOption
	if t.atMostOnce {
		opts = append(opts, queue.ForwardAtMostOnce())
	}
	seq, err := t.pub.Forward(ctx, t.subject, m, opts...)
	if err != nil {
		// No stream (deleted since the declaration) or no answer: the downstream is
		// down, which opens the circuit rather than costing attempts.
		return outcome{kind: outcomeRetry, down: publishFailure(err), err: err}
	}
	return outcome{kind: outcomeDone, subject: t.subject, seq: seq}
}

// transportCause says why a request got no answer without the URL and the address that
// err names (see outcome.detail): the kind of failure, and the system's word for it.
func transportCause(err error) string {
	var (
		dns    *net.DNSError
		errno  syscall.Errno
		verify *tls.CertificateVerificationError
	)
	switch {
	case timedOut(err):
		return "delivery timed out: no answer from the downstream within the delivery timeout"
	case errors.As(err, &dns):
		return "delivery failed: the downstream's host name did not resolve"
	case errors.As(err, &verify):
		return "delivery failed: the downstream's TLS certificate was not accepted"
	case errors.As(err, &errno):
		return "delivery failed: " + errno.Error() // "connection refused", "connection reset by peer"
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "delivery failed: the downstream closed the connection without an answer"
	}
	return "delivery failed: no answer could be read from the downstream"
}
