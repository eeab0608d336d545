//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package proxy

import (
	"errors"
	"net"
	"syscall"
)

// peekIdle looks at the idle connection c without waiting (Go's sockets are
// non-blocking) and reports what is there: nothing (quiet), an end of stream or an
// error (closed), or bytes nobody asked for (unsolicited).
func peekIdle(c net.Conn) idleState {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return quiet
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return closed
	}
	state := closed
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		switch {
		case errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK):
			state = quiet
		case err == nil && n > 0:
			state = unsolicited
		}
		return true // never wait for data
	})
	if err != nil {
		return closed
	}
	return state
}
