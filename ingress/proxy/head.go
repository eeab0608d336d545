package proxy

import (
	"bytes"
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
	ph := new(parsedHead)
	st, h, err := readFields(c, ph.vals[:])
	if err != nil {
		return nil, false, err
	}
	code, minor := st.code, st.minor
	resp = &ph.resp
	*resp = http.Response{
		Status: st.status, StatusCode: code, Proto: st.proto, ProtoMajor: 1, ProtoMinor: minor,
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
		if len(cls) > 1 {
			// Only then: storing even an existing key into a map of 8 entries
			// grows it (Go 1.26's small maps), three allocations.
			h["Content-Length"] = cls[:1]
		}
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

// parsedHead is a response and the backing array of its header's values, allocated
// together: one allocation for both when the head has at most len(vals) fields.
type parsedHead struct {
	resp http.Response
	vals [8]string
}

// statusLine is a parsed status line of an HTTP/1.x response.
type statusLine struct {
	proto  string // "HTTP/1.1"
	status string // "200 OK"
	code   int
	minor  int
}

// parseStatusLine parses line, the first line of a response (its line end elided).
func parseStatusLine(line string) (statusLine, error) {
	proto, status, ok := strings.Cut(line, " ")
	major, minor, vok := http.ParseHTTPVersion(proto)
	if !ok || !vok || major != 1 {
		return statusLine{}, badResponse("status line %.64q", line)
	}
	codeText, _, _ := strings.Cut(status, " ")
	code, cerr := strconv.Atoi(codeText)
	if len(codeText) != 3 || cerr != nil || code < 100 || code > 599 {
		return statusLine{}, badResponse("status line %.64q", line)
	}
	return statusLine{proto: proto, status: status, code: code, minor: minor}, nil
}

// readFields reads a head's status line and header fields from c. When what c has
// buffered holds the whole head in the plain form scanHead accepts, the head is
// copied out of the buffer into one string that the status line, the values and the
// keys already canonical are cut from, vals backing the values, the header c's own
// map (splitHead, conn.emptyHeader); any other head goes through textproto, which
// reads it line by line. Both give the same result
// and the same errors for a head scanHead accepts (FuzzSplitHead).
func readFields(c *conn, vals []string) (statusLine, http.Header, error) {
	if c.br.Buffered() == 0 {
		if _, err := c.br.Peek(1); err != nil {
			return statusLine{}, nil, headErr(c, err)
		}
	}
	buf, _ := c.br.Peek(c.br.Buffered())
	if end, fields := scanHead(buf); end > 0 {
		head := string(buf[:end])
		_, _ = c.br.Discard(end)
		line, h := splitHead(head, fields, vals, c.emptyHeader())
		st, err := parseStatusLine(line)
		return st, h, err
	}
	line, err := c.tp.ReadLine()
	if err != nil {
		return statusLine{}, nil, headErr(c, err)
	}
	st, err := parseStatusLine(line)
	if err != nil {
		return statusLine{}, nil, err
	}
	hdr, err := c.tp.ReadMIMEHeader()
	if err != nil {
		return statusLine{}, nil, headErr(c, err)
	}
	return st, http.Header(hdr), nil
}

// scanHead looks in buf for a whole head in plain form and returns its length, blank
// line included, and its number of header fields; end is 0 when buf holds no such
// head. Plain: every line ends with CRLF, the status line has no control byte, and
// each field line is a non-empty token, a colon and a value of valid bytes (RFC 9110
// section 5.5), so no continuation line and no bare CR or LF. On a plain head
// textproto cannot fail, nor read past it.
func scanHead(buf []byte) (end, fields int) {
	i := bytes.IndexByte(buf, '\n')
	if i < 1 || buf[i-1] != '\r' {
		return 0, 0
	}
	for _, b := range buf[:i-1] {
		if b < ' ' || b == 0x7f {
			return 0, 0
		}
	}
	end = i + 1
	for {
		rest := buf[end:]
		j := bytes.IndexByte(rest, '\n')
		if j < 1 || rest[j-1] != '\r' {
			return 0, 0
		}
		line := rest[:j-1]
		end += j + 1
		if len(line) == 0 {
			return end, fields
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 1 {
			return 0, 0
		}
		for _, b := range line[:colon] {
			if !tokenByte(b) {
				return 0, 0
			}
		}
		for _, b := range line[colon+1:] {
			if b < ' ' && b != '\t' || b == 0x7f {
				return 0, 0
			}
		}
		fields++
	}
}

// tokenByte reports whether b may be in a token (RFC 9110 section 5.6.2).
func tokenByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' ||
		b < 0x80 && strings.IndexByte("!#$%&'*+-.^_`|~", b) >= 0
}

// splitHead splits head, a plain head of fields header fields (scanHead), into its
// status line and the empty header h, as textproto would: keys canonical (the common
// ones interned), values without the white space around them. Values are cut from
// head, and so are keys already canonical; vals backs the value slices when it is
// long enough.
func splitHead(head string, fields int, vals []string, h http.Header) (string, http.Header) {
	line, rest, _ := strings.Cut(head, "\r\n")
	if fields > len(vals) {
		vals = make([]string, fields)
	}
	for {
		var field string
		field, rest, _ = strings.Cut(rest, "\r\n")
		if field == "" {
			return line, h
		}
		k, v, _ := strings.Cut(field, ":")
		k, v = textproto.CanonicalMIMEHeaderKey(k), textproto.TrimString(v)
		if vv, ok := h[k]; ok {
			h[k] = append(vv, v)
			continue
		}
		vals[0] = v
		h[k], vals = vals[:1:1], vals[1:]
	}
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
