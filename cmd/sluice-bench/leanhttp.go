package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"time"
)

// leanPoster sends one kind of POST over kept-alive HTTP/1.1 connections of its own,
// each used by one caller at a time: the request goes out in one write, the answer is
// read with net/http's parser on the caller's goroutine. Go's http.Transport hands
// every request between three goroutines (the caller's and the connection's writer
// and reader); on this machine those hand-offs cost about as much as the server's
// work, and a load generator should measure the server, not itself.
type leanPoster struct {
	addr  string
	head  []byte // request line and the fixed headers
	body  []byte
	conns chan *posterConn
}

type posterConn struct {
	conn net.Conn
	r    *bufio.Reader
	buf  []byte
}

// newLeanPoster prepares POSTs of body to rawURL (http only) with header. At most
// maxConns connections are kept for reuse.
func newLeanPoster(rawURL string, header http.Header, body []byte, maxConns int) (*leanPoster, error) {
	u, err := url.Parse(rawURL)
	if err != nil || u.Scheme != "http" {
		return nil, fmt.Errorf("lean client: %q is not an http URL", rawURL)
	}
	var head bytes.Buffer
	fmt.Fprintf(&head, "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n", u.RequestURI(), u.Host, len(body))
	if err := header.Write(&head); err != nil {
		return nil, err
	}
	return &leanPoster{addr: u.Host, head: head.Bytes(), body: body, conns: make(chan *posterConn, maxConns)}, nil
}

// post sends the request, with key as its Idempotency-Key header unless key is empty, and
// returns the answer's status code once its body is read.
func (p *leanPoster) post(ctx context.Context, key string) (int, error) {
	var c *posterConn
	select {
	case c = <-p.conns:
	default:
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", p.addr)
		if err != nil {
			return 0, err
		}
		c = &posterConn{conn: conn, r: bufio.NewReader(conn)}
	}
	status, reuse, err := c.roundTrip(ctx, p, key)
	if !reuse || err != nil {
		c.conn.Close()
		return status, err
	}
	select {
	case p.conns <- c:
	default:
		c.conn.Close()
	}
	return status, nil
}

func (c *posterConn) roundTrip(ctx context.Context, p *leanPoster, key string) (status int, reuse bool, err error) {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(time.Minute)
	}
	if err := c.conn.SetDeadline(deadline); err != nil {
		return 0, false, err
	}
	c.buf = append(c.buf[:0], p.head...)
	if key != "" {
		c.buf = append(c.buf, "Idempotency-Key: "...)
		c.buf = append(c.buf, key...)
		c.buf = append(c.buf, "\r\n"...)
	}
	c.buf = append(c.buf, "\r\n"...)
	c.buf = append(c.buf, p.body...)
	if _, err := c.conn.Write(c.buf); err != nil {
		return 0, false, err
	}
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, !resp.Close && err == nil, err
}

// close closes the kept connections.
func (p *leanPoster) close() {
	for {
		select {
		case c := <-p.conns:
			c.conn.Close()
		default:
			return
		}
	}
}
