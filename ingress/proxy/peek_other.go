//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package proxy

import "net"

// socket is a connection's socket where the pool has no direct access to it: a peek
// cannot look at the connection (the idle watch, Pool.watch, covers what arrived
// while it idled, and a request retried on a fresh connection covers a kept-alive one
// the upstream closed), and sendThenRead sends, then reads conn.
type socket struct{ conn net.Conn }

func newSocket(c net.Conn) *socket { return &socket{conn: c} }

func (s *socket) peek() idleState { return quiet }

func (s *socket) sendThenRead(p []byte, send func() error) (n int, sendErr, err error) {
	if err := send(); err != nil {
		return 0, err, nil
	}
	n, err = s.conn.Read(p)
	return n, nil, err
}
