//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package ingress

import (
	"errors"
	"net"
	"syscall"
)

// connAlive reports whether the idle connection c is still open: whether a peek at
// it, which does not wait (Go's sockets are non-blocking), finds neither an end of
// stream nor an error nor stray bytes (an idle connection has nothing to read).
func connAlive(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	var b [1]byte
	err = raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		alive = errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EWOULDBLOCK)
		return true // never wait for data
	})
	return err == nil && alive
}
