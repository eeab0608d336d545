package pace

import (
	"bytes"
	"errors"
	"io"
	"net/http"
	"strings"
	"syscall"
)

// SendOnce returns req as a request that net/http's Transport sends once per
// RoundTrip, never again on its own: a shallow copy of req when anything has to change
// (req itself is not modified).
//
// Why. The Transport re-sends, on another connection and within the same RoundTrip, a
// request that failed on a reused connection without an answer (the downstream closed
// it) when it takes the request for replayable (Request.isReplayable in net/http): a
// body it can rewind (GetBody) or none, and an idempotent method (GET, HEAD, OPTIONS,
// TRACE) or an Idempotency-Key / X-Idempotency-Key header. That second request leaves
// at no pacing slot: a downstream that drops connections would receive more than the
// bound of the pace. With SendOnce the failure is returned instead, and whoever paces
// retries it at a slot of its own.
//
// What the downstream receives does not change:
//   - a body: the same body without GetBody (Content-Length as before);
//   - no body and an idempotent method: an empty body without GetBody, which the
//     Transport reads before sending and then sends no body, as for none (TRACE, which
//     it does not read first, goes with an empty chunked body);
//   - no body and any other method: no body (Content-Length: 0 for POST, PUT and
//     PATCH), the idempotency key headers under their lower-case names, which the
//     Transport's check does not find and every server reads alike (field names are
//     case-insensitive; HTTP/2 sends every name in lower case). A RoundTripper after
//     SendOnce finds them in Request.Header by those names, not by Get.
//
// HTTP/2 still retries a request its server refused unprocessed (REFUSED_STREAM, or a
// GOAWAY before its stream): it never reached the server's handler.
func SendOnce(req *http.Request) *http.Request {
	empty := req.Body == nil || req.Body == http.NoBody
	switch {
	case !empty:
		if req.GetBody == nil {
			return req
		}
		r := *req
		r.GetBody = nil
		return &r
	case idempotentMethod(req.Method):
		r := *req
		r.Body, r.GetBody, r.ContentLength = io.NopCloser(bytes.NewReader(nil)), nil, 0
		return &r
	}
	var r *http.Request
	for _, k := range []string{"Idempotency-Key", "X-Idempotency-Key"} {
		vs, ok := req.Header[k]
		if !ok {
			continue
		}
		if r == nil {
			c := *req
			c.Header = req.Header.Clone()
			r = &c
		}
		delete(r.Header, k)
		r.Header[strings.ToLower(k)] = vs
	}
	if r == nil {
		return req
	}
	return r
}

// idempotentMethod reports whether net/http's Transport takes method for idempotent
// whatever the request's headers.
func idempotentMethod(method string) bool {
	switch method {
	case "", http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// idempotentRequest reports whether net/http's Transport would take req for
// idempotent: its method, or an idempotency key header.
func idempotentRequest(req *http.Request) bool {
	return idempotentMethod(req.Method) || req.Header["Idempotency-Key"] != nil || req.Header["X-Idempotency-Key"] != nil
}

// droppedUnanswered reports whether err of a RoundTrip says that the connection ended
// before an answer began: the server closed it (EOF, "server closed idle connection")
// or reset it.
func droppedUnanswered(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		strings.Contains(err.Error(), "server closed idle connection") // net/http's errServerClosedIdle
}
