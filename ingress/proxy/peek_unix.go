//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package proxy

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// socket is direct access to a connection's TCP socket: a look that does not wait
// (peek), and a read that waits for the socket to be readable before it first tries
// (sendThenRead). The callbacks and what they pass are made once per connection, so that
// using them allocates nothing.
type socket struct {
	conn    net.Conn
	rc      syscall.RawConn // nil: no raw access, peek says quiet and sendThenRead reads conn
	peekFn  func(fd uintptr)
	readFn  func(fd uintptr) bool
	state   idleState
	buf     []byte
	send    func() error
	n       int
	err     error
	sendErr error
	waited  bool
	peekBuf [1]byte
}

func newSocket(c net.Conn) *socket {
	s := &socket{conn: c}
	if sc, ok := c.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			s.rc = rc
		}
	}
	s.peekFn, s.readFn = s.peekOnce, s.readOnce
	return s
}

// peek looks at the idle connection without waiting (Go's sockets are non-blocking)
// and reports what is there: nothing (quiet), an end of stream or an error (closed),
// or bytes nobody asked for (unsolicited). It does not look at the connection's
// deadlines.
func (s *socket) peek() idleState {
	if s.rc == nil {
		return quiet
	}
	if err := s.rc.Control(s.peekFn); err != nil {
		return closed
	}
	return s.state
}

func (s *socket) peekOnce(fd uintptr) {
	n, _, err := syscall.Recvfrom(int(fd), s.peekBuf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK):
		s.state = quiet
	case err == nil && n > 0:
		s.state = unsolicited
	default:
		s.state = closed
	}
}

// sendThenRead calls send, which writes the rest of a request, and then reads into p
// as conn.Read does, except that it waits for the socket to be readable before its
// first try rather than after a try that found nothing (EAGAIN): right after a
// request the answer is hardly ever there, and that try is a system call for nothing.
// send runs within the read, after the poller has been told to look for readable
// bytes, because Go's poller is edge-triggered and forgets, when a read begins, what
// it saw before: bytes that arrived between a send and the read's start would
// never end the wait. Waiting first is right only when the socket held nothing when
// the request began (get's peek said quiet, or a new connection). An error of send is
// returned as sendErr, with nothing read; the connection's deadlines hold as for
// conn.Read, the read deadline as it is once send has returned.
func (s *socket) sendThenRead(p []byte, send func() error) (n int, sendErr, err error) {
	if s.rc == nil || len(p) == 0 {
		if err := send(); err != nil {
			return 0, err, nil
		}
		n, err = s.conn.Read(p)
		return n, nil, err
	}
	s.buf, s.send, s.n, s.err, s.sendErr, s.waited = p, send, 0, nil, nil, false
	err = s.rc.Read(s.readFn)
	s.buf, s.send = nil, nil
	switch {
	case s.sendErr != nil:
		return 0, s.sendErr, nil
	case err != nil:
		return 0, nil, err
	case s.err != nil:
		return 0, nil, &net.OpError{Op: "read", Net: "tcp", Source: s.conn.LocalAddr(), Addr: s.conn.RemoteAddr(), Err: os.NewSyscallError("read", s.err)}
	case s.n == 0:
		return 0, nil, io.EOF
	}
	return s.n, nil, nil
}

func (s *socket) readOnce(fd uintptr) bool {
	if !s.waited {
		s.waited = true
		if s.sendErr = s.send(); s.sendErr != nil {
			return true
		}
		return false // wait for the answer before the first try
	}
	for {
		n, err := syscall.Read(int(fd), s.buf)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK):
			return false // woken for nothing, or for bytes another read took: wait again
		case err != nil:
			s.err = err
		default:
			s.n = n
		}
		return true
	}
}
