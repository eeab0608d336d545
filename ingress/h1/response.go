package h1

import (
	"errors"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// bodyBuffer is the most of a response body held back before its head is written:
// a response that ends within it goes out with a Content-Length, in one write with its
// head.
const bodyBuffer = 4096

// outBuffer is the most written bytes held before a write to the connection.
const outBuffer = 8192

// response is the http.ResponseWriter of a request on the fast path. Its methods
// are for the handler's goroutine (as net/http's are).
type response struct {
	c      *conn
	header http.Header

	status      int  // the final status, 0 until WriteHeader
	headWritten bool // the head is in c.out or on the wire
	chunked     bool
	// contentLength is the handler's Content-Length, -1 when it set none.
	contentLength int64
	written       int64 // body bytes written by the handler
	closeAfter    bool
	err           error // the connection's write error
	// reqBody is the request's body, nil without one.
	reqBody  *body
	trailers []string
}

var _ http.Flusher = (*response)(nil)

func (w *response) Header() http.Header { return w.header }

// WriteHeader sends an informational (1xx but 101) head at once, as net/http does;
// the final status is written with the first body bytes, a flush or the handler's
// end.
func (w *response) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if w.status != 0 {
		return // net/http logs a superfluous call; it changes nothing
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		c := w.c
		c.out = appendStatus(c.out, code)
		c.out = appendFields(c.out, w.header, nil)
		c.out = append(c.out, "\r\n"...)
		w.err = c.flushOut(w.err)
		return
	}
	w.status = code
	if v := w.header.Get("Content-Length"); v != "" {
		if n, ok := parseLength(v); ok {
			w.contentLength = n
		} else {
			w.header.Del("Content-Length")
		}
	}
}

func bodyAllowed(status int) bool {
	return status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
}

func (w *response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if !bodyAllowed(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	c := w.c
	if !w.headWritten {
		if len(c.body)+len(p) <= bodyBuffer {
			c.body = append(c.body, p...)
			w.written += int64(len(p))
			return len(p), nil
		}
		w.writeHead(false, p)
	}
	w.written += int64(len(p))
	if w.chunked {
		c.out = strconv.AppendInt(c.out, int64(len(p)), 16)
		c.out = append(c.out, "\r\n"...)
	}
	if len(c.out)+len(p) > outBuffer {
		if w.err = c.flushOut(nil); w.err == nil {
			_, w.err = c.nc.Write(p)
		}
	} else {
		c.out = append(c.out, p...)
	}
	if w.chunked {
		c.out = append(c.out, "\r\n"...)
	}
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// writeHead puts the head, and the body held back, in c.out. end: the handler has
// returned, so a body that was held back whole gets its Content-Length. next is
// the write that does not fit beside the body held back: the Content-Type is
// sniffed from it when nothing is held back (net/http sniffs the first write).
func (w *response) writeHead(end bool, next []byte) {
	c := w.c
	w.headWritten = true
	h := w.header
	if w.status == 0 {
		w.status = http.StatusOK
	}
	allowed := bodyAllowed(w.status)
	if v := h["Connection"]; len(v) > 0 && hasClose(strings.Join(v, ",")) {
		w.closeAfter = true
	}
	delete(h, "Transfer-Encoding")
	if _, ok := h["Trailer"]; ok && allowed {
		w.trailers = declaredTrailers(h["Trailer"])
	}
	var extra [4]string // fields added: pairs of name and value
	add := extra[:0]
	switch {
	case !allowed:
	case w.trailers != nil:
		delete(h, "Content-Length")
		w.chunked = true
	case w.contentLength >= 0:
	case end:
		w.contentLength = int64(len(c.body))
		add = append(add, "Content-Length", strconv.Itoa(len(c.body)))
	default:
		w.chunked = true
	}
	if w.chunked {
		add = append(add, "Transfer-Encoding", "chunked")
	}
	if _, ok := h["Content-Type"]; !ok && allowed {
		if sniff := c.body; len(sniff) > 0 {
			add = append(add, "Content-Type", http.DetectContentType(sniff))
		} else if len(next) > 0 {
			add = append(add, "Content-Type", http.DetectContentType(next))
		}
	}
	if _, ok := h["Date"]; !ok {
		add = append(add, "Date", c.date.get())
	}
	if w.closeAfter && !hasClose(strings.Join(h["Connection"], ",")) {
		add = append(add, "Connection", "close")
	}
	c.out = appendStatus(c.out, w.status)
	c.out = appendFields(c.out, h, add)
	c.out = append(c.out, "\r\n"...)
	if len(c.body) > 0 {
		if w.chunked {
			c.out = strconv.AppendInt(c.out, int64(len(c.body)), 16)
			c.out = append(c.out, "\r\n"...)
			c.out = append(c.out, c.body...)
			c.out = append(c.out, "\r\n"...)
		} else {
			c.out = append(c.out, c.body...)
		}
		c.body = c.body[:0]
	}
}

// declaredTrailers returns the names a Trailer header declares, canonical.
func declaredTrailers(vv []string) []string {
	out := []string{}
	for _, v := range vv {
		for tok := range strings.SplitSeq(v, ",") {
			if tok = strings.TrimSpace(tok); tok != "" {
				out = append(out, http.CanonicalHeaderKey(tok))
			}
		}
	}
	return out
}

// Flush writes the head and what is written of the body to the connection.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush with the connection's error (http.ResponseController calls it).
func (w *response) FlushError() error {
	if w.err != nil {
		return w.err
	}
	if !w.headWritten {
		w.writeHead(false, nil)
	}
	w.err = w.c.flushOut(nil)
	return w.err
}

// SetReadDeadline sets the connection's read deadline (http.ResponseController).
func (w *response) SetReadDeadline(t time.Time) error {
	return w.c.setDeadline(&w.c.rdl, t, false)
}

// SetWriteDeadline sets the connection's write deadline (http.ResponseController).
func (w *response) SetWriteDeadline(t time.Time) error {
	return w.c.setDeadline(&w.c.wdl, t, false)
}

// EnableFullDuplex is a no-op: on the fast path the request's body can be read while
// the response is written (http.ResponseController).
func (w *response) EnableFullDuplex() error { return nil }

// finish ends the response after the handler: the head if not yet written, the
// chunked body's end and its trailers, one write.
func (w *response) finish() error {
	if w.err != nil {
		return w.err
	}
	if !w.headWritten {
		w.drainBody()
		w.writeHead(true, nil)
	}
	c := w.c
	if w.contentLength >= 0 && w.written < w.contentLength && bodyAllowed(w.status) {
		// The handler wrote less than it declared: the client cannot tell where
		// this response ends; net/http closes the connection too.
		w.closeAfter = true
	}
	if w.chunked {
		c.out = append(c.out, "0\r\n"...)
		for _, k := range w.trailers {
			for _, v := range w.header[k] {
				c.out = appendField(c.out, k, v)
			}
		}
		for k, vv := range w.header {
			if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vv {
					c.out = appendField(c.out, http.CanonicalHeaderKey(name), v)
				}
			}
		}
		c.out = append(c.out, "\r\n"...)
	}
	w.err = c.flushOut(nil)
	return w.err
}

// drainBody reads and drops what the handler left of the request's body before the
// head is written, as net/http's server does: a connection that cannot carry another
// request after it (more than maxDiscard left, or the body cannot be read to its end)
// says Connection: close in the head, so that the client sends nothing more on it.
func (w *response) drainBody() {
	b := w.reqBody
	if b == nil || b.left == 0 || w.closeAfter || hasClose(strings.Join(w.header["Connection"], ",")) {
		return // closing anyway: nothing to read for
	}
	switch {
	case b.left >= maxDiscard:
		w.closeAfter = true
	case errors.Is(b.err, io.ErrUnexpectedEOF):
		// The client ended the connection within the body: net/http takes that
		// for the body's end and says nothing; the connection ends after.
	case !b.discard():
		w.closeAfter = true
	}
}

// flushOut writes c.out to the connection unless err is already set.
func (c *conn) flushOut(err error) error {
	if err != nil {
		c.out = c.out[:0]
		return err
	}
	if len(c.out) == 0 {
		return nil
	}
	_, err = c.nc.Write(c.out)
	c.out = c.out[:0]
	return err
}

func appendStatus(b []byte, code int) []byte {
	b = append(b, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	if text := http.StatusText(code); text != "" {
		b = append(b, text...)
	} else {
		b = append(b, "status code "...)
		b = strconv.AppendInt(b, int64(code), 10)
	}
	return append(b, "\r\n"...)
}

// appendFields appends h's fields, sorted by name as net/http writes them, and the
// pairs of extra, to b; a name that is not a token is left out, and a line break in
// a value becomes a space (net/http's rules: no field can end the head early).
func appendFields(b []byte, h http.Header, extra []string) []byte {
	var arr [16]string
	keys := arr[:0]
	for k := range h {
		if k == "Trailer" || strings.HasPrefix(k, http.TrailerPrefix) {
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k] {
			b = appendField(b, k, v)
		}
	}
	if vv, ok := h["Trailer"]; ok {
		for _, v := range vv {
			b = appendField(b, "Trailer", v)
		}
	}
	for i := 0; i+1 < len(extra); i += 2 {
		b = appendField(b, extra[i], extra[i+1])
	}
	return b
}

func appendField(b []byte, k, v string) []byte {
	if k == "" {
		return b
	}
	for i := 0; i < len(k); i++ {
		if !isToken(k[i]) {
			return b
		}
	}
	b = append(b, k...)
	b = append(b, ": "...)
	// strings.Trim(v, " \t\r\n") and strings.ContainsAny(v, "\r\n") byte by byte:
	// they build a set of their bytes on each call, and this is every field of every
	// response.
	for len(v) > 0 && isFieldSpace(v[0]) {
		v = v[1:]
	}
	for len(v) > 0 && isFieldSpace(v[len(v)-1]) {
		v = v[:len(v)-1]
	}
	if strings.IndexByte(v, '\r') >= 0 || strings.IndexByte(v, '\n') >= 0 {
		for i := 0; i < len(v); i++ {
			c := v[i]
			if c == '\r' || c == '\n' {
				c = ' '
			}
			b = append(b, c)
		}
	} else {
		b = append(b, v...)
	}
	return append(b, "\r\n"...)
}

// isFieldSpace reports whether c is trimmed around a field's value: a space, a tab or
// a line break.
func isFieldSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// dateCache is the Date header's value, formatted once a second.
type dateCache struct {
	sec  int64
	text string
}

func (d *dateCache) get() string {
	now := time.Now()
	if s := now.Unix(); s != d.sec || d.text == "" {
		d.sec, d.text = s, now.UTC().Format(http.TimeFormat)
	}
	return d.text
}

// body is a request body of a known length on the fast path.
type body struct {
	c    *conn
	mu   sync.Mutex
	left int64
	// closed: the handler has returned (or closed the body); reads fail.
	closed bool
	err    error
}

// errBodyReadAfterClose is net/http's error for a read of a body after the
// handler returned or closed it.
var errBodyReadAfterClose = http.ErrBodyReadAfterClose

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return 0, errBodyReadAfterClose
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.left == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	c := b.c
	var n int
	if c.r < c.w {
		n = copy(p, c.buf[c.r:c.w])
		c.r += n
	} else {
		var err error
		n, err = c.nc.Read(p)
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			if int64(n) < b.left {
				b.err = err
			}
		}
	}
	b.left -= int64(n)
	if b.left == 0 {
		c.bodyRead()
		return n, io.EOF
	}
	if n == 0 && b.err != nil {
		return 0, b.err
	}
	return n, nil
}

// Close marks the body closed, as net/http's: later reads fail. What is left of it
// is read and dropped after the handler.
func (b *body) Close() error {
	b.close()
	return nil
}

func (b *body) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
}

// discard reads and drops what is left of the body after the handler, up to
// maxDiscard; false when more is left or the read failed (the connection then
// closes).
func (b *body) discard() bool {
	if b.err != nil || b.left >= maxDiscard {
		return false
	}
	c := b.c
	for b.left > 0 {
		if c.r < c.w {
			n := int(min(int64(c.w-c.r), b.left))
			c.r += n
			b.left -= int64(n)
			continue
		}
		// Nothing of the next request is buffered (c.r == c.w): the buffer takes
		// the body's bytes from its start, and nothing else.
		c.r, c.w = 0, 0
		n, err := c.nc.Read(c.buf[:min(int64(len(c.buf)), b.left)])
		b.left -= int64(n)
		if err != nil && b.left > 0 {
			b.err = err
			return false
		}
	}
	// What follows the body in the buffer (a pipelined request) stays for readHead.
	return true
}
