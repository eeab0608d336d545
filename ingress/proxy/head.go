package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
)

// ErrHeadTooLarge is a response head (status line and header fields, the informational
// responses before it included) or a chunked body's trailer section larger than the
// pool's limit (WithMaxHeaderBytes).
var ErrHeadTooLarge = errors.New("proxy: the upstream's response head is larger than the limit")

// ErrBadResponse is a response that is not valid HTTP/1.1 or whose length cannot be
// told (RFC 9112 section 6.3): wrapped with what is wrong.
var ErrBadResponse = errors.New("proxy: malformed response")

func badResponse(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrBadResponse}, args...)...)
}

// budget is the reader under a connection's bufio.Reader: while n >= 0 it lets at
// most n more bytes through, then fails with ErrHeadTooLarge, so that what a head
// takes in memory is bounded however long the upstream makes it; n < 0 lets
// everything through (bodies).
type budget struct {
	r        io.Reader
	n        int64
	exceeded bool
}

func (b *budget) Read(p []byte) (int, error) {
	if b.n < 0 {
		return b.r.Read(p)
	}
	if b.n == 0 {
		b.exceeded = true
		return 0, ErrHeadTooLarge
	}
	if int64(len(p)) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= int64(n)
	return n, err
}

// framing is how a response's body ends (RFC 9112 section 6.3).
type framing uint8

const (
	noBody   framing = iota // HEAD, 1xx, 204, 304
	length                  // Content-Length bytes
	chunked                 // Transfer-Encoding: chunked, then a trailer section
	untilEOF                // neither: the body ends with the connection
)

// readHead reads one response head from c for a request of method, and sets up c.body
// to read its body. Besides the errors of a malformed head it fails on what makes the
// body's end ambiguous: Transfer-Encoding other than chunked alone, Transfer-Encoding
// with Content-Length (RFC 9112 section 6.3 says to handle it as an error),
// Transfer-Encoding in an HTTP/1.0 response, Content-Length values that differ or are
// not numbers. keep reports whether the connection may carry another request once
// the body has been read to its end: not after HTTP/1.0 (keep-alive or not), nor with
// Connection: close, nor when the body ends with the connection, nor when a response
// without a body announces one (a HEAD answered with a Content-Length: whether the
// upstream sends that body anyway cannot be told).
func readHead(c *conn, method string) (resp *http.Response, keep bool, err error) {
	line, err := c.tp.ReadLine()
	if err != nil {
		return nil, false, headErr(c, err)
	}
	proto, status, ok := strings.Cut(line, " ")
	major, minor, vok := http.ParseHTTPVersion(proto)
	if !ok || !vok || major != 1 {
		return nil, false, badResponse("status line %.64q", line)
	}
	codeText, _, _ := strings.Cut(status, " ")
	code, cerr := strconv.Atoi(codeText)
	if len(codeText) != 3 || cerr != nil || code < 100 || code > 599 {
		return nil, false, badResponse("status line %.64q", line)
	}
	hdr, err := c.tp.ReadMIMEHeader()
	if err != nil {
		return nil, false, headErr(c, err)
	}
	h := http.Header(hdr)
	resp = &http.Response{
		Status: status, StatusCode: code, Proto: proto, ProtoMajor: major, ProtoMinor: minor,
		Header: h, ContentLength: -1, Body: http.NoBody,
	}
	te, hasTE := h["Transfer-Encoding"]
	cls, hasCL := h["Content-Length"]
	keep = minor >= 1 && !HasToken(h, "Connection", "close")
	var f framing
	switch {
	case code < 200:
		// An informational response ends with its head (RFC 9110 section 15.2):
		// a length it announces is ignored, as net/http does; bytes the upstream
		// sent after it are read as the next head of the same request.
		return resp, keep, nil
	case method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified:
		f = noBody
		if hasTE || hasCL && !(len(cls) == 1 && strings.TrimSpace(cls[0]) == "0") {
			// The length is that of a body this response does not carry (HEAD, 304)
			// or that it must not (204): an upstream that sends it anyway would have
			// it read as the next response, which cannot be checked.
			keep = false
		}
		if hasCL && method == http.MethodHead {
			if n, ok := contentLength(cls); ok {
				resp.ContentLength = n
			}
		}
	case hasTE:
		delete(h, "Transfer-Encoding")
		switch {
		case hasCL:
			return nil, false, badResponse("both Transfer-Encoding and Content-Length")
		case minor == 0:
			return nil, false, badResponse("Transfer-Encoding in an HTTP/1.0 response")
		case len(te) != 1 || !strings.EqualFold(strings.TrimSpace(te[0]), "chunked"):
			return nil, false, badResponse("Transfer-Encoding %.64q", strings.Join(te, ", "))
		}
		f = chunked
		resp.TransferEncoding = []string{"chunked"}
	case hasCL:
		n, ok := contentLength(cls)
		if !ok {
			return nil, false, badResponse("Content-Length %.64q", strings.Join(cls, ", "))
		}
		f, resp.ContentLength = length, n
		h["Content-Length"] = cls[:1]
	default:
		f, keep = untilEOF, false
	}
	if f == chunked {
		for _, v := range h["Trailer"] {
			for k := range strings.SplitSeq(v, ",") {
				if k = textproto.TrimString(k); k != "" {
					if resp.Trailer == nil {
						resp.Trailer = http.Header{}
					}
					resp.Trailer[textproto.CanonicalMIMEHeaderKey(k)] = nil
				}
			}
		}
		delete(h, "Trailer")
	}
	resp.Close = !keep
	c.body = body{c: c, framing: f, left: resp.ContentLength, resp: resp}
	if f != noBody && !(f == length && resp.ContentLength == 0) {
		resp.Body = &c.body
	}
	return resp, keep, nil
}

// headErr is ErrHeadTooLarge when the budget ran out under err.
func headErr(c *conn, err error) error {
	if c.lr.exceeded {
		return ErrHeadTooLarge
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || isConnReset(err) || isTimeout(err) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrBadResponse, err)
}

// contentLength parses Content-Length values, which must all be the same
// non-negative decimal number.
func contentLength(values []string) (int64, bool) {
	var n int64 = -1
	for _, v := range values {
		v = textproto.TrimString(v)
		if v == "" || strings.TrimLeft(v, "0123456789") != "" {
			return 0, false
		}
		m, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n >= 0 && m != n {
			return 0, false
		}
		n = m
	}
	return n, n >= 0
}

// body reads a response body to the end its framing gives: io.EOF exactly there,
// io.ErrUnexpectedEOF (or the connection's error) when the connection ends sooner,
// ErrBadResponse for a malformed chunk, ErrHeadTooLarge for a trailer section over
// the limit. One per connection, reset by readHead.
type body struct {
	c       *conn
	framing framing
	left    int64          // bytes of a length-framed body still to read
	chunks  io.Reader      // the chunked reader, once the first Read made it
	resp    *http.Response // its Trailer is filled once the trailer section is read
	err     error          // sticky, io.EOF at the end
}

func (b *body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	var n int
	switch b.framing {
	case noBody:
		b.err = io.EOF
	case length:
		if b.left == 0 {
			b.err = io.EOF
			break
		}
		if int64(len(p)) > b.left {
			p = p[:b.left]
		}
		n, b.err = b.c.br.Read(p)
		b.left -= int64(n)
		switch {
		case b.left == 0:
			b.err = nil // the next Read says io.EOF
		case errors.Is(b.err, io.EOF):
			b.err = io.ErrUnexpectedEOF
		}
	case untilEOF:
		n, b.err = b.c.br.Read(p)
	case chunked:
		if b.chunks == nil {
			b.chunks = httputil.NewChunkedReader(b.c.br)
		}
		n, b.err = b.chunks.Read(p)
		switch {
		case errors.Is(b.err, io.EOF):
			b.err = b.readTrailer()
			if b.err == nil {
				b.err = io.EOF
			}
		case b.err != nil && !errors.Is(b.err, io.ErrUnexpectedEOF) && !isConnReset(b.err) && !isTimeout(b.err):
			b.err = fmt.Errorf("%w: %w", ErrBadResponse, b.err)
		}
	}
	return n, b.err
}

// readTrailer reads the trailer section after the last chunk, as bounded as a head.
func (b *body) readTrailer() error {
	c := b.c
	c.lr.n = max(0, c.pool.maxHeader-int64(c.br.Buffered()))
	defer func() { c.lr.n = -1 }()
	hdr, err := c.tp.ReadMIMEHeader()
	if err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return headErr(c, err)
	}
	for k, vv := range hdr {
		if b.resp.Trailer == nil {
			b.resp.Trailer = http.Header{}
		}
		b.resp.Trailer[k] = append(b.resp.Trailer[k], vv...)
	}
	return nil
}

func (b *body) Close() error { return nil }
